"""horovod.tensorflow.keras / horovod.keras checks, run under `horovodrun -np 2` by
test_keras_binding.py: once with Keras 3 (TensorFlow's default tf.keras) and once with tf-keras
(TF_USE_LEGACY_KERAS=1 set by the test before TensorFlow is imported).

Every check prints what it measured on one line per rank, `KERAS {"key": ..., "value": ...}`; the
test asserts on the values. Reference runs (one process, the full batch, a plain optimizer) happen in
the same process, without collectives. Argument: a scratch directory.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np
import tensorflow as tf

import horovod.keras as hvd_keras
import horovod.tensorflow.keras as hvd
from horovod_compat.tensorflow import allgather_object

K = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "") not in ("", "0")
SCRATCH = sys.argv[1]

hvd.init(process_sets="dynamic")
RANK, SIZE = hvd.rank(), hvd.size()
assert SIZE == 2, "run me with horovodrun -np 2"


def emit(key, value):
    print("KERAS " + json.dumps({"key": key, "value": value}), flush=True)


def data(n=16, seed=0):
    rng = np.random.RandomState(seed)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")


def make_model(seed):
    model = K.Sequential([K.Input((4,)), K.layers.Dense(3, activation="tanh"), K.layers.Dense(2)])
    rng = np.random.RandomState(seed)
    model.set_weights([(rng.normal(size=w.shape) * 0.5).astype("float32")
                       for w in model.get_weights()])
    return model


def flat(model):
    return np.concatenate([np.asarray(w).reshape(-1) for w in model.get_weights()])


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def opt_vars(opt):
    v = opt.variables
    return list(v() if callable(v) else v)


def half(arr):
    n = len(arr) // SIZE
    return arr[RANK * n:(RANK + 1) * n]


def sgd(lr=0.05, momentum=0.9):
    return K.optimizers.SGD(learning_rate=lr, momentum=momentum)


def fit_passes(model, x, y, batch_size, passes):
    """`passes` passes over (x, y) in order, as ONE epoch over the data repeated: the same steps on
    the same batches as ``fit(x, y, epochs=passes, shuffle=False)`` (len(x) is a multiple of
    batch_size), without Keras' work at each epoch's start and end (about 0.1 s of CPU each,
    most of a one-step epoch). For the checks of numerics; the callbacks' checks keep epochs."""
    assert len(x) % batch_size == 0, (len(x), batch_size)
    model.fit(np.tile(x, (passes, 1)), np.tile(y, (passes, 1)), batch_size=batch_size, epochs=1,
              shuffle=False, verbose=0)


def reference(seed, opt, x, y, epochs, batch_size):
    model = make_model(seed)
    model.compile(optimizer=opt, loss="mse")
    fit_passes(model, x, y, batch_size, epochs)
    return flat(model)


# ----------------------------------------------------------------------------- (a) numerics

def check_numerics():
    x, y = data()
    ref = reference(1, sgd(), x, y, epochs=20, batch_size=16)
    for label, kwargs in (("graph", {}), ("eager", {"run_eagerly": True}),
                          ("steps_per_execution", {"steps_per_execution": 5})):
        model = make_model(1)
        base = sgd()
        opt = hvd.DistributedOptimizer(base)
        model.compile(optimizer=opt, loss="mse", **kwargs)
        fit_passes(model, half(x), half(y), 8, 20)
        emit(f"numerics_{label}", {
            "diff_vs_full_batch": max_diff(flat(model), ref),
            "weights": flat(model).tolist(),
            "iterations": int(opt.iterations.numpy()),
            "same_class": isinstance(opt, type(base)) and type(opt).__name__ == type(base).__name__,
        })
    # Adam through horovod.keras, and fp16 compression
    ref = reference(2, K.optimizers.Adam(0.01), x, y, epochs=10, batch_size=16)
    model = make_model(2)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(K.optimizers.Adam(0.01)), loss="mse")
    fit_passes(model, half(x), half(y), 8, 10)
    emit("numerics_adam", max_diff(flat(model), ref))
    ref = reference(3, sgd(), x, y, epochs=10, batch_size=16)
    model = make_model(3)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(), compression=hvd.Compression.fp16),
                  loss="mse")
    fit_passes(model, half(x), half(y), 8, 10)
    emit("numerics_fp16", max_diff(flat(model), ref))
    # op=Sum: the summed gradient is twice the average, i.e. twice the learning rate
    ref = reference(4, sgd(lr=0.1), x, y, epochs=10, batch_size=16)
    model = make_model(4)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(), op=hvd.Sum), loss="mse")
    fit_passes(model, half(x), half(y), 8, 10)
    emit("numerics_sum", max_diff(flat(model), ref))
    # gradient_predivide_factor: the same average, split around the sum
    ref = reference(5, sgd(), x, y, epochs=10, batch_size=16)
    model = make_model(5)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(), gradient_predivide_factor=2.0),
                  loss="mse")
    fit_passes(model, half(x), half(y), 8, 10)
    emit("numerics_predivide", max_diff(flat(model), ref))


