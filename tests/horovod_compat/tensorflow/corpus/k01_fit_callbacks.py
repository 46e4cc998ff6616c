"""Style: the canonical Keras ``model.fit`` script of Horovod-era blog posts and projects.

``import horovod.tensorflow.keras as hvd``; GPU pinning boilerplate; learning rate scaled by
``hvd.size()``; ``hvd.DistributedOptimizer(tf.keras.optimizers.Adam(...))``;
``compile(..., experimental_run_tf_function=False)``; callbacks
``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback()``,
``LearningRateWarmupCallback(..., verbose=1)``, a ``ReduceLROnPlateau`` after them,
``ModelCheckpoint`` and ``TensorBoard`` on rank 0 only; ``verbose=1 if hvd.rank() == 0 else 0``;
``steps_per_epoch=... // hvd.size()`` over a repeated ``tf.data`` pipeline fed from NumPy.

Keras: 3
"""
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

# every rank its own random init (the broadcast must make them equal) and its own data
tf.random.set_seed(1234 + hvd.rank())
rng = np.random.RandomState(hvd.rank())
x_train = rng.rand(1024, 16).astype('float32')
w_true = np.linspace(-1, 1, 16 * 4).reshape(16, 4).astype('float32')
y_train = np.argmax(x_train @ w_true, axis=1).astype('int64')

dataset = tf.data.Dataset.from_tensor_slices((tf.cast(x_train, tf.float32),
                                              tf.cast(y_train, tf.int64)))
dataset = dataset.repeat().shuffle(1000).batch(32)

model = tf.keras.Sequential([
    tf.keras.layers.Dense(32, activation='relu', input_shape=(16,)),
    tf.keras.layers.Dropout(0.1),
    tf.keras.layers.Dense(4, activation='softmax'),
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.002 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
              optimizer=opt,
              metrics=['accuracy'],
              experimental_run_tf_function=False)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),

    tf.keras.callbacks.ReduceLROnPlateau(monitor='loss', patience=10, verbose=0),
]

ckpt_dir = os.environ.get('CORPUS_WORKDIR') or tempfile.mkdtemp(prefix='k01-')
# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        os.path.join(ckpt_dir, 'checkpoint-{epoch}.keras')))
    callbacks.append(tf.keras.callbacks.TensorBoard(os.path.join(ckpt_dir, 'logs')))

verbose = 1 if hvd.rank() == 0 else 0

history = model.fit(dataset, steps_per_epoch=256 // hvd.size(), callbacks=callbacks, epochs=3,
                    verbose=verbose)

# ---------------------------------------------------------------- checks
digest = hashlib.sha256(b''.join(w.tobytes() for w in model.get_weights())).hexdigest()
digests = hvd.allgather(tf.constant([int(digest[:12], 16)], dtype=tf.int64)).numpy().tolist()
assert len(set(digests)) == 1, f'weights differ across ranks: {digests}'
losses = [float(v) for v in history.history['loss']]
# MetricAverageCallback: the logged (averaged) loss is the same on every rank
gathered = hvd.allgather(tf.constant(losses, dtype=tf.float64)).numpy().reshape(hvd.size(), -1)
assert np.all(gathered == gathered[0]), f'averaged metrics differ across ranks: {gathered}'
final_lr = float(tf.keras.backend.get_value(model.optimizer.learning_rate))
assert abs(final_lr - scaled_lr) < 1e-6, (final_lr, scaled_lr)  # warmup ended at initial_lr
assert losses[-1] < losses[0], losses
checkpoints = sorted(f for f in os.listdir(ckpt_dir) if f.endswith('.keras')) \
    if os.path.isdir(ckpt_dir) else []
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({
        'losses': losses, 'accuracy': history.history['accuracy'][-1], 'lr': final_lr,
        'ranks_agree': True, 'checkpoints': checkpoints}))
if not os.environ.get('CORPUS_WORKDIR'):
    shutil.rmtree(ckpt_dir, ignore_errors=True)
