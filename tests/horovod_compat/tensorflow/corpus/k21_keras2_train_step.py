"""Style: a Keras 2 subclassed model with its own ``train_step`` (the tf-keras 2.x default body:
``self.compiled_loss``, ``self.optimizer.minimize(loss, vars, tape=tape)``,
``self.compiled_metrics``), run with ``TF_USE_LEGACY_KERAS=1``: no input shape anywhere, a
sharded ``tf.data`` pipeline over data shuffled once, ``hvd.DistributedOptimizer`` around Keras 2's SGD with
momentum, Horovod's broadcast and metric callbacks, weights-only ``ModelCheckpoint`` on rank 0
(TensorFlow checkpoint files), and a resume in which rank 0 alone ``load_weights`` the last one
into a fresh, unbuilt model (tf-keras restores them when the model builds, on its first batch).

Then rank 0 trains the same model alone, on the whole data set with the global batch, from its own
initial weights, through the same checkpoint and resume: both runs must end with the same weights.

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
BATCH = 16  # per worker
LR = 0.01

rng = np.random.RandomState(1)
x = rng.normal(size=(256, 6)).astype('float32')
y = np.tanh(x[:, :2] - x[:, 2:4] * 0.5).astype('float32')
order = rng.permutation(len(x))  # shuffled once, the same order on every rank
x, y = x[order], y[order]


class Regressor(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(12, activation='tanh')
        self.out = tf.keras.layers.Dense(2)

    def call(self, inputs, training=False):
        return self.out(self.hidden(inputs))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        self.compiled_metrics.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def make(seed, distributed):
    tf.keras.utils.set_random_seed(seed)
    model = Regressor()
    opt = tf.keras.optimizers.SGD(learning_rate=LR, momentum=0.9)
    model.compile(optimizer=hvd.DistributedOptimizer(opt) if distributed else opt, loss='mse',
                  metrics=['mae'])
    return model


def dataset(shards, index, batch):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.shard(shards, index).batch(batch)


def train(distributed, checkpoint_dir):
    size, rank = (hvd.size(), hvd.rank()) if distributed else (1, 0)
    histories = []
    for phase, epochs in ((1, 3), (2, 5)):
        model = make(200 + rank, distributed)
        initial_epoch = 0
        if phase == 2:
            latest = tf.train.latest_checkpoint(checkpoint_dir) if rank == 0 else None
            initial_epoch = int(latest.rsplit('-', 1)[1]) if latest else 0
            if distributed:
                initial_epoch = int(hvd.broadcast(initial_epoch, 0, name='initial_epoch'))
            if rank == 0:
                model.load_weights(latest)  # restored when the model builds
        callbacks = []
        if distributed:
            callbacks += [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                          hvd.callbacks.MetricAverageCallback()]
        if rank == 0 and phase == 1:
            callbacks.append(tf.keras.callbacks.ModelCheckpoint(
                os.path.join(checkpoint_dir, 'ckpt-{epoch}'), save_weights_only=True))
        histories.append(model.fit(dataset(size, rank, BATCH), epochs=epochs,
                                   initial_epoch=initial_epoch, callbacks=callbacks, verbose=0))
    return model, initial_epoch, histories[0].history['loss'] + histories[1].history['loss']


ckpt_dir = os.path.join(WORKDIR, 'distributed')
os.makedirs(ckpt_dir, exist_ok=True)
model, resumed_at, losses = train(True, ckpt_dir)

# ---------------------------------------------------------------- checks
weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
everyone = hvd_tf.allgather_object(weights)
assert all((w == everyone[0]).all() for w in everyone), 'weights differ across ranks'
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    reference_dir = os.path.join(WORKDIR, 'reference')
    os.makedirs(reference_dir, exist_ok=True)
    BATCH *= hvd.size()
    ref_model, ref_resumed_at, _ = train(False, reference_dir)
    ref_weights = np.concatenate([w.reshape(-1) for w in ref_model.get_weights()])
    gap = float(np.max(np.abs(weights - ref_weights)))
    assert gap < 1e-5, f'distributed training differs from one process by {gap}'
    print('RESULT ' + json.dumps({
        'losses': [float(v) for v in losses], 'resumed_at': resumed_at,
        'reference_gap': gap, 'reference_resumed_at': ref_resumed_at,
        'checkpoints': sorted(n for n in os.listdir(ckpt_dir) if n.endswith('.index')),
        'lr': float(model.optimizer.learning_rate.numpy()), 'ranks_agree': True}))
