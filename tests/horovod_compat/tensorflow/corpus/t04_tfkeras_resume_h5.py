"""Style: a Keras 2 era script (``import horovod.keras as hvd`` with ``tensorflow.keras``) that
resumes from the newest HDF5 checkpoint, as Horovod's ImageNet example taught and many projects
copied.

Scan for ``checkpoint-{epoch}.h5``; ``resume_from_epoch = int(hvd.broadcast(resume_from_epoch,
0, name='resume_from_epoch'))`` (TensorFlow 2: the broadcast gives a tensor, ``fit`` wants an
int); rank 0 ``hvd.load_model(..., legacy_opts=True)`` (its optimizer comes back wrapped, state
included), the others build the model fresh and receive rank 0's weights from
``BroadcastGlobalVariablesCallback``; ``keras.optimizers.legacy.SGD(lr=..., momentum=0.9)`` (TF
2.11-2.15 era code: ``lr=`` only works on the legacy optimizers, the new tf-keras ones ignore it
with a warning); ``keras.backend.get_value(model.optimizer.lr)``; ``model.fit(x, y,
batch_size=..., initial_epoch=resume_from_epoch)`` on NumPy arrays; ``ModelCheckpoint`` on rank 0.
The script runs training twice in one process (a first run, then a "restart" that resumes).

Keras: tf-keras (``keras.optimizers.legacy`` and ``SGD(lr=...)`` are Keras 2 API that Keras 3
rejects)
"""
import json
import os
import shutil
import tempfile

import numpy as np
from tensorflow import keras
import horovod.keras as hvd

hvd.init()

config_dir = os.environ.get('CORPUS_WORKDIR') or tempfile.gettempdir()
# one directory for both ranks (rank 0 writes, every rank reads): its name from rank 0
workdir = hvd.broadcast_object(tempfile.mkdtemp(prefix='t04-', dir=config_dir), 0) \
    if hasattr(hvd, 'broadcast_object') else None
if workdir is None:
    from horovod.tensorflow import broadcast_object
    workdir = broadcast_object(tempfile.mkdtemp(prefix='t04-', dir=config_dir) if hvd.rank() == 0
                               else None, 0)
checkpoint_format = os.path.join(workdir, 'checkpoint-{epoch}.h5')

rng = np.random.RandomState(hvd.rank())
x_train = rng.normal(size=(1024, 12)).astype('float32')
y_train = keras.utils.to_categorical((x_train[:, :3].sum(axis=1) > 0).astype('int32'), 2)


def build_model():
    model = keras.models.Sequential([
        keras.layers.Dense(24, activation='relu', input_shape=(12,)),
        keras.layers.Dense(2, activation='softmax'),
    ])
    opt = keras.optimizers.legacy.SGD(lr=0.01 * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt,
                  metrics=['accuracy'])
    return model


def train(epochs):
    # If set > 0, will resume training from a given checkpoint.
    resume_from_epoch = 0
    for try_epoch in range(epochs, 0, -1):
        if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break

    # Horovod: broadcast resume_from_epoch from rank 0 (which will have
    # checkpoints) to other ranks.  (TF2: the result is a tensor; fit() needs a Python int.)
    resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name='resume_from_epoch'))

    # Restore from a previous checkpoint, if initial_epoch is specified.
    # Horovod: restore on the first worker which will broadcast both model and optimizer weights
    # to other workers.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        model = hvd.load_model(checkpoint_format.format(epoch=resume_from_epoch),
                               legacy_opts=True)
    else:
        model = build_model()

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))

    history = model.fit(x_train, y_train, batch_size=32, callbacks=callbacks, epochs=epochs,
                        initial_epoch=resume_from_epoch, verbose=2 if hvd.rank() == 0 else 0)
    return model, history, int(resume_from_epoch)


model, first, resumed_at = train(epochs=2)
assert resumed_at == 0, resumed_at
iterations_after_first = int(keras.backend.get_value(model.optimizer.iterations))
# "restart": a new model object per rank, resumed from the checkpoint of epoch 2
model, second, resumed_at = train(epochs=4)
assert resumed_at == 2, resumed_at

# ---------------------------------------------------------------- checks
weights = np.concatenate([w.ravel() for w in model.get_weights()])
everyone = hvd.allgather(weights.reshape(1, -1)).numpy()
assert (everyone == everyone[0]).all(), 'weights differ across ranks'
iterations = int(keras.backend.get_value(model.optimizer.iterations))
all_iterations = hvd.allgather(np.array([iterations])).numpy().tolist()
# rank 0 continued from the loaded optimizer's count; the broadcast gave it to the others
assert len(set(all_iterations)) == 1, all_iterations
assert iterations == 2 * iterations_after_first, (iterations, iterations_after_first)
lr = float(keras.backend.get_value(model.optimizer.lr))
assert abs(lr - 0.01 * hvd.size()) < 1e-7, lr
losses = first.history['loss'] + second.history['loss']
assert losses[-1] < losses[0], losses
if hvd.rank() == 0:
    print('RESULT ' + json.dumps({
        'losses': [float(v) for v in losses], 'resumed_at': resumed_at,
        'iterations': iterations, 'lr': lr, 'ranks_agree': True,
        'optimizer': type(model.optimizer).__name__,
        'checkpoints': sorted(os.listdir(workdir))}))
hvd.allgather(np.zeros(1))  # every rank done reading before rank 0 cleans up
if hvd.rank() == 0:
    shutil.rmtree(workdir, ignore_errors=True)
