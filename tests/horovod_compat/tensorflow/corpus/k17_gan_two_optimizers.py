"""Style: a GAN written as a Keras ``Model`` subclass the way keras.io's Keras 3 DCGAN example
does (``import keras``, ``keras.ops``, noise from ``keras.random.normal(..., seed=
self.seed_generator)``), distributed with Horovod: ``compile(self, d_optimizer, g_optimizer,
loss_fn)`` overridden (calls ``super().compile()``), two ``hvd.DistributedOptimizer``s -- one per
network -- and a ``train_step`` with two tapes that calls each optimizer's ``apply_gradients``;
each worker draws its own noise; ``BroadcastGlobalVariablesCallback(0)`` syncs the two networks
(nested models); a callback written by the user decays both optimizers' rates at each epoch end
(``optimizer.learning_rate = ...``).

Keras: 3
"""
import json

import keras
import numpy as np
import tensorflow as tf
from keras import ops
import horovod.tensorflow.keras as hvd
from horovod.tensorflow import allgather_object

hvd.init()
keras.utils.set_random_seed(80 + hvd.rank())
LATENT = 4

# "real" data: points on a noisy circle, a different sample per worker
rng = np.random.default_rng(hvd.rank())
angles = rng.uniform(0, 2 * np.pi, size=512)
real = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype('float32')
real += 0.05 * rng.normal(size=real.shape).astype('float32')

discriminator = keras.Sequential([keras.Input(shape=(2,)),
                                  keras.layers.Dense(16),
                                  keras.layers.LeakyReLU(negative_slope=0.2),
                                  keras.layers.Dense(1)], name='discriminator')
generator = keras.Sequential([keras.Input(shape=(LATENT,)),
                              keras.layers.Dense(16, activation='relu'),
                              keras.layers.Dense(2)], name='generator')


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337 + hvd.rank())
        self.d_loss_tracker = keras.metrics.Mean(name='d_loss')
        self.g_loss_tracker = keras.metrics.Mean(name='g_loss')

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def call(self, z):
        return self.generator(z)

    def train_step(self, real_points):
        batch = ops.shape(real_points)[0]
        z = keras.random.normal(shape=(batch, self.latent_dim), seed=self.seed_generator)
        fake = self.generator(z)
        combined = ops.concatenate([fake, real_points], axis=0)
        labels = ops.concatenate([ops.ones((batch, 1)), ops.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        z = keras.random.normal(shape=(batch, self.latent_dim), seed=self.seed_generator)
        misleading = ops.zeros((batch, 1))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(misleading, self.discriminator(self.generator(z)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {'d_loss': self.d_loss_tracker.result(), 'g_loss': self.g_loss_tracker.result()}


class DecayBoth(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        for opt in (self.model.d_optimizer, self.model.g_optimizer):
            opt.learning_rate = float(opt.learning_rate.numpy()) * 0.5


gan = GAN(discriminator, generator, LATENT)
gan.compile(
    d_optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.002 * hvd.size(), beta_1=0.5)),
    g_optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.002 * hvd.size(), beta_1=0.5)),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
dataset = tf.data.Dataset.from_tensor_slices(real).shuffle(512).batch(32)
history = gan.fit(dataset, epochs=3, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.MetricAverageCallback(), DecayBoth()])

# ---------------------------------------------------------------- checks
for label, net in (('discriminator', discriminator), ('generator', generator)):
    flat = np.concatenate([w.numpy().ravel() for w in net.trainable_weights])
    everyone = hvd.allgather(flat.reshape(1, -1)).numpy()
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'
for label, opt in (('d', gan.d_optimizer), ('g', gan.g_optimizer)):
    lr = float(opt.learning_rate.numpy())
    assert abs(lr - 0.002 * hvd.size() * 0.125) < 1e-8, (label, lr)
    assert int(opt.iterations.numpy()) == 3 * 16, (label, int(opt.iterations.numpy()))
logs = {k: [float(v) for v in vals] for k, vals in history.history.items()}
table = allgather_object(logs)
assert all(t == table[0] for t in table), 'averaged logs differ across ranks'
samples = ops.convert_to_numpy(gan(keras.random.normal((256, LATENT), seed=1)))
radius = float(np.mean(np.linalg.norm(samples, axis=1)))
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'d_loss': logs['d_loss'], 'g_loss': logs['g_loss'],
                                  'sample_radius': radius, 'ranks_agree': True}))
