"""An elastic Keras 2 program whose model builds on its first batch, for
test_elastic_keras_unbuilt.py (elastic horovodrun, tf-keras, a worker SIGKILLed mid-training).

Unlike Horovod's elastic Keras example it makes ``KerasState`` right after ``compile``, with no
``fit`` step first: every worker's ``Sequential`` has no weights until its first batch, and each
worker (the replacement too) draws its initial weights from its own seed. The job can end with
equal weights on every rank only if each sync gave every rank rank 0's weights: at the start, as
the first batch builds the models, and when the replacement joins with an unbuilt model.
"""
import json
import os
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

hvd.init()
tf.keras.utils.set_random_seed(os.getpid() % 10000)  # every worker its own initial weights
EPOCHS = 14

rng = np.random.RandomState(0)
x = rng.normal(size=(256, 5)).astype('float32')
y = (x @ np.linspace(-1, 1, 5, dtype='float32').reshape(5, 1)).astype('float32')

model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation='tanh'), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)), loss='mse')
state = hvd.elastic.KerasState(model, batch=0, epoch=0)


class Progress(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print(f'EPOCH {state.epoch} size {hvd.size()} loss {logs["loss"]:.5f}', flush=True)
        time.sleep(0.4 if hvd.size() == 2 else 2.0)  # time for a replacement to start and join


callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state), Progress()]


@hvd.elastic.run
def train(state):
    rank, size = hvd.rank(), hvd.size()
    model.fit(x[rank::size], y[rank::size], batch_size=16, epochs=EPOCHS - state.epoch,
              callbacks=callbacks, verbose=0)


train(state)
weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
everyone = hvd_tf.allgather_object(weights)
agree = all((w == everyone[0]).all() for w in everyone)
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'size': hvd.size(), 'epoch': state.epoch, 'ranks_agree': bool(agree),
                                  'loss': float(np.mean((model.predict(x, verbose=0) - y) ** 2))}),
          flush=True)
