"""Style: a detection/segmentation-style convolutional model whose per-worker batches are small,
so the project swaps ``tf.keras.layers.BatchNormalization`` for ``hvd.SyncBatchNormalization``
(statistics over the whole job's batch) -- with ``momentum=``/``epsilon=`` arguments, inside a
functional model with a residual block, trained by ``model.fit`` with a
``DistributedOptimizer`` and ``BroadcastGlobalVariablesCallback``.

With synchronized statistics the moving mean and variance must come out identical on every
worker (plain batch normalization would give each worker its own).

Keras: 3
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

hvd.init()
tf.keras.utils.set_random_seed(60 + hvd.rank())

rng = np.random.default_rng(hvd.rank())
images = rng.random((192, 12, 12, 3), dtype=np.float32) + hvd.rank()  # shifted per worker
masks = (images.mean(axis=-1, keepdims=True) > 0.5 + hvd.rank()).astype(np.float32)


def conv_bn(x, filters):
    x = tf.keras.layers.Conv2D(filters, 3, padding='same', use_bias=False)(x)
    x = hvd_tf.SyncBatchNormalization(momentum=0.9, epsilon=1e-3)(x)
    return tf.keras.layers.ReLU()(x)


inputs = tf.keras.Input(shape=(12, 12, 3))
x = conv_bn(inputs, 8)
shortcut = x
x = conv_bn(x, 8)
x = tf.keras.layers.Add()([x, shortcut])
outputs = tf.keras.layers.Conv2D(1, 1, activation='sigmoid')(x)
model = tf.keras.Model(inputs, outputs)

model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)),
              loss='binary_crossentropy')
history = model.fit(images, masks, batch_size=8, epochs=2, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

# ---------------------------------------------------------------- checks
bn_layers = [layer for layer in model.layers if isinstance(layer, hvd_tf.SyncBatchNormalization)]
assert len(bn_layers) == 2
stats = np.concatenate([np.ravel(v.numpy()) for layer in bn_layers
                        for v in (layer.moving_mean, layer.moving_variance)])
everyone = hvd.allgather(stats.reshape(1, -1)).numpy()
assert np.allclose(everyone, everyone[0], rtol=1e-5, atol=1e-6), \
    'moving statistics differ across ranks'
flat = np.concatenate([w.ravel() for w in model.get_weights()])
gathered = hvd.allgather(flat.reshape(1, -1)).numpy()
assert np.allclose(gathered, gathered[0], rtol=1e-5, atol=1e-6), 'weights differ across ranks'
losses = [float(v) for v in history.history['loss']]
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': losses, 'moving_mean_0': float(stats[0]),
                                  'ranks_agree': True}))
