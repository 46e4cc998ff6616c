"""Style: TensorFlow 2.0-2.3 era Keras code that turned eager execution off for speed
(``tf.compat.v1.disable_eager_execution()`` at the top), with ``import horovod.keras as hvd``:
Keras then builds a TF1 graph and runs it in its session, and Horovod's Keras helpers work
through that session -- ``hvd.broadcast(resume_from_epoch, 0, name=...)`` and
``hvd.allreduce(model.evaluate(...))`` return plain values, the callbacks
(``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``, ``LearningRateWarmupCallback``
with a momentum optimizer) read and set variables through ``keras.backend``;
``keras.optimizers.legacy.SGD(momentum=0.9)`` in ``hvd.DistributedOptimizer``;
``model.fit(x, y, ...)`` on NumPy arrays; ``ModelCheckpoint`` on rank 0; a second model that
accumulates 2 batches per step (``backward_passes_per_step=2``).

Keras: tf-keras (Keras 3 cannot train in a TF1 graph; ``keras.optimizers.legacy`` is Keras 2 API)
"""
import json
import os

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

from tensorflow import keras  # noqa: E402
import horovod.keras as hvd  # noqa: E402

hvd.init()
tf.compat.v1.set_random_seed(hvd.rank())  # different initial weights: the callback syncs them

workdir = os.environ.get('CORPUS_WORKDIR', '.')
checkpoint_format = os.path.join(workdir, 'v18-checkpoint-{epoch}.h5')

resume_from_epoch = 0
for try_epoch in range(3, 0, -1):
    if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
        resume_from_epoch = try_epoch
        break
# Horovod: broadcast resume_from_epoch from rank 0 (which will have checkpoints) to other ranks.
resume_from_epoch = hvd.broadcast(resume_from_epoch, 0, name='resume_from_epoch')
verbose = 1 if hvd.rank() == 0 else 0

rng = np.random.RandomState(hvd.rank())
x_train = rng.normal(size=(512, 8)).astype('float32')
y_train = keras.utils.to_categorical((x_train[:, 0] * x_train[:, 1] > 0).astype('int32'), 2)
x_test, y_test = x_train[:128], y_train[:128]

model = keras.Sequential([keras.layers.Dense(32, activation='relu', input_shape=(8,)),
                          keras.layers.Dense(32, activation='relu'),
                          keras.layers.Dense(2, activation='softmax')])
initial_lr = 0.02 * hvd.size()
opt = keras.optimizers.legacy.SGD(learning_rate=initial_lr, momentum=0.9)
opt = hvd.DistributedOptimizer(opt)
model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt, metrics=['accuracy'])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=2,
                                             verbose=verbose),
]
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))

history = model.fit(x_train, y_train, batch_size=32, callbacks=callbacks, epochs=3,
                    initial_epoch=resume_from_epoch, verbose=verbose,
                    validation_data=(x_test, y_test))
score = hvd.allreduce(model.evaluate(x_test, y_test, verbose=0))

# ---------------------------------------------------------------- checks
weights = np.concatenate([w.ravel() for w in model.get_weights()])
everyone = np.asarray(hvd.allgather(weights.reshape(1, -1), name='weights'))
assert (everyone == everyone[0]).all(), 'weights differ across ranks'
scores = np.asarray(hvd.allgather(np.asarray(score, dtype=np.float64).reshape(1, -1),
                                  name='scores'))
assert (scores == scores[0]).all(), f'averaged scores differ across ranks: {scores}'
lr = float(keras.backend.get_value(model.optimizer.lr))
assert abs(lr - initial_lr) < 1e-6, (lr, initial_lr)  # warmup ended at initial_lr
momentum = float(keras.backend.get_value(model.optimizer.momentum))
assert abs(momentum - 0.9) < 1e-6, momentum  # the correction was undone after each batch
losses = [float(v) for v in history.history['loss']]
assert losses[-1] < losses[0], losses

# Gradient accumulation, as a program short of memory does it: 2 batches per applied step. In a
# TF1 graph Keras runs only the update ops the optimizer returns, and initializes only its own
# variables.
small = keras.Sequential([keras.layers.Dense(2, activation='softmax', input_shape=(8,))])
small_opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(learning_rate=0.1),
                                     backward_passes_per_step=2)
small.compile(loss=keras.losses.categorical_crossentropy, optimizer=small_opt)
passes = small.fit(x_train, y_train, batch_size=64, epochs=2, verbose=0,
                   callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
passes_losses = [float(v) for v in passes.history['loss']]
passes_iterations = int(keras.backend.get_value(small_opt.iterations))
small_weights = np.concatenate([w.ravel() for w in small.get_weights()])
small_everyone = np.asarray(hvd.allgather(small_weights.reshape(1, -1), name='small_weights'))
assert (small_everyone == small_everyone[0]).all(), 'accumulated: weights differ across ranks'
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': losses, 'score': [float(s) for s in score],
                                  'passes_losses': passes_losses,
                                  'passes_iterations': passes_iterations,
                                  'resumed_at': int(resume_from_epoch), 'lr': lr,
                                  'momentum': momentum, 'ranks_agree': True,
                                  'checkpoints': sorted(f for f in os.listdir(workdir)
                                                        if f.startswith('v18-'))}))
    for f in os.listdir(workdir):
        if f.startswith('v18-checkpoint-'):
            os.remove(os.path.join(workdir, f))
