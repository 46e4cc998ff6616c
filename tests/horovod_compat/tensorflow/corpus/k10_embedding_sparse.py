"""Style: a recommender / text model whose ``Embedding`` layer produces ``tf.IndexedSlices``
gradients, trained the ways such projects do: a custom loop with
``hvd.DistributedGradientTape(tape)`` (sparse gradients allgathered) and with
``sparse_as_dense=True`` (densified, allreduced -- the usual advice for small vocabularies), and
``model.fit`` with ``hvd.DistributedOptimizer(opt, sparse_as_dense=True)`` and without it.

Two-tower model: user and item ``Embedding`` layers, a dot product, ``binary_crossentropy`` on
implicit-feedback labels; ``Adagrad`` (sparse-friendly) for the loops and ``Adam`` for ``fit``.

Keras: 3
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras

hvd.init()

USERS, ITEMS, DIM = 50, 40, 8
rng = np.random.default_rng(hvd.rank())
user_ids = rng.integers(0, USERS, size=2000).astype('int32')
item_ids = rng.integers(0, ITEMS, size=2000).astype('int32')
labels = ((user_ids % 5) == (item_ids % 5)).astype('float32')


def two_tower(seed):
    tf.keras.utils.set_random_seed(seed)
    u_in = tf.keras.Input(shape=(), dtype='int32', name='user')
    i_in = tf.keras.Input(shape=(), dtype='int32', name='item')
    u = tf.keras.layers.Embedding(USERS, DIM, name='user_emb')(u_in)
    i = tf.keras.layers.Embedding(ITEMS, DIM, name='item_emb')(i_in)
    score = tf.keras.layers.Dot(axes=1)([u, i])
    out = tf.keras.layers.Dense(1, activation='sigmoid')(score)
    return tf.keras.Model([u_in, i_in], out)


dataset = tf.data.Dataset.from_tensor_slices(
    ({'user': user_ids, 'item': item_ids}, labels)).shuffle(2000, seed=1).batch(64)
bce = tf.keras.losses.BinaryCrossentropy()


def same_everywhere(model, label):
    weights = np.concatenate([w.numpy().ravel() for w in model.trainable_weights])
    everyone = hvd.allgather(weights.reshape(1, -1)).numpy()
    assert (everyone == everyone[0]).all(), f'{label}: weights differ across ranks'


def custom_loop(sparse_as_dense):
    model = two_tower(seed=hvd.rank())
    opt = tf.keras.optimizers.Adagrad(0.5)
    saw_sparse = []

    @tf.function
    def step(features, y, first_batch):
        with tf.GradientTape() as tape:
            loss = bce(y[:, None], model(features, training=True))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        grads = tape.gradient(loss, model.trainable_variables)
        saw_sparse.append(any(isinstance(g, tf.IndexedSlices) for g in grads))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    losses = []
    for epoch in range(3):
        batch_losses = [float(step(f, y, epoch == 0 and i == 0))
                        for i, (f, y) in enumerate(dataset)]
        losses.append(float(np.mean(batch_losses)))
    label = f'tape sparse_as_dense={sparse_as_dense}'
    same_everywhere(model, label)
    assert saw_sparse and saw_sparse[0] == (not sparse_as_dense), (label, saw_sparse)
    assert losses[-1] < losses[0], (label, losses)
    return losses


def fit(sparse_as_dense):
    model = two_tower(seed=10 + hvd.rank())
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.Adam(0.02),
                                         sparse_as_dense=sparse_as_dense)
    model.compile(optimizer=opt, loss='binary_crossentropy', metrics=['accuracy'])
    history = model.fit(dataset, epochs=3, verbose=0,
                        callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    label = f'fit sparse_as_dense={sparse_as_dense}'
    same_everywhere(model, label)
    losses = [float(v) for v in history.history['loss']]
    assert losses[-1] < losses[0], (label, losses)
    return losses


results = {
    'tape_sparse': custom_loop(False),
    'tape_dense': custom_loop(True),
    'fit_sparse': fit(False),
    'fit_dense': fit(True),
}
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({**results, 'ranks_agree': True}))
