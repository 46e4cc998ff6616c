"""Style: a TensorFlow 2 custom training loop, as in most research repositories that use
``horovod.tensorflow`` directly.

A ``@tf.function`` ``training_step(images, labels, first_batch)`` that wraps the tape in
``hvd.DistributedGradientTape(tape)``, clips the averaged gradients with
``tf.clip_by_global_norm``, applies them with a plain Keras optimizer and, ``if first_batch:``,
broadcasts ``model.variables`` and ``opt.variables`` (Keras 3: a property) from rank 0 inside the
traced function; ``tf.keras.metrics.Mean`` / ``SparseCategoricalAccuracy`` per worker, averaged
with ``hvd.allreduce`` at the end of each epoch; a ``tf.train.Checkpoint`` written by rank 0;
``dataset.take(steps // hvd.size())``.

Keras: 3
"""
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()

gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

tf.random.set_seed(hvd.rank())  # different initial weights on purpose
rng = np.random.default_rng(42 + hvd.rank())
images = rng.random((2000, 8, 8, 1), dtype=np.float32)
labels = (images.mean(axis=(1, 2, 3)) * 10).astype(np.int64) % 4

dataset = tf.data.Dataset.from_tensor_slices((tf.cast(images, tf.float32), labels))
dataset = dataset.repeat().shuffle(1000).batch(64)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(8, 3, activation='relu'),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(4),
])
loss_object = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
# Horovod: adjust learning rate based on number of GPUs.
opt = tf.optimizers.Adam(0.001 * hvd.size())

train_loss = tf.keras.metrics.Mean(name='train_loss')
train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name='train_accuracy')

checkpoint_dir = os.environ.get('CORPUS_WORKDIR') or tempfile.mkdtemp(prefix='t03-')
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss_value = loss_object(labels, logits)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, model.trainable_variables)
    grads, _ = tf.clip_by_global_norm(grads, 5.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

    train_loss(loss_value)
    train_accuracy(labels, logits)
    return loss_value


steps_per_epoch = 120 // hvd.size()
epoch_losses = []
for epoch in range(3):
    train_loss.reset_state()
    train_accuracy.reset_state()
    for batch, (x, y) in enumerate(dataset.take(steps_per_epoch)):
        loss_value = training_step(x, y, epoch == 0 and batch == 0)
        if batch % 20 == 0 and hvd.rank() == 0:
            print('Epoch %d Step #%d\tLoss: %.6f' % (epoch, batch, loss_value))
    # Horovod: average the metrics over all workers.
    avg_loss = hvd.allreduce(train_loss.result(), name='avg_loss')
    avg_acc = hvd.allreduce(train_accuracy.result(), name='avg_acc')
    epoch_losses.append(float(avg_loss))
    if hvd.rank() == 0:
        print(f'epoch {epoch}: loss {float(avg_loss):.4f} accuracy {float(avg_acc):.4f}')
        # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting it.
        checkpoint.save(os.path.join(checkpoint_dir, 'ckpt'))

# ---------------------------------------------------------------- checks
flat = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], 0)
everyone = hvd.allgather(tf.reshape(flat, [1, -1])).numpy()
assert (everyone == everyone[0]).all(), 'weights differ across ranks'
opt_vars = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in opt.variables], 0)
everyone = hvd.allgather(tf.reshape(opt_vars, [1, -1])).numpy()
assert (everyone == everyone[0]).all(), 'optimizer state differs across ranks'
gathered = hvd.allgather(tf.constant([epoch_losses], dtype=tf.float64)).numpy()
assert (gathered == gathered[0]).all(), f'averaged loss differs across ranks: {gathered}'
assert epoch_losses[-1] < epoch_losses[0], epoch_losses
assert int(opt.iterations.numpy()) == 3 * steps_per_epoch
if hvd.rank() == 0:
    saved = tf.train.latest_checkpoint(checkpoint_dir)
    print('RESULT ' + json.dumps({'losses': epoch_losses, 'ranks_agree': True,
                                  'iterations': int(opt.iterations.numpy()),
                                  'checkpoint': os.path.basename(saved or '')}))
if not os.environ.get('CORPUS_WORKDIR'):
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