# ----------------------------------------------------------------------------- (b) aggregation

def check_backward_passes():
    x, y = data()
    out = {}
    for average in (True, False):
        # 2 passes of 4 rows on each of 2 ranks = one step on the 16 rows; without averaging the
        # aggregated gradient is twice as large: twice the learning rate
        ref = reference(6, sgd(lr=0.05 if average else 0.1), x, y, epochs=10, batch_size=16)
        model = make_model(6)
        opt = hvd.DistributedOptimizer(sgd(), backward_passes_per_step=2,
                                       average_aggregated_gradients=average)
        model.compile(optimizer=opt, loss="mse")
        fit_passes(model, half(x), half(y), 4, 10)
        out[f"average_{average}"] = {
            "diff_vs_full_batch": max_diff(flat(model), ref),
            "iterations": int(opt.iterations.numpy()),
            "counter": int(opt._agg_helper.counter.numpy()),
            "optimizer_variables": len(opt_vars(opt)),
        }
    plain = make_model(6)
    plain_opt = sgd()
    plain.compile(optimizer=plain_opt, loss="mse")
    plain.fit(x[:4], y[:4], batch_size=4, epochs=1, verbose=0)
    out["plain_optimizer_variables"] = len(opt_vars(plain_opt))
    # an odd number of passes: the last one stays in the accumulators, not applied
    model = make_model(6)
    opt = hvd.DistributedOptimizer(sgd(), backward_passes_per_step=2,
                                   average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    model.fit(half(x)[:4], half(y)[:4], batch_size=4, epochs=3, shuffle=False, verbose=0)
    ref = reference(6, sgd(), np.concatenate([x[:4], x[8:12]]), np.concatenate([y[:4], y[8:12]]),
                    epochs=1, batch_size=8)
    out["odd"] = {"counter": int(opt._agg_helper.counter.numpy()),
                  "iterations": int(opt.iterations.numpy()),
                  "diff_vs_one_step": max_diff(flat(model), ref)}
    emit("backward_passes", out)


def check_gradient_aggregation_with_local_vars():
    """Horovod's test_gradient_aggregation(_with_local_vars), in a tf.function: an optimizer that
    adds the gradient; y's gradient depends on the rank; half the variables are local."""
    if LEGACY:
        base_cls = K.optimizers.Optimizer

        class Adding(base_cls):
            def __init__(self, name="adding", **kwargs):
                super().__init__(name=name, **kwargs)
                self._learning_rate = self._build_learning_rate(0.1)

            def update_step(self, gradient, variable):
                variable.assign_add(gradient)
    else:
        class Adding(K.optimizers.Optimizer):
            def __init__(self, learning_rate=0.1, name="adding", **kwargs):
                super().__init__(learning_rate=learning_rate, name=name, **kwargs)

            def update_step(self, gradient, variable, learning_rate):
                variable.assign_add(gradient)

    results = {}
    for average in (True, False):
        opt = hvd.DistributedOptimizer(Adding(), backward_passes_per_step=4,
                                       average_aggregated_gradients=average,
                                       sparse_as_dense=True)
        xs = [tf.Variable([0.0]) for _ in range(4)]
        ys = [tf.Variable([1.0, 2.0]) for _ in range(4)]
        for i in range(2):
            opt.register_local_var(xs[i])
            opt.register_local_var(ys[i])
        variables = xs + ys

        def loss():  # d/dx = 1, d/dy = [-(rank + 1), 0] (an IndexedSlices, from tf.gather)
            return tf.add_n([tf.reduce_sum(x - float(RANK + 1) * tf.gather(y, [0]))
                             for x, y in zip(xs, ys)])

        @tf.function
        def step():
            grads_and_vars = opt._compute_gradients(loss, var_list=variables)
            opt.apply_gradients(grads_and_vars, experimental_aggregate_gradients=False)

        history = []
        for _ in range(10):
            step()
            history.append({"x": [float(v.numpy()[0]) for v in xs],
                            "y0": [float(v.numpy()[0]) for v in ys],
                            "y1": [float(v.numpy()[1]) for v in ys],
                            "iterations": int(opt.iterations.numpy())})
        results[f"average_{average}"] = {"history": history,
                                         "counter": int(opt._agg_helper.counter.numpy())}
    emit("aggregation_local_vars", results)


def check_inf_gradient_cycle():
    """Horovod's test_grad_aggregation_with_inf_grad: an infinite gradient in the first cycle must
    not leak into the second."""
    step_count = tf.Variable(0, trainable=False, dtype=tf.int32)
    opt = hvd.DistributedOptimizer(K.optimizers.SGD(), backward_passes_per_step=2,
                                   sparse_as_dense=True)
    x = tf.Variable(0.0)

    def loss():
        step_count.assign_add(1)
        return tf.cond(tf.greater(step_count, 1), lambda: x, lambda: x * float("inf"))

    grads_and_vars = None
    for _ in range(4):
        grads_and_vars = opt._compute_gradients(loss, var_list=[x])
        opt.apply_gradients(grads_and_vars)
    emit("inf_gradient_cycle", {"last_grad_finite": bool(tf.math.is_finite(grads_and_vars[0][0])),
                                "counter": int(opt._agg_helper.counter.numpy())})


def check_loss_scale_custom_loop():
    """A custom loop with ``LossScaleOptimizer(hvd.DistributedOptimizer(SGD))`` and its own
    ``apply_gradients`` (the tape's gradients, not reduced yet): rank 1's gradients overflow at
    step 1, so both ranks must skip that step and lower the loss scale together, and keep pairing
    their reductions afterwards -- eagerly, in a tf.function, and (tf-keras) with a legacy
    optimizer.  Reported: each rank's weights, loss scale and iterations."""
    out = {}
    kinds = ["new", "legacy"] if LEGACY else ["new"]
    x, y = data(16, seed=7)
    for kind in kinds:
        for traced in (False, True):
            model = make_model(91)
            inner = (K.optimizers.legacy.SGD(0.05) if kind == "legacy" else K.optimizers.SGD(0.05))
            opt = K.mixed_precision.LossScaleOptimizer(hvd.DistributedOptimizer(inner))
            blow_up = tf.Variable(1.0, trainable=False)

            def step(features, labels):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(features) - labels) ** 2) * blow_up
                    scaled = opt.get_scaled_loss(loss) if LEGACY else opt.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                if LEGACY:  # (Keras 3's apply unscales them itself)
                    grads = opt.get_unscaled_gradients(grads)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            run = tf.function(step) if traced else step
            initial_scale = float(opt.loss_scale if LEGACY else opt.initial_scale)
            for i in range(4):
                blow_up.assign(float("inf") if (i == 1 and RANK == 1) else 1.0)
                run(half(x), half(y))
            scale = float(opt.loss_scale if LEGACY else opt.dynamic_scale)
            out[f"{kind}-{'traced' if traced else 'eager'}"] = {
                "weights": flat(model).tolist(), "initial_scale": initial_scale,
                "scale": scale, "iterations": int(opt.iterations.numpy())}
    emit("loss_scale_custom_loop", {"initial_weights": flat(make_model(91)).tolist(), **out})


