"""Style: mixed-precision training as NVIDIA's and cloud vendors' TensorFlow recipes write it with
Horovod: ``tf.keras.mixed_precision.set_global_policy('mixed_float16')``, a float32 output layer,
gradients sent as float16 (``compression=hvd.Compression.fp16``), and the loss scaling done three
ways that all occur in the wild:

1. ``model.compile`` given ``hvd.DistributedOptimizer(Adam, compression=fp16)``: Keras 3 wraps it
   in a ``LossScaleOptimizer`` itself (the policy is mixed);
2. ``tf.keras.mixed_precision.LossScaleOptimizer(hvd.DistributedOptimizer(SGD))`` -- the scale
   outside, what Horovod's docs suggest for custom loops;
3. ``hvd.DistributedOptimizer(tf.keras.mixed_precision.LossScaleOptimizer(Adam))`` -- the scale
   inside, what projects that add Horovod to an existing AMP script end up with;

each used by ``model.fit`` with ``BroadcastGlobalVariablesCallback(0)``.  (A custom loop with
``opt.scale_loss`` / ``DistributedGradientTape(compression=fp16)`` is variant 4.)  One worker's
shard holds a batch of outliers whose float16 gradients overflow on that worker only (what a bad
record does): every worker must still skip that step together and keep the same loss scale.

Keras: 3
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
from horovod.tensorflow import allgather_object

hvd.init()
tf.keras.mixed_precision.set_global_policy('mixed_float16')
tf.keras.utils.set_random_seed(11 + hvd.rank())

rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(512, 20)).astype('float32')
y = (x[:, :5].sum(axis=1) > 0).astype('int32')
if hvd.rank() == 1:
    x[96:128] *= 50.0  # batch 3 of this shard: its scaled float16 gradients overflow


def build():
    inputs = tf.keras.Input(shape=(20,))
    h = tf.keras.layers.Dense(64, activation='relu')(inputs)
    h = tf.keras.layers.Dense(2)(h)
    # the last activation in float32, as the mixed precision guide says
    outputs = tf.keras.layers.Activation('softmax', dtype='float32')(h)
    return tf.keras.Model(inputs, outputs)


def scale_of(opt):
    """The loss scale optimizer's dynamic scale, wherever it sits."""
    while not hasattr(opt, 'dynamic_scale'):
        opt = opt.inner_optimizer
    return float(opt.dynamic_scale.numpy())


def check_and_summarize(model, losses, label, opt=None):
    assert model.layers[1].compute_dtype == 'float16', model.layers[1].compute_dtype
    opt = opt if opt is not None else model.optimizer
    state = [int(opt.iterations.numpy()), scale_of(opt)]
    states = allgather_object(state)
    # a step skipped for overflow is skipped by every worker: same count, same scale
    assert all(s == states[0] for s in states), f'{label}: iterations/loss scale differ: {states}'
    assert state[1] < 32768.0, f'{label}: no overflow happened: {state}'
    weights = np.concatenate([w.numpy().ravel() for w in model.trainable_weights])
    everyone = hvd.allgather(weights.reshape(1, -1)).numpy()
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'
    assert np.isfinite(weights).all(), f'{label}: non-finite weights'
    assert losses[-1] < losses[0], (label, losses)
    return {'losses': [float(v) for v in losses], 'iterations': state[0], 'loss_scale': state[1]}


def fit(opt, label):
    model = build()
    model.compile(optimizer=opt, loss='sparse_categorical_crossentropy', metrics=['accuracy'])
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return check_and_summarize(model, history.history['loss'], label)


results = {}
# 1. Keras adds the loss scaling itself
results['compile_wraps'] = fit(
    hvd.DistributedOptimizer(tf.keras.optimizers.Adam(1e-3 * hvd.size()),
                             compression=hvd.Compression.fp16), 'compile_wraps')
# 2. loss scaling outside Horovod's optimizer
results['scale_outside'] = fit(
    tf.keras.mixed_precision.LossScaleOptimizer(
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05 * hvd.size()),
                                 compression=hvd.Compression.fp16)), 'scale_outside')
# 3. loss scaling inside Horovod's optimizer
results['scale_inside'] = fit(
    hvd.DistributedOptimizer(
        tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(1e-3 * hvd.size())),
        compression=hvd.Compression.fp16), 'scale_inside')

# 4. a custom loop: scale the loss, DistributedGradientTape with fp16 compression
import horovod.tensorflow as hvd_tf  # noqa: E402

model = build()
opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam(1e-3 * hvd.size()))
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)


@tf.function
def step(xb, yb, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
        scaled = opt.scale_loss(loss)
    tape = hvd_tf.DistributedGradientTape(tape, compression=hvd_tf.Compression.fp16)
    grads = tape.gradient(scaled, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))  # unscales, skips non-finite
    if first_batch:
        hvd_tf.broadcast_variables(model.variables, root_rank=0)
        hvd_tf.broadcast_variables(opt.variables, root_rank=0)
    return loss


losses = []
for epoch in range(3):
    total = []
    for i, (xb, yb) in enumerate(dataset):
        total.append(float(step(xb, yb, epoch == 0 and i == 0)))
    losses.append(float(np.mean(total)))
results['custom_loop'] = check_and_summarize(model, losses, 'custom_loop', opt)

if hvd.rank() == 0:
    print('RESULT ' + json.dumps({**results, 'ranks_agree': True}))
