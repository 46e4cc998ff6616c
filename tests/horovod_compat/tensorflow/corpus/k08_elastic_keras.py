"""Style: an elastic Keras script (``hvd.elastic.KerasState`` and its callbacks) as written for
``horovodrun --min-np/--max-np`` -- launched here with a fixed ``-np 2``, where the same script must
simply train (real jobs are started both ways).

``state = hvd.elastic.KerasState(model, batch=0, epoch=0)``; ``state.register_reset_callbacks(
[on_state_reset])`` rescaling the learning rate by ``hvd.size()``; ``@hvd.elastic.run def
train(state)`` calling ``model.fit(..., initial_epoch=state.epoch, steps_per_epoch=...)`` with
``CommitStateCallback(state, batches_per_commit=...)``, ``UpdateBatchStateCallback(state)``,
``UpdateEpochStateCallback(state)``, ``MetricAverageCallback``; plus a second, custom-loop
elastic part with ``hvd.elastic.TensorFlowKerasState(model, optimizer, step=0)`` and
``state.commit()`` every few steps.

Keras: 3
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
tf.keras.utils.set_random_seed(3 + hvd.rank())

rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(600, 8)).astype('float32')
y = (x @ np.full((8, 1), 0.25, dtype='float32')).astype('float32')
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(256).batch(24)

base_lr = 0.01
model = tf.keras.Sequential([tf.keras.Input(shape=(8,)),
                             tf.keras.layers.Dense(16, activation='relu'),
                             tf.keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(base_lr * hvd.size()))
model.compile(loss='mse', optimizer=opt, experimental_run_tf_function=False)


def on_state_reset():
    # the number of workers changed: rescale the learning rate
    tf.keras.backend.set_value(state.model.optimizer.learning_rate, base_lr * hvd.size())


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])

callbacks = [
    hvd.callbacks.MetricAverageCallback(),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=5),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.UpdateEpochStateCallback(state),
]


@hvd.elastic.run
def train(state):
    history = state.model.fit(dataset, steps_per_epoch=20, epochs=4 - state.epoch,
                              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    return history.history['loss']


losses = train(state)
assert state.epoch == 4, state.epoch
assert state.batch == 0, state.batch

# ---------------------------------------------------------------- custom-loop elastic part
import horovod.tensorflow as hvd_tf  # noqa: E402

loop_model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(1)])
loop_opt = tf.keras.optimizers.SGD(0.05)
loop_model(x[:1])
loop_state = hvd_tf.elastic.TensorFlowKerasState(loop_model, loop_opt, step=0)


@tf.function
def loop_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(loop_model(xb) - yb))
    tape = hvd_tf.DistributedGradientTape(tape)
    grads = tape.gradient(loss, loop_model.trainable_variables)
    loop_opt.apply_gradients(zip(grads, loop_model.trainable_variables))
    return loss


@hvd_tf.elastic.run
def loop_train(state):
    loss = None
    for xb, yb in dataset.skip(state.step).take(30 - state.step):
        loss = float(loop_step(xb, yb))
        state.step += 1
        if state.step % 10 == 0:
            state.commit()
    return loss


loop_loss = loop_train(loop_state)
assert loop_state.step == 30, loop_state.step

# ---------------------------------------------------------------- checks
for label, m in (('fit', model), ('loop', loop_model)):
    weights = np.concatenate([w.numpy().ravel() for w in m.trainable_weights])
    everyone = hvd.allgather(weights.reshape(1, -1)).numpy()
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'
table = hvd_tf.allgather_object([float(v) for v in losses])
assert all(t == table[0] for t in table), f'averaged losses differ: {table}'
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'losses': [float(v) for v in losses], 'epoch': state.epoch,
                                  'loop_loss': loop_loss, 'loop_steps': loop_state.step,
                                  'ranks_agree': True}))
