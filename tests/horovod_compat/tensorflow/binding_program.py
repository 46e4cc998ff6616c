"""Run under `horovodrun -np 2`: horovod.tensorflow's collectives eagerly and in tf.function, their
gradients, the tape, the TF1 optimizer, broadcasts, and both bindings on one runtime.  Every rank
prints `RESULT <json>` lines that test_tensorflow_binding.py checks."""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import horovod.torch as hvd_torch  # noqa: E402

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

# one runtime for both bindings
hvd_torch.init()  # a second init is a no-op, as Horovod's
put("same_world", [hvd_torch.rank(), hvd_torch.size(), hvd.rank(), hvd.size()])
ps = hvd.add_process_set([1])  # added through one binding, seen by the other
put("process_set_shared", [ps.process_set_id, hvd_torch.get_process_set_ids_and_ranks()[ps.process_set_id]])
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