def check_partial_and_sparse():
    # PartialDistributedOptimizer: local layers' gradients are this rank's, divided by the size
    model = make_model(10 + RANK)
    x, y = data(seed=20 + RANK)
    opt = hvd_keras.PartialDistributedOptimizer(K.optimizers.Adam(), local_layers=[model.layers[0]])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    local_grads = tape.gradient(loss, model.trainable_weights)
    pairs = opt._compute_gradients(loss, model.trainable_weights, tape=tape)
    all_local = allgather_object([np.asarray(g).tolist() for g in local_grads])
    out = []
    for i, (g, _) in enumerate(pairs):
        is_local = i < len(model.layers[0].trainable_weights)
        expected = (np.asarray(local_grads[i]) / SIZE if is_local
                    else np.mean([np.asarray(r[i]) for r in all_local], axis=0))
        out.append({"local": is_local, "diff": max_diff(g, expected)})
    emit("partial_optimizer", out)
    # sparse gradients (Embedding), as IndexedSlices and as dense
    res = {}
    for as_dense in (False, True):
        emb = K.Sequential([K.Input((5,), dtype="int32"), K.layers.Embedding(50, 4)])
        emb.set_weights([np.full((50, 4), 0.5, "float32")])
        opt = hvd.DistributedOptimizer(K.optimizers.SGD(1.0), sparse_as_dense=as_dense)
        emb.compile(optimizer=opt, loss="mse")
        ids = np.array([[RANK, 10, 11, 12, 13]], dtype="int32")
        emb.train_on_batch(ids, np.zeros((1, 5, 4), "float32"))
        w = emb.get_weights()[0]
        res[str(as_dense)] = [float(w[0, 0]), float(w[1, 0]), float(w[10, 0]), float(w[30, 0])]
    emit("sparse", res)


