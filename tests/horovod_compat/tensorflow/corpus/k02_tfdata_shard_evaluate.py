"""Style: a ``tf.data`` input pipeline sharded per worker, validation during ``fit``, then
``model.evaluate`` on each worker's shard of the test set with the score averaged by
``hvd.allreduce`` -- the way projects that read TFRecords/CSV write it.

``dataset.shard(hvd.size(), hvd.rank())`` before ``.repeat().shuffle().batch().prefetch()``;
``hvd.DistributedOptimizer(SGD(momentum=0.9), backward_passes_per_step=2,
average_aggregated_gradients=True)`` (gradient accumulation); ``LearningRateScheduleCallback``
with a callable multiplier; ``EarlyStopping`` after ``MetricAverageCallback`` (so every rank stops
at the same epoch); ``validation_data=`` + ``validation_steps=``; ``hvd.allreduce(score,
name='val_acc')`` of the evaluation results.

Keras: 3
"""
import hashlib
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()

NUM_SAMPLES = 2048
BATCH_SIZE = 32


def make_dataset(seed, n):
    """The same full data set on every worker (as if read from shared storage)."""
    rng = np.random.RandomState(seed)
    features = rng.normal(size=(n, 10)).astype(np.float32)
    labels = (features[:, 0] + 0.5 * features[:, 1] - features[:, 2] > 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


train_ds = (make_dataset(0, NUM_SAMPLES)
            .shard(hvd.size(), hvd.rank())       # Horovod: each worker its own shard
            .repeat()
            .shuffle(512, seed=hvd.rank())
            .batch(BATCH_SIZE)
            .prefetch(tf.data.AUTOTUNE))
val_ds = (make_dataset(1, 512)
          .shard(hvd.size(), hvd.rank())
          .batch(BATCH_SIZE)
          .repeat())

inputs = tf.keras.Input(shape=(10,))
hidden = tf.keras.layers.Dense(16, activation='relu')(inputs)
hidden = tf.keras.layers.BatchNormalization()(hidden)
outputs = tf.keras.layers.Dense(1, activation='sigmoid')(hidden)
model = tf.keras.Model(inputs, outputs)

base_lr = 0.05
opt = tf.keras.optimizers.SGD(learning_rate=base_lr * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=2,
                               average_aggregated_gradients=True)
model.compile(optimizer=opt, loss='binary_crossentropy',
              metrics=[tf.keras.metrics.BinaryAccuracy(name='acc'),
                       tf.keras.metrics.AUC(name='auc')])

steps_per_epoch = NUM_SAMPLES // BATCH_SIZE // hvd.size()
validation_steps = 512 // BATCH_SIZE // hvd.size()

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=base_lr * hvd.size(),
                                               multiplier=lambda epoch: 0.5 ** epoch,
                                               start_epoch=1),
    tf.keras.callbacks.EarlyStopping(monitor='val_loss', patience=1, min_delta=1e-3,
                                     restore_best_weights=False),
]

history = model.fit(train_ds, epochs=4, steps_per_epoch=steps_per_epoch,
                    validation_data=val_ds, validation_steps=validation_steps,
                    callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)

# Evaluate on this worker's shard, then average across workers.
score = model.evaluate(val_ds, steps=validation_steps, verbose=0)
val_loss = hvd.allreduce(score[0], name='val_loss')
val_acc = hvd.allreduce(score[1], name='val_acc')

# ---------------------------------------------------------------- checks
# trainable weights only: BatchNormalization's moving statistics are each worker's own (Horovod
# averages gradients, not the non-trainable statistics; that is what SyncBatchNormalization is for)
digest = hashlib.sha256(b''.join(w.numpy().tobytes() for w in model.trainable_weights)).hexdigest()
digests = hvd.allgather(tf.constant([int(digest[:12], 16)], dtype=tf.int64)).numpy().tolist()
assert len(set(digests)) == 1, f'weights differ across ranks: {digests}'
both = hvd.allgather(tf.reshape(tf.cast(val_acc, tf.float64), [1])).numpy()
assert both.min() == both.max(), f'averaged accuracy differs: {both}'
epochs_run = len(history.history['loss'])
all_epochs = hvd.allgather(tf.constant([epochs_run])).numpy().tolist()
assert len(set(all_epochs)) == 1, f'ranks stopped at different epochs: {all_epochs}'
losses = [float(v) for v in history.history['loss']]
# backward_passes_per_step=2: the optimizer applied every second batch; iterations counts all
iterations = int(model.optimizer.iterations.numpy())
assert iterations == epochs_run * steps_per_epoch, (iterations, epochs_run, steps_per_epoch)
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({
        'losses': losses, 'val_loss': float(val_loss), 'val_acc': float(val_acc),
        'epochs': epochs_run, 'iterations': iterations, 'ranks_agree': True,
        'lr': float(model.optimizer.learning_rate.numpy())}))
