"""Keras ``model.fit`` with ``hvd.DistributedOptimizer`` against MultiWorkerMirroredStrategy and one
process, 2 CPU ranks on one host.

    python benchmarks/keras_fit.py [--steps 8] [--warmup 3] [--rounds 4] [--models mlp,cnn]
                                   [--mlp-batch 64] [--cnn-batch 64] [--allreduce-iters 10]

Two models: an MLP 1024-4096-4096-1000 (25.1M parameters, 100 MB of float32 gradients) and a small
CNN (3 conv layers on 32x32x3, 0.1M parameters).  For each, ``model.fit`` steps/s (SGD, synthetic
data, the same global batch everywhere) of

* (a) ``hvd``   2 ranks: ``import horovod.tensorflow.keras as hvd``, ``hvd.DistributedOptimizer``,
                ``BroadcastGlobalVariablesCallback``; each rank fits half of the global batch;
* (b) ``mwms``  2 workers of ``tf.distribute.MultiWorkerMirroredStrategy`` (``TF_CONFIG`` agreed
                with ``horovod_compat.tensorflow.tf_config.agree_tf_config``; Keras 3 needs the
                fix for keras-team/keras#20585 that migration_guide/tensorflow.md gives); the
                strategy splits the global batch;
* (c) ``one``   one process doing one rank's work: half of the global batch (the other rank waits);
* (d) ``ideal`` what 2 ranks can at best do: (c)'s step time + the time of the allreduce of the
                gradient bytes, measured with ``hvd.grouped_allreduce`` of the model's
                gradient-shaped tensors inside a ``tf.function`` (what ``DistributedOptimizer``
                runs each step) on the same 2 ranks, median of ``--allreduce-iters``;

and the ratios hvd / mwms (target >= 1.0) and hvd / ideal (target >= 0.97).  For diagnosis also
(e) ``both``: both ranks fit (c)'s model at the same time, each on its own (one rank's compute while
the other rank computes too: what the 2 ranks' steps cost without any communication), and
hvd / (e + allreduce); and (f) ``lockstep``: (e)'s step times of both ranks as if they waited for
each other every step (step i costs the slower rank's i-th step) -- a synchronous job's compute,
which (e)'s mean does not include: what each step loses to the ranks' step-to-step variation --
and hvd / (f + allreduce), what is left for the binding to lose.

All of it runs in ONE job of 2 ranks (the project's engine, ``distributor.run_function``), in
interleaved rounds -- per round: (a), (b), (c), (e) and (f), the allreduce; each round starts one
figure later than the one before ((b), (c), (e), (a) in the second), so that none is always first,
where a host still warming up measured it up to a third slower -- so that load from
other jobs on the host hits every figure alike.  The steps/s printed are each figure's best round;
the ratios are the median over the rounds of each round's ratio; every round is printed too.
The Horovod and the MWMS model live side by side in each process (the strategy is created first,
the Horovod model outside its scope).  A step's time is the mean interval between consecutive
``on_train_batch_end`` calls of one ``fit`` call (rank 0's; the ranks move in lock-step), after
``--warmup`` untimed steps of each model.  One TensorFlow intra-op thread per process,
``OMP_NUM_THREADS=1``; ranks are not bound to cores (as ``horovodrun`` starts them), so (c) runs
TensorFlow's inter-op threads on both cores while the other rank idles: the whole machine for one
rank's work, which a 2-rank job cannot have; (e) measures what two ranks computing at once get.
``--pin`` binds each rank (every thread of it) to a core of its own, as Open MPI's ``mpirun`` does
for 2 ranks by default; then (c) is one rank's share of the host, one core.  Prints figures, no
asserts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Dict, List

ENV = {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
#: Each round's figures (seconds a step; the allreduce's seconds), in the order they are printed.
FIGURES = ("hvd", "mwms", "one", "both", "lockstep", "allreduce")


# ------------------------------------------------------------------------------ inside the ranks

def _models(tf: Any) -> Dict[str, Any]:
    keras = tf.keras

    def mlp() -> Any:
        return keras.Sequential([
            keras.Input((1024,)),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(1000),
        ])

    def cnn() -> Any:
        return keras.Sequential([
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(128, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ])

    return {"mlp": (mlp, (1024,), 1000), "cnn": (cnn, (32, 32, 3), 10)}


def _data(tf: Any, shape: tuple, classes: int, batch: int, seed: int) -> Any:
    """A repeating dataset of 4 distinct batches of random inputs and labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4 * batch, *shape)).astype(np.float32)
    y = rng.integers(0, classes, size=4 * batch).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


