"""What every rank of a `KerasEstimator` fit runs: `model.fit` with `horovod.tensorflow.keras`.

Each rank loads the model from the `.keras` bytes the driver made (never a pickled Keras
object), compiles it with `hvd.DistributedOptimizer(optimizer)` -- the learning rate multiplied
by the number of ranks, as Horovod's Keras estimator did -- and fits it on its own Parquet shard
(`distributor.shards`, the reader the Torch estimator uses), fed as a `tf.data` dataset, with
`BroadcastGlobalVariablesCallback(0)` and `MetricAverageCallback()` before the user's callbacks.
Every rank takes the same number of steps per epoch. Callbacks run in a temporary folder
(relative paths such as TensorBoard's `logs` land there), which rank 0 copies into the run's
folder in the store at the end. Rank 0 writes a checkpoint to the store
after every epoch (`remote.save_checkpoint`) and returns the history and the final weights.

Keras 3 by default; tf-keras when the model is a tf-keras model (the driver ran with
TF_USE_LEGACY_KERAS=1): `legacy` in the config, and TF_USE_LEGACY_KERAS in the ranks' env.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..torch.remote import RunConfig, transformed


@dataclass
class KerasTrainConfig(RunConfig):
    """A Keras run. Keras objects travel as bytes: the model as `.keras` bytes, the optimizer as
    its Keras config, loss/metrics/callbacks/custom objects as one cloudpickle (`objects`)."""

    legacy: bool = False
    optimizer_config: Any = None
    objects: bytes = b""
    loss_weights: Optional[List[float]] = None
    label_shapes: Any = None
    compression: Any = None
    transformation_fn: Any = None
    checkpoint: Optional[bytes] = None
    verbose: int = 1
    use_gpu: bool = True
    random_seed: Optional[int] = None
    scale_lr: bool = True
    buffer_row_groups: int = 4


# ---- Keras flavours and model bytes -------------------------------------------------------------

def use_flavor(legacy: bool) -> None:
    """Make `tf.keras` (and `horovod.tensorflow.keras`) pick tf-keras or Keras 3 in this process."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if legacy else "0"


def keras_module(legacy: bool) -> Any:
    if legacy:
        import tf_keras

        return tf_keras
    import keras

    return keras


def is_legacy_model(model: Any) -> bool:
    return any((getattr(k, "__module__", "") or "").startswith("tf_keras")
               for k in type(model).__mro__)


def model_to_bytes(model: Any) -> bytes:
    """The model (architecture and weights, no optimizer) in the `.keras` format."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(keras: Any, data: bytes, custom_objects: Optional[dict] = None) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        with keras.utils.custom_object_scope(custom_objects or {}):
            return keras.models.load_model(path, compile=False)


def optimizer_from_config(keras: Any, config: Any, custom_objects: Optional[dict] = None) -> Any:
    with keras.utils.custom_object_scope(custom_objects or {}):
        return keras.optimizers.deserialize(config)


def scaled_learning_rate(optimizer: Any, factor: float) -> None:
    """Multiply a constant learning rate by `factor` (schedules are left alone)."""
    lr = optimizer.learning_rate
    try:
        value = float(np.asarray(lr.numpy() if hasattr(lr, "numpy") else lr))
    except (TypeError, ValueError):
        return
    optimizer.learning_rate = value * factor


# ---- checkpoints --------------------------------------------------------------------------------

def save_checkpoint(weights: List[np.ndarray], epoch: int, history: Dict[str, List[float]],
                    optimizer: Optional[List[np.ndarray]] = None) -> bytes:
    """A pickled dict: the model's weights, the run's last epoch, this fit's history and the
    optimizer's variables (its step count, slots such as Adam's moments)."""
    return pickle.dumps({"weights": [np.asarray(w) for w in weights], "epoch": epoch,
                         "history": history, "optimizer": optimizer},
                        protocol=pickle.HIGHEST_PROTOCOL)


def restore_optimizer(optimizer: Any, model: Any, values: Optional[List[np.ndarray]]) -> bool:
    """Build ``optimizer`` for the model's variables and give its variables ``values``; False (and
    nothing changed) when the saved state does not fit this optimizer (another class or model)."""
    from horovod_compat.tensorflow._keras_models import build_optimizer, optimizer_variables

    if not values:
        return False
    build_optimizer(optimizer, model.trainable_variables)
    variables = optimizer_variables(optimizer)
    if len(variables) != len(values) or any(tuple(v.shape) != np.shape(x)
                                            for v, x in zip(variables, values)):
        return False
    for v, x in zip(variables, values):
        v.assign(x)
    return True


def load_checkpoint(data: bytes) -> dict:
    return pickle.loads(data)


# ---- batches ------------------------------------------------------------------------------------

def _target_shape(tensor_shape: Any) -> Optional[List[int]]:
    """[-1, d1, d2, ...] of a model input/output, or None when more than the batch is unknown."""
    dims = list(tensor_shape)[1:]
    if any(d is None for d in dims):
        return None
    return [-1] + [int(d) for d in dims]


def model_shapes(model: Any) -> Tuple[List[Optional[List[int]]], List[Optional[List[int]]]]:
    """The shapes of the model's inputs and outputs ([] when the model has none defined)."""
    def shapes(tensors: Any) -> List[Optional[List[int]]]:
        try:
            return [_target_shape(t.shape) for t in (tensors or [])]
        except (AttributeError, ValueError, TypeError):
            return []

    return shapes(getattr(model, "inputs", None)), shapes(getattr(model, "outputs", None))