def check_process_set():
    """process_set=: a rank alone in its set averages with nobody (its own half-batch training)."""
    x, y = data()
    sets = [hvd.add_process_set([0]), hvd.add_process_set([1])]  # collective: same order on all
    ref = reference(8, sgd(), half(x), half(y), epochs=5, batch_size=8)
    full = reference(8, sgd(), x, y, epochs=5, batch_size=16)
    model = make_model(8)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(), process_set=sets[RANK]), loss="mse")
    fit_passes(model, half(x), half(y), 8, 5)
    emit("process_set", {"diff_vs_own_half": max_diff(flat(model), ref),
                         "diff_vs_full_batch": max_diff(flat(model), full)})
    for ps in sets:
        hvd.remove_process_set(ps)


# ----------------------------------------------------------------------------- (c) callbacks

class Recorder(K.callbacks.Callback):
    def __init__(self, store, inject=None):
        super().__init__()
        self.store = store
        self.inject = inject

    def on_epoch_end(self, epoch, logs=None):
        if self.inject:
            logs.update(self.inject)
        self.store.append({k: float(v) for k, v in logs.items()})


def check_broadcast_callback():
    x, y = data()
    init0 = flat(make_model(100))
    # lr 0: the weights after fit are the broadcast ones
    model = make_model(100 + RANK)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(lr=0.0)), loss="mse")
    model.fit(half(x), half(y), batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    before = max_diff(flat(make_model(100 + RANK)), init0)
    after = max_diff(flat(model), init0)
    # training from different initial weights = training from rank 0's on the full batch
    ref = reference(100, sgd(), x, y, epochs=5, batch_size=16)
    model = make_model(100 + RANK)
    opt = hvd.DistributedOptimizer(sgd())
    model.compile(optimizer=opt, loss="mse")
    model.fit(half(x), half(y), batch_size=8, epochs=5, shuffle=False, verbose=0,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    trained = max_diff(flat(model), ref)
    optimizer_state = [np.asarray(v).reshape(-1).tolist() for v in opt_vars(opt)]
    # local variables keep each rank's value; root_rank = 1
    model = make_model(200 + RANK)
    local = model.layers[0].kernel
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(lr=0.0)), loss="mse")
    model.fit(half(x), half(y), batch_size=8, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=1, local_variables=[local])])
    mine, root = make_model(200 + RANK).get_weights(), make_model(201).get_weights()
    weights = model.get_weights()
    emit("broadcast_callback", {
        "initial_diff_before": before, "diff_after_lr0": after, "diff_vs_rank0_start": trained,
        "optimizer_state": optimizer_state,
        "local_kernel_is_mine": max_diff(weights[0], mine[0]),
        "others_are_root": max(max_diff(w, r) for w, r in zip(weights[1:], root[1:])),
    })


def lazy_model(kind, seed):
    """A model that builds on its first batch under tf-keras (no weights before): a Sequential
    without an input shape, or a subclassed model; its weights come from `seed`."""
    first = K.initializers.RandomNormal(stddev=0.5, seed=seed)
    second = K.initializers.RandomNormal(stddev=0.5, seed=seed + 1000)
    if kind == "sequential":
        return K.Sequential([K.layers.Dense(3, activation="tanh", kernel_initializer=first),
                             K.layers.Dense(2, kernel_initializer=second)])

    class Net(K.Model):
        def __init__(self):
            super().__init__()
            self.hidden = K.layers.Dense(3, activation="tanh", kernel_initializer=first)
            self.out = K.layers.Dense(2, kernel_initializer=second)

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    return Net()