def _step_timer(tf: Any) -> Any:
    """A Keras callback that records when each step ends."""
    class StepTimer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: List[float] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.ends.append(time.perf_counter())

    return StepTimer()


def _intervals(ends: List[float]) -> List[float]:
    """The times between consecutive step ends (the first step of a ``fit`` call, which also
    sets up its iterator, ends before the first interval starts)."""
    return [b - a for a, b in zip(ends, ends[1:])]


def _fit_steps(tf: Any, model: Any, dataset: Any, steps: int, callbacks: Any = ()) -> List[float]:
    """The step times of ``steps`` steps of one ``model.fit`` call."""
    timer = _step_timer(tf)
    model.fit(dataset, epochs=1, steps_per_epoch=steps + 1, verbose=0,
              callbacks=[*callbacks, timer])
    return _intervals(timer.ends)


def _fit(tf: Any, model: Any, dataset: Any, steps: int, callbacks: Any = ()) -> float:
    """Mean step time of ``steps`` steps of one ``model.fit`` call."""
    return statistics.fmean(_fit_steps(tf, model, dataset, steps, callbacks))


def _lockstep(per_rank: List[List[float]]) -> float:
    """The mean step time of ranks that wait for each other every step, estimated from their
    free-running step times: step i costs the slowest rank's i-th step."""
    return statistics.fmean(max(steps) for steps in zip(*per_rank))


def _compile(tf: Any, model: Any, optimizer: Any) -> None:
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _fix_keras3_multi_worker_fit(tf: Any) -> None:
    """keras-team/keras#20585 (the same fix as migration_guide/tensorflow.md's): Keras 3's
    ``model.fit`` under MWMS with several workers reduces the first batch as a whole tuple and
    averages scalar logs with ``axis=0``; build from the local replica's values, average over
    replicas with ``axis=None``."""
    if tf.keras.__name__.startswith("tf_keras"):
        return
    from keras.src.backend.tensorflow import trainer

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> None:
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: v.values[0] if isinstance(v, tf.distribute.DistributedValues) else v,
                    next(it))
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    reduce_per_replica = trainer.reduce_per_replica

    def multi_worker_reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if (reduction in ("auto", "mean") and not isinstance(strategy, tf.distribute.TPUStrategy)
                and trainer._collective_all_reduce_multi_worker(strategy)):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return reduce_per_replica(values, strategy, reduction)

    trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = multi_worker_reduce_per_replica


