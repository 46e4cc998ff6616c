"""A Horovod Keras training script as Horovod's documentation writes it (migration_guide/tensorflow.md,
left column); ``mwms_train_native.py`` is the same training on MultiWorkerMirroredStrategy.

    horovodrun -np 2 python mwms_train_horovod.py --out DIR      # 2 ranks
    python mwms_train_horovod.py --out DIR                       # 1 process

Deterministic (fixed seeds, SGD, synthetic data, no shuffling), so that the final weights can be
compared with the native script's and with one process on the global batch
(``test_mwms_migration.py``).  Rank 0 writes a checkpoint per epoch (``DIR/ckpt-EPOCH.weights.h5``)
and, at the end, ``DIR/weights.npz`` plus ``DIR/history.json``; every rank writes
``DIR/weights.rankN.npz``.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--batch-per-worker", type=int, default=16)
parser.add_argument("--base-lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=160)
parser.add_argument("--seed", type=int, default=7)
args = parser.parse_args()

# Horovod: initialize.
hvd.init()

# Horovod: pin one thread pool per rank (2 ranks on a 2-core machine); on GPUs pin GPU local_rank.
tf.config.threading.set_intra_op_parallelism_threads(1)
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# The data: every rank reads the same examples and keeps its shard.
rng = np.random.default_rng(0)
x = rng.standard_normal((args.samples, 8)).astype(np.float32)
y = (x @ rng.standard_normal((8, 4)) + 0.1 * rng.standard_normal((args.samples, 4))).astype(np.float32)
dataset = (tf.data.Dataset.from_tensor_slices((x, y))
           .shard(hvd.size(), hvd.rank())          # Horovod: rank r takes examples r, r+N, ...
           .batch(args.batch_per_worker))

# Ranks start from different weights on purpose: BroadcastGlobalVariablesCallback must fix that.
tf.keras.utils.set_random_seed(args.seed + hvd.rank())
model = tf.keras.Sequential([
    tf.keras.Input((8,)),
    tf.keras.layers.Dense(32, activation="tanh"),
    tf.keras.layers.Dense(4),
])

# Horovod: scale the learning rate by the number of workers.
scaled_lr = args.base_lr * hvd.size()
opt = tf.keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)
model.compile(loss="mse", optimizer=opt, metrics=["mae"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
]
# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    os.makedirs(args.out, exist_ok=True)
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        os.path.join(args.out, "ckpt-{epoch}.weights.h5"), save_weights_only=True))

# Horovod: write logs on worker 0 only.
verbose = 2 if hvd.rank() == 0 else 0
history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, verbose=verbose)

os.makedirs(args.out, exist_ok=True)
np.savez(os.path.join(args.out, f"weights.rank{hvd.rank()}.npz"), *model.get_weights())
if hvd.rank() == 0:
    np.savez(os.path.join(args.out, "weights.npz"), *model.get_weights())
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump({k: [float(v) for v in vs] for k, vs in history.history.items()}, f)
