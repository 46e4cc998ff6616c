"""Style: fine-tuning a saved model: rank 0 trained and saved a ``.keras`` file (Keras 3's format),
a later job loads it on every worker with ``hvd.load_model`` -- the optimizer comes back as a
Horovod ``DistributedOptimizer`` with its state (Adam's moments, ``iterations``) -- and goes on
training; the saved file must also load without Horovod (``tf.keras.models.load_model``).

Phase 1: ``hvd.DistributedOptimizer(Adam)``, ``model.fit``, ``if hvd.rank() == 0:
model.save(path)``; ``hvd.broadcast_object`` of the path, a barrier (``hvd.allreduce`` of a dummy,
the way pre-``barrier`` code waited). Phase 2: ``model = hvd.load_model(path)`` on every rank
(also once with ``custom_objects={'MyDense': MyDense}`` for a custom layer registered with
``@tf.keras.utils.register_keras_serializable``), ``model.fit`` again with
``BroadcastGlobalVariablesCallback(0)``; ``model.optimizer.iterations`` continued from phase 1.

Keras: 3
"""
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
from horovod.tensorflow import broadcast_object

hvd.init()
tf.keras.utils.set_random_seed(100 + hvd.rank())


@tf.keras.utils.register_keras_serializable(package='corpus')
class MyDense(tf.keras.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer='glorot_uniform',
                                 name='w')
        self.b = self.add_weight(shape=(self.units,), initializer='zeros', name='b')

    def call(self, inputs):
        return tf.matmul(inputs, self.w) + self.b

    def get_config(self):
        return {**super().get_config(), 'units': self.units}


rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(512, 6)).astype('float32')
y = np.sin(x[:, :1]) + 0.1 * x[:, 1:2]

workdir = broadcast_object(tempfile.mkdtemp(prefix='k09-', dir=os.environ.get('CORPUS_WORKDIR'))
                           if hvd.rank() == 0 else None, root_rank=0)
path = os.path.join(workdir, 'model.keras')

# ------------------------------------------------------------------ phase 1: train and save
model = tf.keras.Sequential([tf.keras.Input(shape=(6,)), MyDense(16, name='my_dense'),
                             tf.keras.layers.Activation('tanh'), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), loss='mse')
first = model.fit(x, y, batch_size=32, epochs=2, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
iterations_saved = int(model.optimizer.iterations.numpy())
if hvd.rank() == 0:
    model.save(path)
hvd.allreduce(tf.constant(0.0), name='barrier')  # wait for the file

# ------------------------------------------------------------------ the file without Horovod
plain = tf.keras.models.load_model(path)
assert type(plain.optimizer).__name__ == 'Adam', type(plain.optimizer)
assert int(plain.optimizer.iterations.numpy()) == iterations_saved

# ------------------------------------------------------------------ phase 2: load and go on
model = hvd.load_model(path)
assert isinstance(model.optimizer, tf.keras.optimizers.Adam), type(model.optimizer)
assert int(model.optimizer.iterations.numpy()) == iterations_saved
saved_moments = [v.numpy().copy() for v in plain.optimizer.variables]
loaded_moments = [v.numpy() for v in model.optimizer.variables]
assert all(np.array_equal(a, b) for a, b in zip(saved_moments, loaded_moments)), \
    'optimizer state not carried over'
second = model.fit(x, y, batch_size=32, epochs=2, verbose=0,
                   callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

# the same with custom_objects (projects pass their layers explicitly)
again = hvd.load_model(path, custom_objects={'MyDense': MyDense})
again.fit(x, y, batch_size=64, epochs=1, verbose=0)

# ---------------------------------------------------------------- checks
for label, m in (('load_model', model), ('custom_objects', again)):
    weights = np.concatenate([w.numpy().ravel() for w in m.trainable_weights])
    everyone = hvd.allgather(weights.reshape(1, -1)).numpy()
    # different data on each rank: equal weights mean the loaded optimizer averaged gradients
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'
iterations = int(model.optimizer.iterations.numpy())
assert iterations == 2 * iterations_saved, (iterations, iterations_saved)
losses = first.history['loss'] + second.history['loss']
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': [float(v) for v in losses],
                                  'iterations_saved': iterations_saved,
                                  'iterations': iterations, 'ranks_agree': True}))
hvd.allreduce(tf.constant(0.0), name='done')
if hvd.rank() == 0:
    shutil.rmtree(workdir, ignore_errors=True)