def check_broadcast_unbuilt():
    """The broadcast callback on models that build on their first batch, each rank's from its
    own seed: training equals one process training from rank 0's weights on the full batch, so
    the first step started from rank 0's weights too (traced, and run eagerly)."""
    x, y = data()
    out = {}
    for kind in ("sequential", "subclassed"):
        for eager in (False, True):
            model = lazy_model(kind, 300 + RANK)
            model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse", run_eagerly=eager)
            model.fit(half(x), half(y), batch_size=8, epochs=3, shuffle=False, verbose=0,
                      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
            ref = lazy_model(kind, 300)
            ref.compile(optimizer=sgd(), loss="mse", run_eagerly=eager)
            ref.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
            out[f"{kind}_{'eager' if eager else 'traced'}"] = max_diff(flat(model), flat(ref))
    emit("broadcast_unbuilt", out)


def check_metric_average():
    x, y = data(seed=30 + RANK)  # different data: different losses per rank
    model = make_model(31)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse", metrics=["mae"])
    raw, averaged = [], []
    history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[
        Recorder(raw, inject={"only_on_rank1": 5.0 + RANK} if RANK == 1 else None),
        hvd.callbacks.MetricAverageCallback(),
        Recorder(averaged)])
    emit("metric_average", {"raw": raw, "averaged": averaged,
                            "history_loss": [float(v) for v in history.history["loss"]]})


class LrRecorder(K.callbacks.Callback):
    def __init__(self, store, momentum=False):
        super().__init__()
        self.store = store
        self.momentum = momentum
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def _lr(self):
        return hvd_lr(self.model.optimizer)

    def on_batch_begin(self, batch, logs=None):
        entry = {"epoch": self.epoch, "batch": batch, "lr": self._lr()}
        if self.momentum:
            entry["momentum"] = float(K.backend.get_value(self.model.optimizer.momentum))
        self.store.append(entry)

    def on_batch_end(self, batch, logs=None):
        if self.momentum:
            self.store[-1]["momentum_after"] = float(
                K.backend.get_value(self.model.optimizer.momentum))


def hvd_lr(opt):
    lr = opt.learning_rate
    return float(np.asarray(lr.numpy() if hasattr(lr, "numpy") else lr))


def check_learning_rate_callbacks():
    x, y = data()
    initial_lr = 0.2

    def scheduled_fit(model, seen):
        opt = hvd.DistributedOptimizer(sgd(lr=initial_lr))
        model.compile(optimizer=opt, loss="mse")
        history = model.fit(half(x), half(y), batch_size=2, epochs=6, shuffle=False, verbose=0,
                            callbacks=[
                                hvd.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=2),
                                hvd.callbacks.LearningRateScheduleCallback(
                                    initial_lr, multiplier=0.5, start_epoch=2, end_epoch=4),
                                hvd.callbacks.LearningRateScheduleCallback(
                                    initial_lr, multiplier=lambda epoch: 0.01 * epoch, start_epoch=4),
                                LrRecorder(seen)])
        return opt, history

    seen, seen_unbuilt = [], []
    opt, history = scheduled_fit(make_model(40), seen)
    scheduled_fit(lazy_model("subclassed", 42), seen_unbuilt)  # builds on its first batch
    result = {"seen": seen, "history_lr": [float(v) for v in history.history["lr"]],
              "lr_attr": float(np.asarray(K.backend.get_value(opt.lr))),
              "seen_unbuilt": seen_unbuilt}
    if LEGACY:  # momentum correction: a legacy optimizer's momentum is a variable
        model = make_model(41)
        model.compile(optimizer=hvd.DistributedOptimizer(
            K.optimizers.legacy.SGD(learning_rate=0.1, momentum=0.9)), loss="mse")
        moments = []
        model.fit(half(x), half(y), batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[
            hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5),
            LrRecorder(moments, momentum=True)])
        result["momentum"] = moments
    emit("learning_rate", result)


def check_best_model_checkpoint():
    x, y = data()
    directory = os.path.join(SCRATCH, f"best-r{RANK}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "best.h5" if LEGACY else "best.keras")
    model = make_model(50)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse")
    callback = hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath=path)
    late = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    late.filepath = os.path.join(directory, "late.h5" if LEGACY else "late.keras")
    model.fit(half(x), half(y), batch_size=8, epochs=2, verbose=0, validation_data=(x, y),
              callbacks=[hvd.callbacks.MetricAverageCallback(), callback, late])
    emit("best_model_checkpoint", {"written": os.path.exists(path),
                                   "late_written": os.path.exists(late.filepath),
                                   "save_best_only": bool(callback.save_best_only),
                                   "best": None if callback.best is None else float(callback.best)})


