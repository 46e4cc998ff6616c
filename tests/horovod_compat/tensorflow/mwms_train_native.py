"""``mwms_train_horovod.py`` on ``tf.distribute.MultiWorkerMirroredStrategy``
(migration_guide/tensorflow.md, right column): no Horovod call left in the training.

    horovodrun -np 2 python mwms_train_native.py --out DIR       # TF_CONFIG agreed over horovod-compat
    TF_CONFIG='{...}' python mwms_train_native.py --out DIR      # on each worker: TF_CONFIG given

Where ``TF_CONFIG`` comes from: a cluster manager that sets it (then this script needs nothing of
Horovod); otherwise, started by one of our launchers, ``--tf-config agree`` (the default) agrees
free ports over ``hvd.init()`` + ``allgather_object`` and ``--tf-config fixed --base-port P`` builds
it from the launcher's rank and size with fixed ports on 127.0.0.1 (no Horovod at all).  Outputs as
``mwms_train_horovod.py``'s, from the chief (worker 0).
"""
import argparse
import json
import os

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--batch-per-worker", type=int, default=16)
parser.add_argument("--base-lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=160)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--tf-config", choices=["agree", "fixed"], default="agree")
parser.add_argument("--base-port", type=int, default=12345)
args = parser.parse_args()

# TF_CONFIG must be in place before the strategy is created (and before any TensorFlow op runs).
if "TF_CONFIG" not in os.environ:
    if args.tf_config == "agree":   # started by horovodrun / TorchDistributor: agree free ports
        import horovod.tensorflow as hvd
        from horovod_compat.tensorflow.tf_config import agree_tf_config

        hvd.init()
        agree_tf_config()
    else:                           # fixed ports from the launcher's rank and size, one host
        from horovod_compat.tensorflow.tf_config import export, tf_config_for

        export(tf_config_for(base_port=args.base_port))

import tensorflow as tf  # noqa: E402

LEGACY_KERAS = tf.keras.__name__.startswith("tf_keras")   # tf-keras (TF_USE_LEGACY_KERAS=1)


def fix_keras3_multi_worker_fit():
    """Keras 3's ``model.fit`` under MWMS with more than one worker (keras-team/keras#20585, open
    in Keras 3.15) fails twice; both are fixed here, without changing what is computed:

    1. before the first step ("Attempt to convert a value (PerReplica ...)"): it builds the model
       from a batch that it ``strategy.reduce``s as a whole (x, y) tuple, which MWMS cannot; only
       the batch's shapes and dtypes are used, so build from this worker's own values instead;
    2. in the first step ("Invalid reduction dimension 0 for input with 0 dimensions"): it
       averages each scalar log over the replicas with ``strategy.reduce("MEAN", v, axis=0)``;
       the average over replicas is ``axis=None``.

    Nothing to do on tf-keras (``TF_USE_LEGACY_KERAS=1``)."""
    if tf.keras.__name__.startswith("tf_keras"):     # tf-keras: not affected
        return
    from keras.src.backend.tensorflow import trainer

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
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

    def multi_worker_reduce_per_replica(values, strategy, reduction):
        if (reduction in ("auto", "mean") and not isinstance(strategy, tf.distribute.TPUStrategy)
                and trainer._collective_all_reduce_multi_worker(strategy)):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return reduce_per_replica(values, strategy, reduction)

    trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = multi_worker_reduce_per_replica


fix_keras3_multi_worker_fit()
tf.config.threading.set_intra_op_parallelism_threads(1)
# MWMS: one worker per machine uses every local GPU (or one per GPU: CUDA_VISIBLE_DEVICES).
strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = strategy.cluster_resolver.task_id          # this worker's index in TF_CONFIG
replicas = strategy.num_replicas_in_sync           # workers x local devices (here 1 each)
is_chief = worker == 0
print(f"worker {worker}, {replicas} replicas: TF_CONFIG={os.environ['TF_CONFIG']}", flush=True)

# The data: the global batch; the strategy splits it across the workers.
rng = np.random.default_rng(0)
x = rng.standard_normal((args.samples, 8)).astype(np.float32)
y = (x @ rng.standard_normal((8, 4)) + 0.1 * rng.standard_normal((args.samples, 4))).astype(np.float32)
global_batch = args.batch_per_worker * replicas
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

# Workers may seed differently: variables created in the scope start as worker 0's.
tf.keras.utils.set_random_seed(args.seed + worker)
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input((8,)),
        tf.keras.layers.Dense(32, activation="tanh"),
        tf.keras.layers.Dense(4),
    ])
    # Same scaling rule, by the number of replicas.
    scaled_lr = args.base_lr * replicas
    opt = tf.keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9)
    model.compile(loss="mse", optimizer=opt, metrics=["mae"])   # gradients averaged by the strategy

callbacks = []
# Checkpoints: Keras 3's ModelCheckpoint writes a plain file from local values: the chief alone
# saves.  tf-keras's must run on every worker (saving is collective there; the others write to a
# temporary directory that it removes).
if is_chief or LEGACY_KERAS:
    os.makedirs(args.out, exist_ok=True)
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        os.path.join(args.out, "ckpt-{epoch}.weights.h5"), save_weights_only=True))

history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, verbose=2 if is_chief else 0)

os.makedirs(args.out, exist_ok=True)
np.savez(os.path.join(args.out, f"weights.rank{worker}.npz"), *model.get_weights())
if is_chief:
    np.savez(os.path.join(args.out, "weights.npz"), *model.get_weights())
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump({k: [float(v) for v in vs] for k, vs in history.history.items()}, f)
