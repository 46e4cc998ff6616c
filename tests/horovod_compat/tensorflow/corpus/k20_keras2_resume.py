"""Style: a Keras 2 training script as it was written before Keras 3, kept running with
``TF_USE_LEGACY_KERAS=1``: a ``Sequential`` with no input shape (it builds on its first batch),
a sharded ``tf.data`` pipeline, ``fit`` with Horovod's broadcast and metric callbacks, Keras'
``ModelCheckpoint`` on rank 0 only, and the classic resume: rank 0 alone ``hvd.load_model``s the
last checkpoint while the other ranks build a fresh model, the epoch to resume from is broadcast,
and ``BroadcastGlobalVariablesCallback(0)`` hands rank 0's weights to the others.

Then rank 0 trains the same model alone, on the whole data set with the global batch, from its own
initial weights, through the same checkpoint and resume: both runs must end with the same weights
(each rank starts from weights of its own seed, so this holds only if every first step starts from
rank 0's weights).

Keras: tf-keras
"""
import json
import os

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

hvd.init()
WORKDIR = os.environ.get('CORPUS_WORKDIR', '.')
BATCH = 32  # per worker
FIRST_EPOCHS, ALL_EPOCHS = 3, 5

rng = np.random.RandomState(0)
x = rng.normal(size=(512, 8)).astype('float32')
y = (x @ np.linspace(-1, 1, 8, dtype='float32').reshape(8, 1) + 0.3).astype('float32')


def build_model(seed):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([
        tf.keras.layers.Dense(16, activation='relu'),
        tf.keras.layers.Dense(1),
    ])


def dataset(shards, index, batch):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.shard(shards, index).batch(batch)


def train(distributed, checkpoint_dir):
    size, rank = (hvd.size(), hvd.rank()) if distributed else (1, 0)
    model = build_model(100 + rank)
    opt = tf.keras.optimizers.Adam(learning_rate=0.002)
    if distributed:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss='mse', metrics=['mae'])
    callbacks = []
    if distributed:
        callbacks += [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                      hvd.callbacks.MetricAverageCallback()]
    if rank == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(checkpoint_dir, 'checkpoint-{epoch}.h5')))
    first = model.fit(dataset(size, rank, BATCH), epochs=FIRST_EPOCHS, callbacks=callbacks,
                      verbose=2 if rank == 0 and distributed else 0)

    # the job restarts: rank 0 resumes from its last checkpoint, the others start afresh
    resume_from = 0
    if rank == 0:
        resume_from = max(int(name.split('-')[1].split('.')[0])
                          for name in os.listdir(checkpoint_dir) if name.startswith('checkpoint-'))
    if distributed:
        # (Horovod's Keras ImageNet example: the epoch as a tensor, from rank 0)
        resume_from = int(hvd.broadcast(resume_from, 0, name='resume_from_epoch'))
    if rank == 0:
        path = os.path.join(checkpoint_dir, f'checkpoint-{resume_from}.h5')
        model = hvd.load_model(path) if distributed else tf.keras.models.load_model(path)
    else:
        model = build_model(100 + rank)
        model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.002)),
                      loss='mse', metrics=['mae'])
    callbacks = ([hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                  hvd.callbacks.MetricAverageCallback()] if distributed else [])
    second = model.fit(dataset(size, rank, BATCH), epochs=ALL_EPOCHS, initial_epoch=resume_from,
                       callbacks=callbacks, verbose=2 if rank == 0 and distributed else 0)
    losses = first.history['loss'] + second.history['loss']
    return model, resume_from, losses


ckpt_dir = os.path.join(WORKDIR, 'distributed')
os.makedirs(ckpt_dir, exist_ok=True)
model, resumed_at, losses = train(True, ckpt_dir)

# ---------------------------------------------------------------- checks
weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
everyone = hvd_tf.allgather_object(weights)
assert all((w == everyone[0]).all() for w in everyone), 'weights differ across ranks'
logged = hvd_tf.allgather_object(losses)
assert all(t == logged[0] for t in logged), 'averaged losses differ across ranks'
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    reference_dir = os.path.join(WORKDIR, 'reference')
    os.makedirs(reference_dir, exist_ok=True)
    # one process: the same script's calls, the whole data set, the global batch
    BATCH *= hvd.size()
    ref_model, ref_resumed_at, ref_losses = train(False, reference_dir)
    ref_weights = np.concatenate([w.reshape(-1) for w in ref_model.get_weights()])
    gap = float(np.max(np.abs(weights - ref_weights)))
    assert gap < 1e-5, f'distributed training differs from one process by {gap}'
    print('RESULT ' + json.dumps({
        'losses': [float(v) for v in losses], 'resumed_at': resumed_at,
        'reference_gap': gap, 'reference_resumed_at': ref_resumed_at,
        'checkpoints': sorted(os.listdir(ckpt_dir)),
        'optimizer': type(model.optimizer).__name__, 'ranks_agree': True}))
