"""Run under `horovodrun -np 2`: horovod.tensorflow's collectives eagerly and in tf.function, their
gradients, the tape, the TF1 optimizer, broadcasts, op=hvd.Adasum, AutoGraph leaving the binding
alone, and both bindings on one runtime.  Every rank prints `RESULT <json>` lines that
test_tensorflow_binding.py checks."""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import horovod.torch as hvd_torch  # noqa: E402

# AutoGraph must leave the binding's code alone (test_autograph_does_not_rewrite_the_binding), asked
# before anything has run, as a user's first tf.function would
from tensorflow.python.autograph.impl.conversion import is_allowlisted  # noqa: E402

import horovod.tensorflow.keras as hvd_keras  # noqa: E402
from horovod_compat.tensorflow import mpi_ops  # noqa: E402


def user_function(x):
    return x


autograph_allowlisted = {
    "hvd.allreduce": is_allowlisted(hvd.allreduce),
    "hvd.grouped_allreduce": is_allowlisted(hvd.grouped_allreduce),
    "mpi_ops._reduce_np": is_allowlisted(mpi_ops._reduce_np),
    "hvd.DistributedGradientTape": is_allowlisted(hvd.DistributedGradientTape),
    "DistributedGradientTape(...).gradient":
        is_allowlisted(type(hvd.DistributedGradientTape(tf.GradientTape())).gradient),
    "hvd_keras.DistributedOptimizer": is_allowlisted(hvd_keras.DistributedOptimizer),
    "user_function": is_allowlisted(user_function),
}

hvd.init(process_sets="dynamic")
r, n = hvd.rank(), hvd.size()
out = {}


def put(key, value):
    out[key] = value.numpy().tolist() if hasattr(value, "numpy") else value


x = tf.constant([1.0, 2.0]) * (r + 1)
put("allreduce_avg", hvd.allreduce(x))
put("allreduce_sum_pre_post", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5))
put("allreduce_max", hvd.allreduce(x, op=hvd.Max))
put("allreduce_uint16", hvd.allreduce(tf.constant([65535, 3], tf.uint16), op=hvd.Sum))
put("allreduce_int_avg", hvd.allreduce(tf.constant([7, -7]) * (r + 1)))
put("allreduce_fp16", hvd.allreduce(x, compression=hvd.Compression.fp16))
put("grouped", [t.numpy().tolist() for t in hvd.grouped_allreduce([x, tf.constant([r])], op=hvd.Sum)])
put("allgather_uneven", hvd.allgather(tf.fill([r + 1, 2], float(r))))
put("grouped_allgather", [t.numpy().tolist() for t in hvd.grouped_allgather([tf.constant([r]), tf.constant([[r, r]])])])
put("broadcast", hvd.broadcast(x, 1))
put("alltoall", [t.numpy().tolist() for t in hvd.alltoall(tf.range(4) + 10 * r, splits=[1, 3] if r == 0 else [2, 2])])
put("reducescatter", hvd.reducescatter(tf.reshape(tf.range(4, dtype=tf.float32), [4, 1]), op=hvd.Sum))
sl = tf.IndexedSlices(tf.constant([[1.0, 1.0]]) * (r + 1), tf.constant([r]), tf.constant([2, 2]))
red = hvd.allreduce(sl, op=hvd.Sum)
put("indexed_slices", [red.values.numpy().tolist(), red.indices.numpy().tolist()])

# gradients (Horovod's rules)
v = tf.Variable([float(r + 1)] * 3)
with tf.GradientTape(persistent=True) as tape:
    s = tf.reduce_sum(hvd.allreduce(v * v, op=hvd.Sum))
    g = tf.reduce_sum(hvd.allgather(v))
    b = tf.reduce_sum(hvd.broadcast(v, 0))
put("grad_allreduce", tape.gradient(s, v))   # 2v * sum over ranks of ones
put("grad_allgather", tape.gradient(g, v))   # average over ranks of ones, this rank's rows
put("grad_broadcast", tape.gradient(b, v))   # averaged on the root, zero elsewhere


@tf.function
def traced(a):
    s = hvd.allreduce(a, op=hvd.Sum)
    gathered = hvd.allgather(a)
    gs = hvd.grouped_allreduce([a, a * 2.0], op=hvd.Sum)
    with tf.GradientTape() as t2:
        t2.watch(a)
        y = tf.reduce_sum(hvd.allreduce(a * a, op=hvd.Sum))
    return s, gathered, gs[1], t2.gradient(y, a)


