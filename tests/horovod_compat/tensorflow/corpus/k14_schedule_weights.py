"""Style: a newer Keras 3 project that adopted Horovod: a ``LearningRateSchedule`` (the initial
rate scaled by ``hvd.size()``) in ``AdamW`` with ``weight_decay`` and ``clipnorm``, wrapped in
``hvd.DistributedOptimizer``; ``compile(steps_per_execution=4)`` (several steps per traced call,
a ``tf.while_loop``); ``validation_split=``; ``class_weight=``; ``model.save_weights`` on rank 0 to
``*.weights.h5`` and ``model.load_weights`` on every rank; then a debugging re-run with
``compile(run_eagerly=True)`` that continues from the loaded weights.

Keras: 3
"""
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
from horovod.tensorflow import allgather_object, broadcast_object

hvd.init()
tf.keras.utils.set_random_seed(21 + hvd.rank())

rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(640, 12)).astype('float32')
y = (x[:, 0] - x[:, 1] + 0.3 * rng.normal(size=640) > 0.8).astype('int32')  # imbalanced

schedule = tf.keras.optimizers.schedules.ExponentialDecay(
    initial_learning_rate=0.003 * hvd.size(), decay_steps=20, decay_rate=0.9, staircase=True)
opt = tf.keras.optimizers.AdamW(learning_rate=schedule, weight_decay=1e-4, clipnorm=1.0)
opt = hvd.DistributedOptimizer(opt)


def build():
    return tf.keras.Sequential([tf.keras.Input(shape=(12,)),
                                tf.keras.layers.Dense(24, activation='gelu'),
                                tf.keras.layers.Dense(1, activation='sigmoid')])


model = build()
model.compile(optimizer=opt, loss='binary_crossentropy',
              metrics=[tf.keras.metrics.Precision(name='precision'),
                       tf.keras.metrics.Recall(name='recall')],
              steps_per_execution=4)
weights = {0: 1.0, 1: float((y == 0).sum() / max(1, (y == 1).sum()))}
history = model.fit(x, y, batch_size=32, epochs=3, validation_split=0.2, class_weight=weights,
                    verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                          hvd.callbacks.MetricAverageCallback()])

workdir = broadcast_object(tempfile.mkdtemp(prefix='k14-', dir=os.environ.get('CORPUS_WORKDIR'))
                           if hvd.rank() == 0 else None)
path = os.path.join(workdir, 'model.weights.h5')
if hvd.rank() == 0:
    model.save_weights(path)
hvd.allreduce(tf.constant(0), name='saved')

fresh = build()
fresh.load_weights(path)
assert all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))
fresh.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size())),
              loss='binary_crossentropy', run_eagerly=True)
debug = fresh.fit(x[:128], y[:128], batch_size=32, epochs=1, verbose=0)

# ---------------------------------------------------------------- checks
for label, m in (('fit', model), ('eager', fresh)):
    flat = np.concatenate([w.ravel() for w in m.get_weights()])
    everyone = hvd.allgather(flat.reshape(1, -1)).numpy()
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'
iterations = int(model.optimizer.iterations.numpy())
steps = int(np.ceil(512 / 32)) * 3
assert iterations == steps, (iterations, steps)
lr_now = float(model.optimizer.learning_rate.numpy())
expected_lr = 0.003 * hvd.size() * 0.9 ** (steps // 20)
assert abs(lr_now - expected_lr) < 1e-7, (lr_now, expected_lr)
logs = {k: [float(v) for v in vals] for k, vals in history.history.items()}
table = allgather_object(logs)
assert all(t == table[0] for t in table), 'averaged logs differ across ranks'
assert logs['loss'][-1] < logs['loss'][0], logs['loss']
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': logs['loss'], 'val_losses': logs['val_loss'],
                                  'iterations': iterations, 'lr': lr_now,
                                  'eager_loss': float(debug.history['loss'][-1]),
                                  'ranks_agree': True}))
hvd.allreduce(tf.constant(0), name='done')
if hvd.rank() == 0:
    shutil.rmtree(workdir, ignore_errors=True)
