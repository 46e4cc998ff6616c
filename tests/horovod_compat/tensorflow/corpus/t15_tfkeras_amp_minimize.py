"""Style: TensorFlow 2.4-2.15 code (NVIDIA DeepLearningExamples and projects derived from them)
with a subclassed model whose ``train_step`` does automatic mixed precision by hand:
``self.compiled_loss(y, y_pred, regularization_losses=self.losses)``,
``self.optimizer.get_scaled_loss(loss)``, ``hvd.DistributedGradientTape(tape,
compression=hvd.Compression.fp16)``, ``self.optimizer.get_unscaled_gradients(...)``,
``self.compiled_metrics.update_state(...)``; compiled with
``tf.keras.mixed_precision.LossScaleOptimizer(SGD(...))``.  Then a custom loop in the style of
Horovod's ``tensorflow2_mnist.py`` with a distributed Keras optimizer:
``opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(...))``,
``opt.minimize(loss, model.trainable_variables, tape=tape)``, and
``hvd.broadcast_variables(opt.variables(), root_rank=0)`` (a method).

Keras: tf-keras (``LossScaleOptimizer.get_scaled_loss``/``get_unscaled_gradients``,
``optimizer.minimize(..., tape=)``, ``keras.optimizers.legacy`` and ``opt.variables()`` on a
plain optimizer are Keras 2 API that Keras 3 rejects)
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras

hvd.init()
tf.keras.utils.set_random_seed(40 + hvd.rank())

rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(512, 16)).astype('float32')
y = (x[:, :4].sum(axis=1) > x[:, 4:8].sum(axis=1)).astype('int32')

# ------------------------------------------------------------------ part 1: AMP train_step
tf.keras.mixed_precision.set_global_policy('mixed_float16')


class AmpModel(tf.keras.Model):
    def train_step(self, data):
        features, labels = data
        with tf.GradientTape() as tape:
            logits = self(features, training=True)
            loss = self.compiled_loss(labels, logits, regularization_losses=self.losses)
            scaled_loss = self.optimizer.get_scaled_loss(loss)
        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
        scaled_gradients = tape.gradient(scaled_loss, self.trainable_variables)
        gradients = self.optimizer.get_unscaled_gradients(scaled_gradients)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.compiled_metrics.update_state(labels, logits)
        return {m.name: m.result() for m in self.metrics}


inputs = tf.keras.Input(shape=(16,))
h = tf.keras.layers.Dense(32, activation='relu',
                          kernel_regularizer=tf.keras.regularizers.l2(1e-4))(inputs)
outputs = tf.keras.layers.Dense(2, activation='softmax', dtype='float32')(h)
amp_model = AmpModel(inputs, outputs)
amp_model.compile(
    optimizer=tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1)),
    loss='sparse_categorical_crossentropy', metrics=['accuracy'])
amp_history = amp_model.fit(x, y, batch_size=32, epochs=3, verbose=0,
                            callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                                       hvd_keras.callbacks.MetricAverageCallback()])
tf.keras.mixed_precision.set_global_policy('float32')

# ------------------------------------------------------------------ part 2: minimize with a tape
model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation='relu'),
                             tf.keras.layers.Dense(2)])
loss_fn = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(0.001 * hvd.size()))
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(512).batch(32)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss_value = loss_fn(labels, probs)
    opt.minimize(loss_value, model.trainable_variables, tape=tape)
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss_value


loop_losses = []
for batch, (images, labels) in enumerate(dataset.take(80 // hvd.size())):
    loop_losses.append(float(training_step(images, labels, batch == 0)))

# ---------------------------------------------------------------- checks
for label, m in (('amp', amp_model), ('minimize', model)):
    flat = np.concatenate([w.ravel() for w in m.get_weights()])
    everyone = hvd.allgather(flat.reshape(1, -1)).numpy()
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'
opt_state = np.concatenate([np.ravel(v.numpy()) for v in opt.variables()])
everyone = hvd.allgather(opt_state.reshape(1, -1).astype(np.float64)).numpy()
assert (everyone == everyone[0]).all(), 'optimizer state differs across ranks'
amp_losses = [float(v) for v in amp_history.history['loss']]
table = hvd.allgather_object(amp_losses)
assert all(t == table[0] for t in table), table
assert amp_losses[-1] < amp_losses[0], amp_losses
first, last = np.mean(loop_losses[:5]), np.mean(loop_losses[-5:])
assert last < first, loop_losses
scale = float(amp_model.optimizer.loss_scale)
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'amp_losses': amp_losses, 'loss_scale': scale,
                                  'loop_first': float(first), 'loop_last': float(last),
                                  'iterations': int(opt.iterations.numpy()),
                                  'ranks_agree': True}))