for step in range(3):  # repeated calls of the same traced function
    res = traced(tf.constant([float(r + step)]))
put("tf_function", [t.numpy().tolist() for t in res])

# the tape and the TF1 optimizer: gradients averaged across ranks
model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1, use_bias=False,
                             kernel_initializer=tf.keras.initializers.Constant(float(r)))])
hvd.broadcast_variables(model.variables, root_rank=1)
put("broadcast_variables", model.variables[0].numpy().ravel().tolist())
data = tf.constant([[1.0, 2.0]]) * (r + 1)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(data))
dtape = hvd.DistributedGradientTape(tape)
put("tape_isinstance", isinstance(dtape, tf.GradientTape))
put("tape_grads", dtape.gradient(loss, model.trainable_variables)[0].numpy().ravel().tolist())
w = tf.Variable([1.0, 1.0])
opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
opt.minimize(lambda: tf.reduce_sum(w * tf.constant([1.0, 2.0]) * float(r + 1)), var_list=[w])
put("v1_optimizer", w.numpy().tolist())
put("objects", [hvd.broadcast_object({"from": r}, 1), hvd.allgather_object(r)])

# op=hvd.Adasum: every value and every rank's input is printed; the test computes the Adasum
# reference from both ranks' inputs
rng = np.random.RandomState(10 + r)
a32 = rng.normal(size=(2, 3)).astype(np.float32)
b64 = rng.normal(size=(4,))
c16 = rng.normal(size=(3,)).astype(np.float16)
ortho = np.eye(2)[r]          # orthogonal on the two ranks: Adasum adds them
same = np.array([3.0, -4.0])  # identical on the two ranks: Adasum keeps it
put("adasum_inputs", {"a32": a32.tolist(), "b64": b64.tolist(), "c16": c16.tolist()})
put("adasum_eager", hvd.allreduce(tf.constant(a32), op=hvd.Adasum))
put("adasum_scaled", hvd.allreduce(tf.constant(a32), op=hvd.Adasum, prescale_factor=2.0,
                                   postscale_factor=0.25))
adasum_fn = tf.function(lambda a, b: (hvd.allreduce(a, op=hvd.Adasum),
                                      hvd.grouped_allreduce([a, b], op=hvd.Adasum)))
single, grouped_fn = adasum_fn(tf.constant(a32), tf.constant(b64))
put("adasum_fn", [single.numpy().tolist()] + [t.numpy().tolist() for t in grouped_fn])
put("adasum_grouped", [t.numpy().tolist() for t in hvd.grouped_allreduce(
    [tf.constant(a32), tf.constant(b64), tf.constant(c16), tf.constant(ortho), tf.constant(same)],
    op=hvd.Adasum)])
# the gradient of an Adasum allreduce is the Adasum allreduce of the gradient (Horovod's)
v_ad = tf.Variable(b64)
upstream = np.arange(1.0, 5.0) * (1.0 if r == 0 else -0.5) + r
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allreduce(v_ad, op=hvd.Adasum) * upstream)
put("adasum_grad", {"upstream": upstream.tolist(), "grad": tape.gradient(loss, v_ad).numpy().tolist()})
# DistributedGradientTape(op=Adasum), eagerly and in a tf.function: the local gradients combined
t1, t2 = tf.Variable([1.0, -2.0, 0.5]), tf.Variable([[0.5, 1.0], [2.0, -1.0]])
feat = tf.constant(rng.normal(size=(3,)), tf.float32)


def tape_loss():
    return tf.reduce_sum(t1 * feat) ** 2 + tf.reduce_sum(t2 * t2) * float(r + 1)


def adasum_tape():
    with tf.GradientTape() as t:
        loss = tape_loss()
    local = t.gradient(loss, [t1, t2])
    with tf.GradientTape() as t:
        loss = tape_loss()
    return local, hvd.DistributedGradientTape(t, op=hvd.Adasum).gradient(loss, [t1, t2])


tape_eager = adasum_tape()
tape_fn = tf.function(adasum_tape)()
put("adasum_tape", {kind: [[g.numpy().tolist() for g in gs] for gs in res]
                    for kind, res in (("eager", tape_eager), ("fn", tape_fn))})
