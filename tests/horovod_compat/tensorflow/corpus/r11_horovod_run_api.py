"""Style: a driver script / notebook cell that launches training from Python with
``horovod.run(train_fn, args=..., np=2)`` -- the HorovodRunner / Databricks pattern: all imports
inside ``def train(...)`` (the function is pickled to the workers), ``hvd.init()`` there,
``import horovod.tensorflow.keras as hvd``, ``model.fit`` with a ``DistributedOptimizer``,
and a return value collected from every worker (``horovod.run`` returns one per rank).

Launch: python (``horovod.run`` starts its own workers; the script is not run under horovodrun)

Keras: 3
"""
import json
import sys


def train(learning_rate, epochs=3):
    import hashlib

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(400, 5)).astype('float32')
    y = (x[:, :1] * 2.0 - x[:, 1:2]).astype('float32')

    model = tf.keras.Sequential([tf.keras.Input(shape=(5,)), tf.keras.layers.Dense(8),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate * hvd.size())), loss='mse')
    history = model.fit(x, y, batch_size=20, epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    digest = hashlib.sha256(b''.join(w.tobytes() for w in model.get_weights())).hexdigest()
    return {'rank': hvd.rank(), 'size': hvd.size(), 'digest': digest,
            'losses': [float(v) for v in history.history['loss']]}


if __name__ == '__main__':
    import horovod

    results = horovod.run(train, args=(0.02,), kwargs={'epochs': 3}, np=2)
    assert [r['rank'] for r in results] == [0, 1], results
    assert all(r['size'] == 2 for r in results), results
    assert len({r['digest'] for r in results}) == 1, 'weights differ across ranks'
    assert results[0]['losses'] == results[1]['losses'], 'averaged losses differ across ranks'
    losses = results[0]['losses']
    assert losses[-1] < losses[0], losses
    print('RESULT ' + json.dumps({'losses': losses, 'ranks': len(results), 'ranks_agree': True}))
    sys.stdout.flush()
