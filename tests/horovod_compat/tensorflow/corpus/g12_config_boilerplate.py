"""Style: the start-up boilerplate of production training scripts around ``import horovod.keras as
hvd``: thread pools sized from ``hvd.local_size()`` with ``tf.config.threading`` after
``hvd.init()``, ``CUDA_VISIBLE_DEVICES`` / ``tf.config.experimental.set_visible_devices`` from
``hvd.local_rank()`` (on a CPU-only host the GPU list is empty), soft device placement, a
``with tf.device('/cpu:0')`` model, the topology logged (``hvd.size(), hvd.local_size(),
hvd.cross_size()``, and ``is_homogeneous()`` from ``horovod.tensorflow``: ``horovod.keras`` has
none), a seed broadcast from rank 0 for the same initial weights everywhere, and
``horovod.keras``' value collectives on NumPy data (``hvd.allreduce(np_array)``,
``hvd.allgather``, ``hvd.broadcast``) -- ``horovod.keras``' ``allreduce`` averages by default.

Keras: 3
"""
import json
import multiprocessing
import os

import numpy as np
import tensorflow as tf
from tensorflow import keras
import horovod.keras as hvd
import horovod.tensorflow as hvd_tf

hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
os.environ.setdefault('CUDA_VISIBLE_DEVICES', str(hvd.local_rank()))
gpus = tf.config.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

# Horovod: split the host's cores between the local workers
cores = max(1, multiprocessing.cpu_count() // hvd.local_size())
tf.config.threading.set_intra_op_parallelism_threads(cores)
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.set_soft_device_placement(True)
assert tf.config.threading.get_intra_op_parallelism_threads() == cores

if hvd.rank() == 0:
    print(f'workers={hvd.size()} local={hvd.local_size()} cross={hvd.cross_size()} '
          f'homogeneous={hvd_tf.is_homogeneous()} gpus={len(gpus)} threads={cores}')

rng = np.random.RandomState(1000 + hvd.rank())
x = rng.uniform(-1, 1, size=(320, 3)).astype(np.float32)
y = (x ** 2).sum(axis=1, keepdims=True).astype(np.float32)

# normalisation statistics over ALL workers' data: allreduce of NumPy arrays
mean = hvd.allreduce(x.mean(axis=0), name='feature_mean')           # averaged (default)
count = hvd.allreduce(np.array([len(x)], dtype=np.int64), average=False, name='count')
gathered_counts = hvd.allgather(np.array([len(x)], dtype=np.int64), name='counts')
seed = hvd.broadcast(np.array(rng.randint(0, 10000)), 0, name='seed')
assert int(count[0]) == int(np.sum(gathered_counts)) == 320 * hvd.size()
x = (x - np.asarray(mean)).astype(np.float32)

with tf.device('/cpu:0'):
    tf.keras.utils.set_random_seed(int(seed))  # same init everywhere via the broadcast seed
    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(32, activation='relu'),
                              keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate=0.005 * hvd.size()))
model.compile(optimizer=opt, loss='mse')
history = model.fit(x, y, batch_size=32, epochs=4, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback(),
                               hvd.callbacks.LearningRateScheduleCallback(
                                   initial_lr=0.005 * hvd.size(), multiplier=0.5,
                                   start_epoch=2, staircase=False)])

# ---------------------------------------------------------------- checks
weights = np.concatenate([w.ravel() for w in model.get_weights()])
everyone = hvd.allgather(weights.reshape(1, -1), name='weights')
everyone = np.asarray(everyone)
assert (everyone == everyone[0]).all(), 'weights differ across ranks'
losses = [float(v) for v in history.history['loss']]
table = hvd_tf.allgather_object(losses)
assert all(t == table[0] for t in table), table
assert losses[-1] < losses[0], losses
lr = float(keras.backend.get_value(model.optimizer.learning_rate))
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': losses, 'lr': lr, 'threads': cores,
                                  'gpus': len(gpus), 'count': int(count[0]),
                                  'ranks_agree': True}))