def _reshaped(values: np.ndarray, shape: Optional[List[int]], strict: bool) -> np.ndarray:
    if shape is None:
        return values
    rows = len(values)
    per_row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if values.size != rows * per_row:
        if strict:
            raise ValueError(f"a batch of shape {values.shape} cannot be reshaped to {shape}")
        return values
    return values.reshape([rows] + shape[1:])


def _cast(values: np.ndarray, floatx: str) -> np.ndarray:
    if values.dtype == np.float64 or values.dtype == np.float32:
        values = values.astype(floatx, copy=False)
    elif values.dtype == np.bool_:
        values = values.astype(floatx)
    return np.ascontiguousarray(values)


def keras_batch(cfg: Any, batch: Dict[str, np.ndarray], input_shapes: List[Any],
                output_shapes: List[Any], floatx: str = "float32") -> Tuple[Any, ...]:
    """(x, y[, sample_weight]) of a batch: features reshaped to the model's inputs, labels to
    `label_shapes` or, when they have as many values, to the model's outputs."""
    xs = [_cast(_reshaped(batch[c], input_shapes[i] if i < len(input_shapes) else None, True), floatx)
          for i, c in enumerate(cfg.feature_cols)]
    label_shapes = cfg.label_shapes
    ys = []
    for i, c in enumerate(cfg.label_cols):
        if label_shapes is not None and i < len(label_shapes):
            ys.append(_cast(_reshaped(batch[c], list(label_shapes[i]), True), floatx))
        else:
            ys.append(_cast(_reshaped(batch[c], output_shapes[i] if i < len(output_shapes) else None,
                                      False), floatx))
    x = xs[0] if len(xs) == 1 else tuple(xs)
    y = ys[0] if len(ys) == 1 else tuple(ys)
    if cfg.sample_weight_col:
        return x, y, _cast(np.asarray(batch[cfg.sample_weight_col]), floatx)
    return x, y


def _cycle(cfg: Any, reader: Any, first_epoch: int) -> Iterator[Dict[str, np.ndarray]]:
    epoch = first_epoch
    while True:
        yield from transformed(cfg, reader.batches(epoch))
        epoch += 1