# DistributedOptimizer(tf.compat.v1 optimizer, op=Adasum): local steps, weight deltas combined.
# Loss 0.5 |w - target|^2: the gradient is w - target; the test replays both ranks.
target = np.array([1.0, -2.0, 3.0] if r == 0 else [-1.0, 0.5, 2.0], np.float32)
histories = {}
w_e = tf.Variable([0.5, 0.5, 0.5])   # eagerly, momentum (its slots stay local), one pass per step
opt = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), op=hvd.Adasum)
histories["eager_momentum"] = []
for _ in range(3):
    opt.minimize(lambda: 0.5 * tf.reduce_sum((w_e - target) ** 2), var_list=[w_e])
    histories["eager_momentum"].append(w_e.numpy().tolist())
histories["name"] = opt.get_name()
w_f = tf.Variable([0.5, 0.5, 0.5])   # in a tf.function, 2 local passes per combination
opt_f = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25),
                                 op=hvd.Adasum, backward_passes_per_step=2)


@tf.function
def opt_step():
    with tf.GradientTape() as t:
        loss = 0.5 * tf.reduce_sum((w_f - target) ** 2)
    opt_f.apply_gradients(zip(t.gradient(loss, [w_f]), [w_f]))
    return hvd.allreduce(loss)  # a collective after the step: the order stays the same on both


histories["fn_passes2"] = []
for _ in range(4):
    opt_step()
    histories["fn_passes2"].append(w_f.numpy().tolist())
graph = tf.Graph()  # a TF1 graph and session, with a global step
with graph.as_default():
    w_g = tf.compat.v1.get_variable("w_g", initializer=[0.5, 0.5, 0.5], use_resource=True)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25),
                                     op=hvd.Adasum).minimize(
        0.5 * tf.reduce_sum((w_g - target) ** 2), global_step=step)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        histories["graph"] = []
        for _ in range(2):
            sess.run(train)
            histories["graph"].append(sess.run(w_g).tolist())
        histories["graph_step"] = int(sess.run(step))
put("adasum_optimizer", {"target": target.tolist(), **histories})
# DistributedOptimizer(tf.compat.v1 optimizer, backward_passes_per_step=2) in a TF1 session:
# gradients summed over 2 passes, averaged across ranks, applied every 2nd run (global step too)
graph = tf.Graph()
with graph.as_default():
    w_p = tf.compat.v1.get_variable("w_p", initializer=[0.5, 0.5, 0.5], use_resource=True)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.25, 0.5),
                                     backward_passes_per_step=2).minimize(
        0.5 * tf.reduce_sum((w_p - target) ** 2), global_step=step)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        passes = []
        for _ in range(4):
            sess.run(train)
            passes.append([sess.run(w_p).tolist(), int(sess.run(step))])
put("tf1_passes", passes)
# register_local_var on a TF1 DistributedOptimizer (Horovod's model-parallel API): the local
# variable's gradient stays this rank's, divided by the set's size (scale_local_gradients, the
# default) or not; the global one is averaged
tf1_local = {}
for scale in (True, False):
    graph = tf.Graph()
    with graph.as_default():
        w_glob = tf.compat.v1.get_variable("w_glob", initializer=[0.5, 0.5, 0.5], use_resource=True)
        w_loc = tf.compat.v1.get_variable("w_loc", initializer=[0.5, 0.5, 0.5], use_resource=True)
        opt_l = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25),
                                         scale_local_gradients=scale)
        opt_l.register_local_var(w_loc)
        train = opt_l.minimize(0.5 * tf.reduce_sum((w_glob - target) ** 2)
                               + 0.5 * tf.reduce_sum((w_loc - target) ** 2))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            tf1_local[str(scale)] = {"global": sess.run(w_glob).tolist(),
                                     "local": sess.run(w_loc).tolist(),
                                     "scale_local_gradients": opt_l.scale_local_gradients}
put("tf1_local_var", tf1_local)
# horovod.tensorflow.keras' value allreduce takes the op too
import horovod.tensorflow.keras as hvd_keras  # noqa: E402
put("adasum_keras_allreduce", hvd_keras.allreduce(a32, op=hvd.Adasum))


def error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the error is the point
        return [type(exc).__name__, str(exc)[:2000]]
    return None


# A collective that fails inside a tf.function reaches the caller as text (an UnknownError); the
# elastic loop gets back which peer failed first and that it froze, as an eager failure says.
from horovod_compat.common.exceptions import peer_failure  # noqa: E402
from horovod_compat.tensorflow.elastic import internal_error  # noqa: E402


def _frozen_peer(name, *arrays):
    raise peer_failure("rank 1 stopped making progress (no sign of life for 30 s while rank 0 "
                       "waited for it)", 1, True)


