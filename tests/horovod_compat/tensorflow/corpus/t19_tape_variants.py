"""Style: the less tidy ``GradientTape`` code of research repositories, with Horovod added to it:

* the wrap indented inside the ``with`` block (``with tf.GradientTape() as tape: ...;
  tape = hvd.DistributedGradientTape(tape)``), eagerly and in a ``tf.function``;
* a persistent tape for a multi-task model: two ``tape.gradient`` calls (one per head's loss)
  on one ``DistributedGradientTape``, then ``del tape``;
* ``tf.GradientTape(watch_accessed_variables=False)`` with ``tape.watch(...)`` of the variables
  to train (a frozen backbone);
* a WGAN-GP style gradient penalty: an inner plain tape takes the critic's gradient with respect
  to its interpolated input, the outer tape is distributed.

Keras: 3
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
tf.keras.utils.set_random_seed(90 + hvd.rank())
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(256, 6)).astype('float32')
y_a = x[:, :1] * 2.0
y_b = (x[:, 1:2] > 0).astype('float32')
dataset = tf.data.Dataset.from_tensor_slices((x, y_a, y_b)).batch(32)

backbone = tf.keras.Sequential([tf.keras.Input(shape=(6,)), tf.keras.layers.Dense(16, 'relu')])
head_a = tf.keras.Sequential([tf.keras.Input(shape=(16,)), tf.keras.layers.Dense(1)])
head_b = tf.keras.Sequential([tf.keras.Input(shape=(16,)), tf.keras.layers.Dense(1)])
critic = tf.keras.Sequential([tf.keras.Input(shape=(6,)), tf.keras.layers.Dense(8, 'tanh'),
                              tf.keras.layers.Dense(1)])
everything = [backbone, head_a, head_b, critic]
opt = tf.keras.optimizers.SGD(0.05)
opt.build([v for net in everything for v in net.trainable_variables])  # Keras 3: all it will train
for net in everything:
    hvd.broadcast_variables(net.variables, root_rank=0)
mse = tf.keras.losses.MeanSquaredError()
bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def wrapped_inside(xb, ya):
    """The wrap inside the with block (the tape is still recording there)."""
    with tf.GradientTape() as tape:
        loss = mse(ya, head_a(backbone(xb)))
        tape = hvd.DistributedGradientTape(tape)
    variables = backbone.trainable_variables + head_a.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss


wrapped_inside_fn = tf.function(wrapped_inside)


@tf.function
def multitask(xb, ya, yb):
    with tf.GradientTape(persistent=True) as tape:
        features = backbone(xb)
        loss_a = mse(ya, head_a(features))
        loss_b = bce(yb, head_b(features))
    tape = hvd.DistributedGradientTape(tape)
    grads_a = tape.gradient(loss_a, head_a.trainable_variables)
    grads_b = tape.gradient(loss_b, head_b.trainable_variables + backbone.trainable_variables)
    del tape
    opt.apply_gradients(zip(grads_a, head_a.trainable_variables))
    opt.apply_gradients(zip(grads_b, head_b.trainable_variables + backbone.trainable_variables))
    return loss_a + loss_b


@tf.function
def heads_only(xb, ya, yb):
    heads = head_a.trainable_variables + head_b.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch([v.value for v in heads])  # Keras 3: watch the tf.Variable each one holds
        features = backbone(xb)  # frozen: not watched
        loss = mse(ya, head_a(features)) + bce(yb, head_b(features))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, heads + backbone.trainable_variables)
    assert all(g is None for g in grads[len(heads):])  # (trace time) unwatched: no gradient
    opt.apply_gradients(zip(grads[:len(heads)], heads))
    return loss


@tf.function
def gradient_penalty_step(real):
    fake = tf.random.normal(tf.shape(real))
    alpha = tf.random.uniform([tf.shape(real)[0], 1])
    interpolated = alpha * real + (1.0 - alpha) * fake
    with tf.GradientTape() as tape:
        with tf.GradientTape() as gp_tape:
            gp_tape.watch(interpolated)
            score = critic(interpolated)
        slopes = tf.norm(gp_tape.gradient(score, interpolated), axis=1)
        penalty = tf.reduce_mean(tf.square(slopes - 1.0))
        loss = tf.reduce_mean(critic(fake)) - tf.reduce_mean(critic(real)) + 10.0 * penalty
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, critic.trainable_variables)
    opt.apply_gradients(zip(grads, critic.trainable_variables))
    return penalty


history = {'eager': [], 'fn': [], 'multitask': [], 'heads': [], 'penalty': []}
for epoch in range(2):
    for xb, ya, yb in dataset:
        history['eager'].append(float(wrapped_inside(xb, ya)))
        history['fn'].append(float(wrapped_inside_fn(xb, ya)))
        history['multitask'].append(float(multitask(xb, ya, yb)))
        history['heads'].append(float(heads_only(xb, ya, yb)))
        history['penalty'].append(float(gradient_penalty_step(xb)))

# ---------------------------------------------------------------- checks
for i, net in enumerate(everything):
    flat = tf.concat([tf.reshape(w, [-1]) for w in net.trainable_variables], 0)
    gathered = hvd.allgather(tf.reshape(flat, [1, -1])).numpy()
    assert (gathered == gathered[0]).all(), f'network {i}: weights differ across ranks'
summary = {k: [float(np.mean(v[:4])), float(np.mean(v[-4:]))] for k, v in history.items()}
for k in ('eager', 'fn', 'multitask', 'heads'):
    assert summary[k][1] < summary[k][0], (k, summary[k])
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({**summary, 'ranks_agree': True}))
