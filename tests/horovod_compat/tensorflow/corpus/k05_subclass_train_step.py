"""Style: a subclassed ``tf.keras.Model`` that overrides ``train_step`` (GANs, contrastive and
multi-loss models in research code) and averages its gradients with
``tape = hvd.DistributedGradientTape(tape)`` instead of wrapping the optimizer.

``class Trainer(tf.keras.Model)`` with ``__init__`` building its layers, ``call``, a
``train_step`` that unpacks ``data``, computes the compiled loss (``self.compute_loss``) plus an
L2 term, wraps the tape, ``self.optimizer.apply_gradients(zip(...))``, updates its own
``keras.metrics.Mean`` trackers (listed in the ``metrics`` property) and returns a dict; a
``test_step`` for ``validation_data``; ``model.compile(optimizer=tf.keras.optimizers.RMSprop(...))``
(plain, not distributed) and ``BroadcastGlobalVariablesCallback(0)`` +
``MetricAverageCallback()``; an extra ``hvd.allreduce`` inside ``train_step`` of a per-batch
statistic (the gradient norm), reported as a metric.

Keras: 3
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras

hvd.init()
tf.keras.utils.set_random_seed(7 + hvd.rank())


class Trainer(tf.keras.Model):
    def __init__(self, hidden=32, l2=1e-4, **kwargs):
        super().__init__(**kwargs)
        self.l2 = l2
        self.body = tf.keras.layers.Dense(hidden, activation='relu')
        self.head = tf.keras.layers.Dense(1)
        self.loss_tracker = tf.keras.metrics.Mean(name='loss')
        self.mae_tracker = tf.keras.metrics.MeanAbsoluteError(name='mae')
        self.grad_norm_tracker = tf.keras.metrics.Mean(name='grad_norm')

    def call(self, inputs, training=False):
        return self.head(self.body(inputs))

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_tracker, self.grad_norm_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            loss += self.l2 * tf.add_n([tf.nn.l2_loss(w) for w in self.trainable_weights
                                        if 'kernel' in w.name])
        # Horovod: average the gradients over all workers.
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        # the averaged gradients are the same on every worker, so is their norm
        grad_norm = hvd.allreduce(tf.linalg.global_norm(grads), name='grad_norm')
        self.loss_tracker.update_state(loss)
        self.mae_tracker.update_state(y, y_pred)
        self.grad_norm_tracker.update_state(grad_norm)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(self.compute_loss(x=x, y=y, y_pred=y_pred))
        self.mae_tracker.update_state(y, y_pred)
        return {'loss': self.loss_tracker.result(), 'mae': self.mae_tracker.result()}


rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(768, 6)).astype('float32')
y = (x @ np.arange(1, 7, dtype='float32').reshape(6, 1) / 6.0 + 0.5).astype('float32')
x_val, y_val = x[:128], y[:128]

model = Trainer()
model.compile(optimizer=tf.keras.optimizers.RMSprop(learning_rate=0.002 * hvd.size()),
              loss='mse')
history = model.fit(x, y, batch_size=32, epochs=4, validation_data=(x_val, y_val),
                    callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd_keras.callbacks.MetricAverageCallback()],
                    verbose=2 if hvd.rank() == 0 else 0)

# ---------------------------------------------------------------- checks
weights = tf.concat([tf.reshape(w, [-1]) for w in model.trainable_weights], 0)
everyone = hvd.allgather(tf.reshape(weights, [1, -1])).numpy()
assert (everyone == everyone[0]).all(), 'weights differ across ranks'
opt_state = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1])
                       for v in model.optimizer.variables], 0)
everyone = hvd.allgather(tf.reshape(opt_state, [1, -1])).numpy()
assert (everyone == everyone[0]).all(), 'optimizer state differs across ranks'
logged = {k: [float(v) for v in vals] for k, vals in history.history.items()}
table = hvd.allgather_object(logged)
assert all(t == table[0] for t in table), 'averaged logs differ across ranks'
assert logged['loss'][-1] < logged['loss'][0], logged['loss']
assert logged['val_loss'][-1] < logged['val_loss'][0], logged['val_loss']
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': logged['loss'], 'val_losses': logged['val_loss'],
                                  'grad_norm': logged['grad_norm'][-1], 'ranks_agree': True}))