try:
    tf.function(lambda: mpi_ops._run(_frozen_peer, [tf.constant([1.0])], [tf.float32], "failing"))()
except tf.errors.UnknownError as exc:
    node_failure = internal_error(exc)
    put("node_failure", [type(node_failure).__name__, node_failure.knock_on, node_failure.peer,
                         node_failure.frozen, "stopped making progress" in str(node_failure)])


sparse = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([r]), tf.constant([2, 3]))
emb = tf.Variable(tf.ones([4, 2]))
with tf.GradientTape(persistent=True) as tape_sp:
    loss_sp = tf.reduce_sum(tf.gather(emb, [r, 3]))


class _SizeThree:  # a job of 3 ranks, as far as the checks made before any op are concerned
    def __enter__(self):
        self.size = hvd.ProcessSet.size
        hvd.ProcessSet.size = lambda self: 3

    def __exit__(self, *exc):
        hvd.ProcessSet.size = self.size


def three(fn):
    with _SizeThree():
        return error_of(fn)


@tf.function
def adasum_of_int_in_function():
    return hvd.grouped_allreduce([tf.constant([1.0]), tf.constant([1, 2])], op=hvd.Adasum)


errors = {
    "int": error_of(lambda: hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum)),
    "int_fn": error_of(adasum_of_int_in_function),
    "sparse": error_of(lambda: hvd.allreduce(sparse, op=hvd.Adasum)),
    "sparse_grouped": error_of(lambda: hvd.grouped_allreduce([tf.constant([1.0]), sparse],
                                                             op=hvd.Adasum)),
    "sparse_tape": error_of(lambda: hvd.DistributedGradientTape(tape_sp, op=hvd.Adasum)
                            .gradient(loss_sp, [emb])),
    "three_allreduce": three(lambda: hvd.allreduce(tf.constant([1.0]), op=hvd.Adasum)),
    "three_grouped": three(lambda: hvd.grouped_allreduce([tf.constant([1.0])], op=hvd.Adasum)),
    "three_tape": three(lambda: hvd.DistributedGradientTape(tape_sp, op=hvd.Adasum,
                                                            sparse_as_dense=True)
                        .gradient(loss_sp, [emb])),
    "three_optimizer": three(lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum).minimize(
        lambda: tf.reduce_sum(emb), var_list=[emb])),
    "keras_optimizer": error_of(lambda: hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),
                                                                 op=hvd.Adasum)),
    "keras_binding_optimizer": error_of(lambda: hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.SGD(0.1), op=hvd.Adasum)),
    "average_aggregated": error_of(lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum,
        backward_passes_per_step=2, average_aggregated_gradients=True)),
}
dense_sp = hvd.DistributedGradientTape(tape_sp, op=hvd.Adasum, sparse_as_dense=True).gradient(
    loss_sp, [emb])[0]
put("adasum_errors", errors)
put("adasum_sparse_as_dense", dense_sp.numpy().tolist())

# AutoGraph: a user's tf.function around the binding's allreduce and tape (the same x on every
# rank: y = sum(x * x) and its gradient 2x, averaged)
put("autograph_allowlisted", autograph_allowlisted)


@tf.function
def autograph_step(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(hvd.allreduce(x * x))
    return y, hvd.DistributedGradientTape(tape).gradient(y, x)


y_ag, g_ag = autograph_step(tf.constant(np.arange(4, dtype=np.float32)))
put("autograph_step", [float(y_ag), g_ag.numpy().tolist()])

# one runtime for both bindings
hvd_torch.init()  # a second init is a no-op, as Horovod's
put("same_world", [hvd_torch.rank(), hvd_torch.size(), hvd.rank(), hvd.size()])
ps = hvd.add_process_set([1])  # added through one binding, seen by the other
put("process_set_shared", [ps.process_set_id, hvd_torch.get_process_set_ids_and_ranks()[ps.process_set_id]])
if r == 1:  # Adasum over a process set (of one rank: its own tensor)
    put("adasum_process_set", hvd.allreduce(tf.constant(a32), op=hvd.Adasum, process_set=ps))
mixed = [hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy().tolist(),
         hvd_torch.allreduce(torch.tensor([2.0]), op=hvd_torch.Sum).tolist()]
put("mixed_bindings", mixed)
hvd.barrier()  # eagerly, and inside a tf.function
tf.function(lambda: hvd.barrier())()
put("barrier", "passed")
put("join", hvd.join())
for key, value in out.items():
    print("RESULT " + json.dumps({"key": key, "value": value}), flush=True)
hvd.shutdown()
