"""Style: configuration and bookkeeping through Horovod's object collectives, and uneven data per
worker finished with ``hvd.join()`` -- what recommender and NLP projects with ragged shards do.

Rank 0 parses the "command line" and ``hvd.broadcast_object(config, root_rank=0)`` sends the dict to
everyone (the others pass ``None``); each worker reads a shard of a different length (no
``drop_remainder``/``take`` to equalize them) and trains with a ``@tf.function`` step using
``hvd.DistributedGradientTape``; a worker that runs out of data calls ``hvd.join()`` while the
others go on (their allreduces complete without it); after the loop ``hvd.join()`` returns the
last rank to join, the weights are re-synced with ``hvd.broadcast_variables(..., root_rank=0)``,
and per-worker statistics are collected with ``hvd.allgather_object``; the validation metric is
averaged with ``hvd.allreduce(..., op=hvd.Average)`` and the counts summed with ``op=hvd.Sum``.

Keras: 3
"""
import json
import random

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()

if hvd.rank() == 0:
    # "argparse" on rank 0 only, e.g. a random search picked the hyper-parameters
    random.seed(5)
    config = {'lr': random.choice([0.05, 0.1]), 'hidden': 16, 'epochs': 2,
              'batch_size': 16, 'tags': ('corpus', 't07')}
else:
    config = None
config = hvd.broadcast_object(config, root_rank=0)
assert config['hidden'] == 16 and config['tags'] == ('corpus', 't07'), config

# uneven shards: rank r has 160 + 48 * r samples -> a different number of batches per worker
rng = np.random.default_rng(hvd.rank())
n = 160 + 48 * hvd.rank()
x = rng.normal(size=(n, 4)).astype(np.float32)
y = (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(config['batch_size'])

model = tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                             tf.keras.layers.Dense(config['hidden'], activation='tanh'),
                             tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(config['lr'])
hvd.broadcast_variables(model.variables, root_rank=0)  # model built: sync before training


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


steps = 0
losses = []
for epoch in range(config['epochs']):
    for xb, yb in dataset:
        losses.append(float(train_step(xb, yb)))
        steps += 1
    # Horovod: a worker that has no more batches joins; the others continue until they do too
    last_joined = int(hvd.join())
    hvd.broadcast_variables(model.variables, root_rank=0)

# ---------------------------------------------------------------- checks
stats = hvd.allgather_object({'rank': hvd.rank(), 'steps': steps, 'samples': n,
                              'last_loss': losses[-1]})
assert [s['rank'] for s in stats] == list(range(hvd.size())), stats
expected_steps = [config['epochs'] * -(-(160 + 48 * r) // config['batch_size'])
                  for r in range(hvd.size())]
assert [s['steps'] for s in stats] == expected_steps, (stats, expected_steps)
# the rank with the most data finishes last
assert last_joined == int(np.argmax(expected_steps)), last_joined

weights = np.concatenate([w.numpy().ravel() for w in model.trainable_weights])
everyone = hvd.allgather(weights.reshape(1, -1)).numpy()
assert (everyone == everyone[0]).all(), 'weights differ across ranks after the broadcast'

val_x = np.linspace(-1, 1, 32 * 4, dtype=np.float32).reshape(32, 4)
val_mse = tf.reduce_mean(tf.square(model(val_x) - val_x.sum(axis=1, keepdims=True) * 0.5))
avg_mse = hvd.allreduce(val_mse, op=hvd.Average, name='val_mse')
total_samples = hvd.allreduce(tf.constant(n, dtype=tf.int64), op=hvd.Sum, name='n')
assert int(total_samples) == sum(s['samples'] for s in stats)
assert float(avg_mse) == float(val_mse)  # the same model on every rank
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'config_lr': config['lr'], 'steps': [s['steps'] for s in stats],
                                  'last_joined': last_joined, 'val_mse': float(avg_mse),
                                  'first_loss': losses[0], 'last_loss': losses[-1],
                                  'total_samples': int(total_samples), 'ranks_agree': True}))