# ----------------------------------------------------------------------------- (d) load_model

class MySGD(K.optimizers.SGD):
    pass


def check_load_model():
    x, y = data()
    out = {}
    cases = [("plain", sgd, {}), ("custom_optimizers", lambda: MySGD(0.05, momentum=0.9),
                                  {"custom_optimizers": [MySGD]}),
             ("custom_objects", lambda: MySGD(0.05, momentum=0.9), {"custom_objects": {
                 "MySGD": lambda **kw: hvd.DistributedOptimizer(MySGD(**kw))}})]
    if LEGACY:
        cases.append(("legacy_opts", lambda: K.optimizers.legacy.SGD(0.05, momentum=0.9),
                      {"legacy_opts": True}))
        cases.append(("native_format", sgd, {}))
    for label, make_opt, kwargs in cases:
        ext = ".keras" if (label == "native_format" or not LEGACY) else ".h5"
        model = make_model(60)
        opt = hvd.DistributedOptimizer(make_opt())
        model.compile(optimizer=opt, loss="mse")
        model.fit(half(x), half(y), batch_size=8, epochs=1, verbose=0)
        path = os.path.join(SCRATCH, f"saved-{label}-r{RANK}{ext}")
        model.save(path)
        loaded = hvd.load_model(path, **kwargs)
        new_opt = loaded.optimizer
        saved_state = [np.asarray(v) for v in opt_vars(opt)]
        loaded_state = [np.asarray(v) for v in opt_vars(new_opt)]
        state_diff = (max(max_diff(a, b) for a, b in zip(saved_state, loaded_state))
                      if len(saved_state) == len(loaded_state) else None)
        # it trains on, distributed
        loaded.fit(half(x), half(y), batch_size=8, epochs=2, shuffle=False, verbose=0)
        out[label] = {
            "distributed": bool(getattr(type(new_opt), "_hvd_distributed", False)),
            "class": type(new_opt).__name__, "base_class": type(make_opt()).__name__,
            "isinstance": isinstance(new_opt, type(make_opt())),
            "lr": hvd_lr(new_opt), "state_variables": [len(saved_state), len(loaded_state)],
            "state_diff": state_diff, "weights_after": flat(loaded).tolist(),
        }
    emit("load_model", out)


# ----------------------------------------------------------------------------- (e) elastic

def check_elastic_state():
    v = 1.0 if RANK == 0 else 2.0
    model1 = K.Sequential([K.Input((2,)), K.layers.Dense(2, activation="softmax")])
    model1.set_weights([np.full((2, 2), v, "float32"), np.full((2,), v, "float32")])
    model2_weights = [np.array([[1.0, 2.0], [3.0, 4.0]], "float32"), np.zeros(2, "float32")]
    optimizer = K.optimizers.Adam(0.001 * SIZE)
    state = hvd.elastic.KerasState(model1, optimizer, batch=20 + RANK, epoch=10 + RANK)
    state.sync()
    synced = [np.asarray(w).tolist() for w in model1.get_weights()]
    synced_attrs = [state.batch, state.epoch]
    model1_weights = model1.get_weights()
    model1.set_weights(model2_weights)
    state.batch, state.epoch = 21, 11
    state.restore()
    restored = max(max_diff(a, b) for a, b in zip(model1.get_weights(), model1_weights))
    restored_attrs = [state.batch, state.epoch]
    model1.set_weights(model2_weights)
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    committed = max(max_diff(a, b) for a, b in zip(model1.get_weights(), model2_weights))
    committed_attrs = [state.batch, state.epoch]

    # the elastic callbacks during fit (Horovod's example order)
    x, y = data()
    model = make_model(70)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse")
    fit_state = hvd_keras.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    original_commit = fit_state.commit

    def counting_commit():
        commits.append([fit_state.epoch, fit_state.batch])
        original_commit()

    fit_state.commit = counting_commit
    model.fit(half(x), half(y), batch_size=2, epochs=2, shuffle=False, verbose=0, callbacks=[
        hvd.elastic.UpdateEpochStateCallback(fit_state),
        hvd.elastic.UpdateBatchStateCallback(fit_state),
        hvd.elastic.CommitStateCallback(fit_state, batches_per_commit=2)])
    emit("elastic", {"synced": synced, "synced_attrs": synced_attrs, "restored": restored,
                     "restored_attrs": restored_attrs, "committed": committed,
                     "committed_attrs": committed_attrs, "commits": commits,
                     "final": [fit_state.epoch, fit_state.batch],
                     "run_is_callable": callable(hvd.elastic.run)})