def dataset(cfg: Any, batches: Iterator[Dict[str, np.ndarray]], input_shapes: List[Any],
            output_shapes: List[Any], floatx: str) -> Any:
    """An endless `tf.data.Dataset` of (x, y[, w]) from `batches` (its spec from the first)."""
    import tensorflow as tf

    converted = (keras_batch(cfg, b, input_shapes, output_shapes, floatx) for b in batches)
    first = next(converted)

    def spec(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(spec(v) for v in value)
        return tf.TensorSpec((None,) + value.shape[1:], tf.as_dtype(value.dtype))

    buffered = [first]

    def generate() -> Iterator[Any]:
        # next(), not `yield from`: Keras may drop an iterator (tf.data then closes this
        # generator) and start another, which must go on with the same batches.
        while True:
            yield buffered.pop() if buffered else next(converted)

    return tf.data.Dataset.from_generator(generate, output_signature=spec(first))


def _open(cfg: Any, path: str, batch_size: int, shuffle: bool, rank: int, world: int) -> Any:
    from distributor.shards import open_shard

    columns = list(dict.fromkeys(cfg.feature_cols + cfg.label_cols +
                                 ([cfg.sample_weight_col] if cfg.sample_weight_col else [])))
    return open_shard(path, rank, world, columns, batch_size, shuffle, cfg.seed,
                      cfg.buffer_row_groups, cfg.data.filesystem)


# ---- the rank's fit -----------------------------------------------------------------------------

def _pin_gpu(tf: Any, use_gpu: bool, local_rank: int) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if use_gpu:
        tf.config.experimental.set_memory_growth(gpus[local_rank % len(gpus)], True)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    else:
        tf.config.set_visible_devices([], "GPU")


def _plain(history: Dict[str, Any]) -> Dict[str, List[float]]:
    return {k: [float(np.asarray(v)) for v in values] for k, values in history.items()}


def train(cfg: KerasTrainConfig) -> Optional[Dict[str, Any]]:
    """A rank's whole fit; rank 0 returns {"history", "weights", "size"}, the others None."""
    use_flavor(cfg.legacy)
    import cloudpickle
    import tensorflow as tf

    import horovod_compat.tensorflow.keras as hvd
    from horovod_compat.tensorflow._keras_models import optimizer_variables

    keras = keras_module(cfg.legacy)
    hvd.init()
    try:
        rank, size = hvd.rank(), hvd.size()
        _pin_gpu(tf, cfg.use_gpu, hvd.local_rank())
        if cfg.random_seed is not None:
            keras.utils.set_random_seed(cfg.random_seed)
        objects = cloudpickle.loads(cfg.objects)
        custom = objects["custom_objects"] or {}
        model = model_from_bytes(keras, cfg.model, custom)
        optimizer = optimizer_from_config(keras, cfg.optimizer_config, custom)
        if cfg.scale_lr:
            scaled_learning_rate(optimizer, size)
        dist_args = {"compression": cfg.compression} if cfg.compression is not None else {}
        with keras.utils.custom_object_scope(custom):
            model.compile(optimizer=hvd.DistributedOptimizer(optimizer, **dist_args),
                          loss=objects["loss"], loss_weights=cfg.loss_weights,
                          metrics=objects["metrics"])
        start = 0
        if cfg.checkpoint is not None:
            state = load_checkpoint(cfg.checkpoint)
            model.set_weights(state["weights"])
            start = state["epoch"] + 1
            restored = restore_optimizer(model.optimizer, model, state.get("optimizer"))
            if rank == 0 and cfg.verbose:
                print(f"Resuming run {cfg.run_id} from its checkpoint after {start} epoch(s): "
                      f"training {cfg.epochs} more"
                      + ("" if restored else " (the optimizer starts afresh: the checkpoint's "
                                             "optimizer state does not fit this optimizer)"),
                      flush=True)
        floatx = keras.backend.floatx()
        input_shapes, output_shapes = model_shapes(model)
        data = cfg.data
        train_reader = _open(cfg, data.train_path, cfg.batch_size, cfg.shuffle, rank, size)
        train_steps = cfg.train_steps or train_reader.steps
        train_ds = dataset(cfg, _cycle(cfg, train_reader, start), input_shapes, output_shapes, floatx)
        val_ds, val_steps = None, None
        if data.val_path:
            val_reader = _open(cfg, data.val_path, cfg.val_batch_size, False, rank, size)
            val_steps = cfg.val_steps or val_reader.steps
            val_ds = dataset(cfg, _cycle(cfg, val_reader, 0), input_shapes, output_shapes, floatx)

        checkpoint_file = cfg.store.get_checkpoint_file(cfg.run_id) if cfg.store.saving_runs() else None
        history: Dict[str, List[float]] = {}

        class _Checkpoint(keras.callbacks.Callback):
            """Rank 0: this fit's history and a checkpoint in the store after every epoch
            (after MetricAverageCallback, so the values are the ranks' averages)."""

            def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
                for key, value in (logs or {}).items():
                    history.setdefault(key, []).append(float(np.asarray(value)))
                if rank == 0 and checkpoint_file:
                    cfg.store.write(checkpoint_file,
                                    save_checkpoint(self.model.get_weights(), start + epoch, history,
                                                    [np.asarray(v) for v in
                                                     optimizer_variables(self.model.optimizer)]))

        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback(), _Checkpoint()]
        callbacks += list(objects["callbacks"] or [])
        if rank == 0 and objects.get("checkpoint_callback") is not None:
            callbacks.append(objects["checkpoint_callback"])
        with tempfile.TemporaryDirectory(prefix=f"horovod_keras_{rank}_") as workdir, \
                contextlib.chdir(workdir):  # relative paths of callbacks (e.g. TensorBoard's logs)
            model.fit(train_ds, steps_per_epoch=train_steps, epochs=cfg.epochs,
                      validation_data=val_ds, validation_steps=val_steps, callbacks=callbacks,
                      verbose=cfg.verbose if rank == 0 else 0,
                      shuffle=False)  # the reader shuffles (Keras would warn it cannot)
            if rank == 0 and cfg.store.saving_runs():  # what callbacks wrote: into the run's folder
                cfg.store.sync_fn(cfg.run_id)(workdir)
        if rank != 0:
            return None
        return {"history": history, "weights": [np.asarray(w) for w in model.get_weights()],
                "size": size}
    finally:
        hvd.shutdown()
