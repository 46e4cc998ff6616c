"""Style: a TensorFlow 1 graph script kept alive through ``tf.compat.v1`` (``import
tensorflow.compat.v1 as tf; tf.disable_v2_behavior()``), as Horovod's original
``tensorflow_mnist.py`` taught: placeholders and ``tf.layers.dense``,
``hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.001 * hvd.size()))``, ``minimize(loss,
global_step=...)``, ``hooks=[hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(...),
tf.train.LoggingTensorHook(...)]``, ``tf.ConfigProto()`` with ``gpu_options.visible_device_list =
str(hvd.local_rank())``, ``checkpoint_dir`` on rank 0 only, ``tf.train.MonitoredTrainingSession``
fed from a Python batch generator with ``feed_dict``; then a second, plain ``tf.Session`` part
that runs ``hvd.broadcast_global_variables(0)`` after ``tf.global_variables_initializer()`` and
averages a metric with ``hvd.allreduce`` inside the graph.

Keras: tf-keras (``tf.layers.dense`` is a tf-keras layer: Keras 3 refuses it, "`dense` is not
available with Keras 3")
"""
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow.compat.v1 as tf
import horovod.tensorflow as hvd

tf.disable_v2_behavior()
tf.logging.set_verbosity(tf.logging.WARN)

hvd.init()


def batch_generator(x, y, batch_size):
    """Endless shuffled batches (the TF1 examples' ``training_batch_generator``)."""
    rng = np.random.RandomState(hvd.rank())
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]


rng = np.random.RandomState(10 + hvd.rank())
x_train = rng.normal(size=(800, 10)).astype(np.float32)
y_train = (x_train[:, :4].sum(axis=1) > 0).astype(np.int64)

# ------------------------------------------------------------------ part 1: MonitoredSession
with tf.Graph().as_default():
    tf.set_random_seed(hvd.rank())  # different initial weights: the hook must broadcast them
    features = tf.placeholder(tf.float32, [None, 10], name='features')
    labels = tf.placeholder(tf.int64, [None], name='labels')
    hidden = tf.layers.dense(features, 32, activation=tf.nn.relu)
    logits = tf.layers.dense(hidden, 2)
    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)

    global_step = tf.train.get_or_create_global_step()
    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.train.AdamOptimizer(0.002 * hvd.size())
    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)
    train_op = opt.minimize(loss, global_step=global_step)

    last_step = 120 // hvd.size()
    hooks = [
        # Horovod: BroadcastGlobalVariablesHook broadcasts initial variable states
        # from rank 0 to all other processes.
        hvd.BroadcastGlobalVariablesHook(0),
        # Horovod: adjust number of steps based on number of GPUs.
        tf.train.StopAtStepHook(last_step=last_step),
        tf.train.LoggingTensorHook(tensors={'step': global_step, 'loss': loss},
                                   every_n_iter=20),
    ]

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    config = tf.ConfigProto()
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting them.
    checkpoint_dir = tempfile.mkdtemp(prefix='v13-', dir=os.environ.get('CORPUS_WORKDIR')) \
        if hvd.rank() == 0 else None

    batches = batch_generator(x_train, y_train, 32)
    first_loss = last_loss = None
    with tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,
                                           config=config, save_summaries_steps=None,
                                           save_summaries_secs=None) as mon_sess:
        while not mon_sess.should_stop():
            image_, label_ = next(batches)
            _, value = mon_sess.run([train_op, loss], feed_dict={features: image_,
                                                                 labels: label_})
            first_loss = value if first_loss is None else first_loss
            last_loss = value
        # (the session stops at the step hook; read the weights through the raw session)
        weights = mon_sess._tf_sess().run(tf.trainable_variables())
        steps = mon_sess._tf_sess().run(global_step)
    flat = np.concatenate([w.ravel() for w in weights])

saved = sorted(os.listdir(checkpoint_dir)) if checkpoint_dir else []

# ------------------------------------------------------------------ part 2: tf.Session
with tf.Graph().as_default():
    tf.set_random_seed(100 + hvd.rank())
    w = tf.get_variable('w', shape=[10, 1], initializer=tf.glorot_uniform_initializer())
    b = tf.get_variable('b', shape=[1], initializer=tf.zeros_initializer())
    xs = tf.placeholder(tf.float32, [None, 10])
    ys = tf.placeholder(tf.float32, [None, 1])
    mse = tf.reduce_mean(tf.square(tf.matmul(xs, w) + b - ys))
    step_op = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(0.05)).minimize(mse)
    avg_mse = hvd.allreduce(mse, name='avg_mse')
    bcast = hvd.broadcast_global_variables(0)
    target = x_train[:, :1] * 0.5
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(bcast)
        before = sess.run(avg_mse, feed_dict={xs: x_train, ys: target})
        for i in range(40):
            sess.run(step_op, feed_dict={xs: x_train[i * 16 % 800:][:16],
                                         ys: target[i * 16 % 800:][:16]})
        after, session_weights = sess.run([avg_mse, w], feed_dict={xs: x_train, ys: target})

# ---------------------------------------------------------------- checks (eager collectives
# are not available in a v1 graph program: compare through a last graph)
with tf.Graph().as_default():
    gathered = hvd.allgather(tf.constant(flat.reshape(1, -1)))
    gathered2 = hvd.allgather(tf.constant(session_weights.reshape(1, -1)))
    gathered_after = hvd.allgather(tf.constant([after], dtype=tf.float32))
    with tf.Session() as sess:
        everyone, everyone2, afters = sess.run([gathered, gathered2, gathered_after])
assert (everyone == everyone[0]).all(), 'monitored session: weights differ across ranks'
assert (everyone2 == everyone2[0]).all(), 'tf.Session: weights differ across ranks'
assert (afters == afters[0]).all(), f'averaged metric differs across ranks: {afters}'
assert steps == last_step, (steps, last_step)
assert last_loss < first_loss, (first_loss, last_loss)
assert after < before, (before, after)
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({'first_loss': float(first_loss), 'last_loss': float(last_loss),
                                  'steps': int(steps), 'mse_before': float(before),
                                  'mse_after': float(after), 'ranks_agree': True,
                                  'checkpoint_written': any(f.startswith('model.ckpt')
                                                            for f in saved)}))
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