def weight_count(model):
    try:
        return len(model.weights)
    except ValueError:  # tf-keras: a Sequential without an input shape, before its first call
        return 0


def elastic_callbacks(state):
    return [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]


def check_elastic_unbuilt():
    """KerasState on models that build on their first batch.

    start: every rank's model unbuilt, each from its own seed; the state is made and synced (as
    hvd.elastic.run does) before fit: training equals one process training from rank 0's weights
    on the full batch (traced and run eagerly), and a commit after the build restores.
    joined: rank 0's model and optimizer are built and hold state (a survivor), rank 1's are not
    (a worker that joined): after sync rank 1 holds rank 0's weights and optimizer variables
    exactly, and training on equals one process going on from that state."""
    x, y = data()
    out = {}
    for kind in ("sequential", "subclassed"):
        for eager in (False, True):
            model = lazy_model(kind, 400 + RANK)
            model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse", run_eagerly=eager)
            state = hvd.elastic.KerasState(model, batch=0, epoch=0)
            state.sync()
            model.fit(half(x), half(y), batch_size=8, epochs=3, shuffle=False, verbose=0,
                      callbacks=elastic_callbacks(state))
            ref = lazy_model(kind, 400)
            ref.compile(optimizer=sgd(), loss="mse", run_eagerly=eager)
            ref.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
            trained = flat(model)
            model.set_weights([np.zeros_like(w) for w in model.get_weights()])
            state.restore()  # the last commit: the end of the last epoch
            out[f"start_{kind}_{'eager' if eager else 'traced'}"] = {
                "vs_reference": max_diff(trained, flat(ref)),
                "restored": max_diff(flat(model), trained), "epoch": state.epoch}

    def adam():
        return K.optimizers.Adam(0.05)

    for kind in ("sequential", "subclassed"):
        model = lazy_model(kind, 500 + RANK)
        model.compile(optimizer=hvd.DistributedOptimizer(adam()), loss="mse")
        if RANK == 0:  # the survivor: built, with optimizer state of its own
            model(x[:1])
            model.optimizer.build(model.trainable_variables)
            for i, v in enumerate(opt_vars(model.optimizer)):
                if tf.as_dtype(v.dtype).is_integer:
                    v.assign(5)
                elif len(v.shape):  # slots (not the learning rate)
                    v.assign(np.full(v.shape, 0.01 * (i + 1), tf.as_dtype(v.dtype).as_numpy_dtype))
        counts_before = [weight_count(model), len(opt_vars(model.optimizer))]
        state = hvd.elastic.KerasState(model, batch=7 - RANK, epoch=1)
        state.sync()
        weights = [np.asarray(w) for w in model.get_weights()]
        slots = [np.asarray(v) for v in opt_vars(model.optimizer)]
        root = allgather_object((weights, slots))[0]
        synced = {"weights": max(max_diff(a, b) for a, b in zip(weights, root[0])),
                  "slots": max(max_diff(a, b) for a, b in zip(slots, root[1])),
                  "counts": [len(weights), len(slots), len(root[0]), len(root[1])],
                  "counts_before": counts_before, "batch": state.batch}
        model.fit(half(x), half(y), batch_size=8, epochs=2, shuffle=False, verbose=0)
        ref = lazy_model(kind, 0)
        ref.compile(optimizer=adam(), loss="mse")
        ref(x[:1])
        ref.optimizer.build(ref.trainable_variables)
        ref.set_weights(root[0])
        for v, value in zip(opt_vars(ref.optimizer), root[1]):
            v.assign(value)
        ref.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        synced["vs_reference"] = max_diff(flat(model), flat(ref))
        out[f"joined_{kind}"] = synced
    emit("elastic_unbuilt", out)


# ----------------------------------------------------------------------------- the rest