def _pin_to_own_core(rank: int) -> int:
    """Bind every thread of this process to one core (``rank`` modulo the usable cores), as Open
    MPI's ``mpirun`` binds 2 ranks to cores by default; threads started later inherit it."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:  # a thread that just ended
            pass
    return core


def _rank(names: List[str], batches: Dict[str, int], steps: int, warmup: int, rounds: int,
          allreduce_iters: int, pin: bool) -> Dict[str, Dict[str, List[float]]]:
    """Every measurement, in each of the 2 ranks, round by round: (a) hvd, (b) MWMS, (c) one
    process (rank 0 alone; rank 1 waits), the gradient allreduce."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    from horovod_compat.tensorflow.tf_config import agree_tf_config

    hvd.init()
    if pin:
        _pin_to_own_core(hvd.local_rank())
    agree_tf_config()            # TF_CONFIG before the strategy and before any TensorFlow op
    import tensorflow as tf

    _fix_keras3_multi_worker_fit(tf)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    shard = tf.data.Options()
    shard.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA

    out: Dict[str, Dict[str, List[float]]] = {}
    for name in names:
        build, shape, classes = _models(tf)[name]
        half = batches[name] // hvd.size()
        tf.keras.utils.set_random_seed(1)
        # (a) Horovod: each rank fits half of the global batch
        hvd_model = build()
        _compile(tf, hvd_model, hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)))
        hvd_data = _data(tf, shape, classes, half, seed=hvd.rank())
        hvd_callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        # (b) MWMS: the strategy splits the global batch
        with strategy.scope():
            mwms_model = build()
            _compile(tf, mwms_model, tf.keras.optimizers.SGD(0.01))
        mwms_data = _data(tf, shape, classes, batches[name], seed=0).with_options(shard)
        # (c) one process with one rank's work
        one_model = build()
        _compile(tf, one_model, tf.keras.optimizers.SGD(0.01))
        one_data = _data(tf, shape, classes, half, seed=0)
        # the gradient bytes, as DistributedOptimizer reduces them: one grouped allreduce
        grads = [tf.zeros_like(v) for v in hvd_model.trainable_variables]

        @tf.function(autograph=False)
        def reduce(gs):
            return hvd_tf.grouped_allreduce(gs, op=hvd_tf.Average)

        # warm-up: tracing, first iterators, buffers
        _fit(tf, hvd_model, hvd_data, warmup, hvd_callbacks)
        _fit(tf, mwms_model, mwms_data, warmup)
        _fit(tf, one_model, one_data, warmup)
        hvd_tf.barrier()
        reduce(grads)

        res: Dict[str, List[float]] = {k: [] for k in FIGURES}

        def fit_hvd() -> None:
            res["hvd"].append(_fit(tf, hvd_model, hvd_data, steps))

        def fit_mwms() -> None:
            res["mwms"].append(_fit(tf, mwms_model, mwms_data, steps))

        def fit_one() -> None:
            if hvd.rank() == 0:
                res["one"].append(_fit(tf, one_model, one_data, steps))
            hvd_tf.barrier()

        def fit_both() -> None:
            hvd_tf.barrier()
            both = _fit_steps(tf, one_model, one_data, steps)
            res["both"].append(statistics.fmean(both))
            res["lockstep"].append(_lockstep(hvd_tf.allgather_object(both)))

        fits = [fit_hvd, fit_mwms, fit_one, fit_both]
        for round_ in range(rounds):
            # each round starts at the next figure: the same order on both ranks, and no figure
            # always first (a host still warming up slows whichever figure runs first)
            for fit in fits[round_ % len(fits):] + fits[:round_ % len(fits)]:
                fit()
            times = []
            for _ in range(allreduce_iters):
                hvd_tf.barrier()
                t0 = time.perf_counter()
                [r.numpy() for r in reduce(grads)]
                times.append(time.perf_counter() - t0)
            res["allreduce"].append(statistics.median(times))
        res["params"] = [float(hvd_model.count_params())]
        res["grad_bytes"] = [float(sum(g.shape.num_elements() * 4 for g in grads))]
        out[name] = res
    return out