def check_api_surface():
    out = {}
    out["allreduce"] = hvd.allreduce([1.0 + RANK, 2.0]).numpy().tolist()
    out["allreduce_sum"] = hvd.allreduce([1.0 + RANK], op=hvd.Sum).numpy().tolist()
    out["keras_allreduce_default_average"] = hvd_keras.allreduce([1.0 + RANK]).numpy().tolist()
    out["keras_allreduce_op"] = hvd_keras.allreduce([1.0 + RANK], op=hvd.Sum).numpy().tolist()
    scalar = hvd.allreduce(1.0 + RANK)
    out["allreduce_scalar"] = [float(scalar.numpy()), scalar.shape.rank]
    out["broadcast_scalar"] = float(hvd.broadcast(3.0 + RANK, root_rank=1).numpy())
    out["allgather"] = hvd.allgather([[float(RANK)]]).numpy().tolist()
    out["broadcast"] = hvd.broadcast([float(RANK) + 5], root_rank=1).numpy().tolist()
    out["reducescatter"] = hvd.reducescatter([[1.0 + RANK], [3.0]]).numpy().tolist()
    try:
        hvd.broadcast_global_variables(0)
        out["broadcast_global_variables"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the point
        out["broadcast_global_variables"] = f"{type(exc).__name__}: {exc}"
    base = K.optimizers.Adam(0.003)
    opt = hvd.DistributedOptimizer(base)
    cfg = opt.get_config()
    out["from_config_roundtrip"] = (opt.from_config(cfg).get_config() == cfg and
                                    type(opt).from_config(cfg).get_config() == cfg)
    out["variables_callable"] = isinstance(opt.variables(), list)
    out["lr_alias"] = float(np.asarray(K.backend.get_value(opt.lr)))
    K.backend.set_value(opt.lr, 0.004)  # Horovod's elastic example does this
    out["set_value_lr"] = [hvd_lr(opt), float(opt.lr.numpy())]
    import horovod.tensorflow as hvd_tf  # its DistributedOptimizer hands Keras optimizers over
    via = hvd_tf.DistributedOptimizer(K.optimizers.SGD(0.1), backward_passes_per_step=2)
    out["via_horovod_tensorflow"] = [bool(getattr(type(via), "_hvd_distributed", False)),
                                     via._agg_helper.backward_passes_per_step]
    out["module"] = type(opt).__module__ == type(base).__module__
    out["names"] = sorted(n for n in ("init", "shutdown", "size", "rank", "local_rank", "local_size",
                                      "cross_rank", "cross_size", "is_initialized", "mpi_enabled",
                                      "gloo_enabled", "nccl_built", "Compression", "Average", "Sum",
                                      "global_process_set", "DistributedOptimizer", "load_model",
                                      "callbacks", "elastic", "broadcast_global_variables",
                                      "start_timeline", "stop_timeline")
                          if hasattr(hvd, n) and hasattr(hvd_keras, n))
    if not LEGACY:
        # Horovod's examples compile with experimental_run_tf_function=False; a distributed
        # optimizer is never XLA-compiled (jit_compile=True would fail on the collectives)
        x, y = data()
        model = make_model(80)
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse",
                          experimental_run_tf_function=False, jit_compile=True)
        model.fit(half(x), half(y), batch_size=8, epochs=1, verbose=0)
        out["compile_patch"] = {"jit_compile": bool(model.jit_compile),
                                "warned": any("jit_compile" in str(w.message) for w in caught)}
        plain = make_model(81)
        plain.compile(optimizer=sgd(), loss="mse", experimental_run_tf_function=False)
        out["compile_patch"]["plain_ok"] = True
    emit("api", out)


CHECKS = [check_api_surface, check_numerics, check_backward_passes,
          check_gradient_aggregation_with_local_vars, check_inf_gradient_cycle,
          check_loss_scale_custom_loop,
          check_partial_and_sparse, check_process_set, check_broadcast_callback,
          check_broadcast_unbuilt, check_metric_average,
          check_learning_rate_callbacks, check_best_model_checkpoint, check_load_model,
          check_elastic_state, check_elastic_unbuilt]

if __name__ == "__main__":
    only = os.environ.get("KERAS_CHECKS")
    emit("flavor", "tf_keras" if LEGACY else "keras3")
    emit("tf_keras_module", K.__name__)
    for check in CHECKS:
        if only and check.__name__ not in only.split(","):
            continue
        started = time.monotonic()
        try:
            check()
            emit(f"seconds.{check.__name__}", round(time.monotonic() - started, 2))
        except Exception:  # noqa: BLE001 - report, then stop this rank (the launcher stops the other)
            emit("error", {"check": check.__name__, "traceback": traceback.format_exc()})
            sys.stdout.flush()
            os._exit(1)
    emit("done", True)