# ------------------------------------------------------------------------------ the driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per figure and round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (tracing)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved rounds of every figure (4: each fit figure once in each place)")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--mlp-batch", type=int, default=64, help="global batch of the MLP")
    ap.add_argument("--cnn-batch", type=int, default=64, help="global batch of the CNN")
    ap.add_argument("--allreduce-iters", type=int, default=10)
    ap.add_argument("--pin", action="store_true",
                    help="bind each rank to a core of its own, as mpirun does for 2 ranks")
    args = ap.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    batches = {"mlp": args.mlp_batch, "cnn": args.cnn_batch}
    os.environ.pop("TF_CONFIG", None)
    from distributor import run_function

    t0 = time.perf_counter()
    res = run_function(_rank, names, batches, args.steps, args.warmup, args.rounds,
                       args.allreduce_iters, args.pin, num_processes=2, env=ENV)
    took = time.perf_counter() - t0

    print(f"Keras {_keras_version()} model.fit, 2 CPU ranks on one host, SGD, 1 intra-op thread "
          f"per process, {'each rank bound to a core of its own' if args.pin else 'ranks not bound to cores'}; "
          f"{args.steps} steps per figure and round, {args.rounds} interleaved rounds "
          f"({took:.0f} s in all)")
    print("steps/s: the best round's (1 / mean step time); ratios: the median over the rounds of "
          "each round's ratio (figures of one round were measured seconds apart)")
    print(f"{'model':<5} {'params':>7} {'grad MB':>8} {'batch':>6} {'(a) hvd':>8} {'(b) mwms':>9} "
          f"{'(c) one':>8} {'allreduce':>10} {'(d) ideal':>10} {'(e) both':>9} {'(f) lockstep':>13} "
          f"{'hvd/mwms':>9} {'hvd/ideal':>10} {'hvd/(e+ar)':>11} {'hvd/(f+ar)':>11}")
    ratios: Dict[str, Dict[str, List[float]]] = {}
    for name in names:
        r = res[name]
        rounds = [dict(zip(FIGURES, round_)) for round_ in zip(*(r[k] for k in FIGURES))]
        ratios[name] = {  # each a ratio of steps/s: the other's step time over hvd's
            "hvd/mwms": [x["mwms"] / x["hvd"] for x in rounds],
            "hvd/ideal": [(x["one"] + x["allreduce"]) / x["hvd"] for x in rounds],
            "hvd/(e+ar)": [(x["both"] + x["allreduce"]) / x["hvd"] for x in rounds],
            "hvd/(f+ar)": [(x["lockstep"] + x["allreduce"]) / x["hvd"] for x in rounds],
        }
        med = {k: statistics.median(v) for k, v in ratios[name].items()}
        best = {k: min(r[k]) for k in FIGURES}
        ideal_step = best["one"] + best["allreduce"]
        print(f"{name:<5} {r['params'][0] / 1e6:>6.1f}M {r['grad_bytes'][0] / 1e6:>8.1f} "
              f"{batches[name]:>6} {1 / best['hvd']:>8.2f} {1 / best['mwms']:>9.2f} "
              f"{1 / best['one']:>8.2f} {best['allreduce'] * 1e3:>8.1f}ms {1 / ideal_step:>10.2f} "
              f"{1 / best['both']:>9.2f} {1 / best['lockstep']:>13.2f} {med['hvd/mwms']:>9.2f} "
              f"{med['hvd/ideal']:>10.2f} {med['hvd/(e+ar)']:>11.2f} {med['hvd/(f+ar)']:>11.2f}")
    print("batch: the global batch (hvd: half per rank; mwms: split by the strategy).  (c): one "
          "process fitting half the global batch\n(one rank's compute; the other rank waits).  "
          "(d) = 1 / ((c)'s step time + the allreduce of the gradient bytes).  (e): both ranks fit "
          "(c)'s model at once,\neach on its own (no communication: one rank's compute while "
          "the other computes too).  (f): (e)'s steps as if the ranks waited for each other every "
          "step\n(step i costs the slower rank's i-th step): what any synchronous data-parallel "
          "job of these ranks gets before communicating.  Per round:")
    for name in names:
        r = res[name]
        print(f"  {name}: steps/s " + "; ".join(
            f"{k} " + " ".join(f"{1 / t:.2f}" for t in r[k])
            for k in FIGURES[:-1])
            + "; allreduce ms " + " ".join(f"{t * 1e3:.1f}" for t in r["allreduce"]))
        print(f"  {name}: " + "; ".join(
            f"{k} " + " ".join(f"{x:.2f}" for x in v) for k, v in ratios[name].items()))
    print("targets: hvd/mwms >= 1.0, hvd/ideal >= 0.97")


def _keras_version() -> str:
    try:
        from importlib.metadata import version

        return version("keras")
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    main()
