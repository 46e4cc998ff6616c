"""``horovod.spark.keras``: `KerasEstimator` trains a Keras model on a DataFrame; `KerasModel`
predicts with it.

`fit(df)` checks everything it can on the driver (parameters, columns, the store, and one forward
pass and loss on two rows), writes the rows to the store as Parquet (`common/estimator.py`),
trains on `num_proc` ranks with `horovod.tensorflow.keras` (see `remote.py`) and returns a
`KerasModel` holding a compiled copy of the model with the trained weights and Keras'
`History.history` (`{"loss": [...], "val_loss": [...], ...}`), as Horovod's did. A `run_id`
whose run has a checkpoint resumes from its weights and its optimizer's variables and trains
`epochs` more epochs (docs/estimators.md).

Keras objects never travel pickled: the model goes to the ranks as `.keras` bytes and the
optimizer as its Keras config. Keras 3 by default; tf-keras for a tf-keras model (a process with
TF_USE_LEGACY_KERAS=1 building it through `tf.keras`).
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

from ..common.estimator import EstimatorError, HorovodEstimator, HorovodModel, as_list
from ..common.prepared import PreparedData
from ..common.params import declare
from ..common.serialization import register_codec
from . import remote

#: Rows the driver runs through the model and loss before training, to check their shapes.
PROBE_ROWS = 2


def _keras_of(model: Any) -> Any:
    return remote.keras_module(remote.is_legacy_model(model))


def _is_keras_model(model: Any) -> bool:
    for legacy in (False, True):
        try:
            if isinstance(model, remote.keras_module(legacy).Model):
                return True
        except ImportError:
            pass
    return False


class SavedKerasModel:
    """How `save()` writes a Keras model parameter: its `.keras` bytes (not a pickle of the
    Keras object); loaded back uncompiled, with the Keras it was made with."""

    def __init__(self, data: bytes, legacy: bool) -> None:
        self.data, self.legacy = data, legacy

    def _horovod_restore(self) -> Any:
        return remote.model_from_bytes(remote.keras_module(self.legacy), self.data)


class SavedKerasOptimizer:
    """How `save()` writes a Keras optimizer parameter: its Keras config."""

    def __init__(self, config: Any, legacy: bool) -> None:
        self.config, self.legacy = config, legacy

    def _horovod_restore(self) -> Any:
        return remote.optimizer_from_config(remote.keras_module(self.legacy), self.config)


def _keras_class(value: Any, base: str) -> bool:
    modules = [(getattr(k, "__module__", "") or "") for k in type(value).__mro__]
    return any(m.startswith(("keras.", "tf_keras.")) for m in modules) and \
        any(k.__name__ == base for k in type(value).__mro__)


register_codec(lambda v: _keras_class(v, "Model"),
               lambda v: SavedKerasModel(remote.model_to_bytes(v), remote.is_legacy_model(v)))
register_codec(lambda v: _keras_class(v, "Optimizer") or _keras_class(v, "OptimizerV2"),
               lambda v: SavedKerasOptimizer(remote.keras_module(remote.is_legacy_model(v))
                                             .optimizers.serialize(v), remote.is_legacy_model(v)))


class KerasEstimator(HorovodEstimator):
    """Horovod's Keras Spark estimator (see Horovod's docs for the parameters)."""

    def _run_id(self) -> str:
        return self.getRunId() or f"keras_{uuid.uuid4().hex[:10]}"

    def _optimizer(self) -> Any:
        optimizer = self.getOptimizer()
        if optimizer is None:
            optimizer = getattr(self.getModel(), "optimizer", None)
        return optimizer

    def _check_model_params(self) -> None:
        import cloudpickle

        model = self.getModel()
        if not _is_keras_model(model):
            raise EstimatorError(f"model must be a Keras model (keras.Model, or tf_keras.Model with "
                                 f"TF_USE_LEGACY_KERAS=1), got {type(model).__name__}.")
        if not model.built:
            raise EstimatorError("The model is not built: give its first layer an input shape "
                                 "(keras.Input(shape=...)) or call model.build(input_shape) first.")
        if not self.getLoss():
            raise EstimatorError("The estimator needs loss= (e.g. 'mse' or "
                                 "keras.losses.categorical_crossentropy) to compile the model.")
        optimizer = self._optimizer()
        if optimizer is None:
            raise EstimatorError("The estimator needs optimizer= (e.g. keras.optimizers.Adam()), or "
                                 "a model compiled with one.")
        keras = _keras_of(model)
        if not isinstance(optimizer, (str, dict, keras.optimizers.Optimizer)):
            raise EstimatorError(f"optimizer must be a {keras.__name__}.optimizers.Optimizer of the "
                                 f"model's Keras, or its name, got {type(optimizer).__name__} (a "
                                 "Keras 3 optimizer with a tf-keras model or the other way round?).")
        inputs, outputs = remote.model_shapes(model)
        features, labels = as_list(self.getFeatureCols()), as_list(self.getLabelCols())
        if inputs and len(inputs) != len(features):
            raise EstimatorError(f"The model has {len(inputs)} input(s) but feature_cols names "
                                 f"{len(features)} column(s) {features}; give one column per input.")
        if outputs and len(outputs) != len(labels):
            raise EstimatorError(f"The model has {len(outputs)} output(s) but label_cols names "
                                 f"{len(labels)} column(s) {labels}; give one column per output.")
        for name in ("callbacks", "custom_objects", "checkpoint_callback", "loss", "metrics"):
            try:
                cloudpickle.dumps(self.getOrDefault(name))
            except Exception as exc:  # noqa: BLE001
                raise EstimatorError(f"{name} cannot be sent to the training processes "
                                     f"({type(exc).__name__}: {exc}).") from exc

    def _optimizer_config(self, keras: Any) -> Any:
        optimizer = self._optimizer()
        if isinstance(optimizer, (str, dict)):
            optimizer = keras.optimizers.get(optimizer)
        return keras.optimizers.serialize(optimizer)

    def _objects(self) -> bytes:
        import cloudpickle

        return cloudpickle.dumps({
            "loss": self.getLoss(), "metrics": self.getMetrics(),
            "callbacks": as_list(self.getCallbacks()), "custom_objects": self.getCustomObjects() or {},
            "checkpoint_callback": self.getCheckpointCallback(),
        })

    def _config(self, data: PreparedData, run_id: str, checkpoint: Optional[bytes]) -> remote.KerasTrainConfig:
        model = self.getModel()
        keras = _keras_of(model)
        seed = self.getRandomSeed()
        buffer = self.getShuffleBufferSize()
        return remote.KerasTrainConfig(
            model=remote.model_to_bytes(model), feature_cols=as_list(self.getFeatureCols()),
            label_cols=as_list(self.getLabelCols()), sample_weight_col=self.getSampleWeightCol(),
            batch_size=self.getBatchSize(), val_batch_size=self.getValBatchSize() or self.getBatchSize(),
            epochs=self.getEpochs(), train_steps=self.getTrainStepsPerEpoch(),
            val_steps=self.getValidationStepsPerEpoch(),
            shuffle=bool(self.getShuffle()) and buffer != 0, seed=seed if seed is not None else 0,
            data=data, store=self.getStore(), run_id=run_id, data_module=None,
            legacy=remote.is_legacy_model(model), optimizer_config=self._optimizer_config(keras),
            objects=self._objects(), loss_weights=self.getLossWeights(),
            label_shapes=self.getLabelShapes(), compression=self.getGradientCompression(),
            transformation_fn=self.getTransformationFn(), checkpoint=checkpoint,
            verbose=self.getVerbose(), use_gpu=bool(self.getUseGpu()), random_seed=seed,
        )

    def _probe(self, config: remote.KerasTrainConfig) -> None:
        """One forward pass and loss on the first rows, on the driver, before any rank starts."""
        import numpy as np

        from distributor.shards import open_shard

        model = self.getModel()
        keras = _keras_of(model)
        reader = open_shard(config.data.train_path, 0, 1, list(config.data.columns), PROBE_ROWS,
                            False, 0, 1, config.data.filesystem)
        batch = next(remote.transformed(config, reader.batches(0)))
        inputs, outputs = remote.model_shapes(model)
        try:
            x, y = remote.keras_batch(config, batch, inputs, outputs, keras.backend.floatx())[:2]
            predicted = model(x, training=False)
        except Exception as exc:  # noqa: BLE001 - reported with the shapes the model got
            shapes = {c: tuple(np.shape(batch[c])) for c in config.feature_cols}
            raise EstimatorError(
                f"The model failed on a batch of {PROBE_ROWS} rows before training started "
                f"({type(exc).__name__}: {exc}). Feature column shapes per batch: {shapes}; the "
                f"model's inputs: {inputs}. Check feature_cols against the model's inputs."
            ) from exc
        predicted = list(predicted) if isinstance(predicted, (list, tuple)) else [predicted]
        labels = list(y) if isinstance(y, tuple) else [y]
        losses = as_list(self.getLoss())
        losses = losses * len(labels) if len(losses) == 1 else losses
        for name, fn, out, label in zip(config.label_cols, losses, predicted, labels):
            try:
                with keras.utils.custom_object_scope(self.getCustomObjects() or {}):
                    keras.losses.get(fn)(label, out)
            except Exception as exc:  # noqa: BLE001
                raise EstimatorError(
                    f"The loss failed on the model's output for label column {name!r} before "
                    f"training started ({type(exc).__name__}: {exc}); output shape "
                    f"{tuple(out.shape)}, label shape {tuple(np.shape(label))}. Make the model's "
                    "output and the label column fit the loss (or reshape with label_shapes)."
                ) from exc

    def _fit_on_prepared_data(self, backend: Any, data: PreparedData, run_id: str) -> "KerasModel":
        num_proc = backend.num_processes()
        if self.getBatchSize() == 1 and data.train_rows % num_proc:
            raise EstimatorError(
                f"batch_size=1 needs the {data.train_rows} training rows to split evenly over the "
                f"{num_proc} processes (otherwise a rank gets an empty batch); use batch_size >= 2 "
                "or another number of processes."
            )
        config = self._config(data, run_id, self._read_checkpoint(run_id))
        self._probe(config)
        env = dict(self.getBackendEnv() or {})
        env["TF_USE_LEGACY_KERAS"] = "1" if config.legacy else "0"
        results = backend.run(remote.train, args=(config,), env=env)
        return self._create_model(results[0], run_id, data)

    def _create_model(self, result: dict, run_id: str, data: PreparedData) -> "KerasModel":
        """A compiled copy of the model with the trained weights and the original optimizer."""
        model = self.getModel()
        keras = _keras_of(model)
        custom = self.getCustomObjects() or {}
        trained = remote.model_from_bytes(keras, remote.model_to_bytes(model), custom)
        trained.set_weights(result["weights"])
        optimizer = remote.optimizer_from_config(keras, self._optimizer_config(keras), custom)
        with keras.utils.custom_object_scope(custom):
            trained.compile(optimizer=optimizer, loss=self.getLoss(),
                            loss_weights=self.getLossWeights(), metrics=self.getMetrics())
        return KerasModel(history=result["history"], model=trained,
                          feature_columns=as_list(self.getFeatureCols()),
                          label_columns=as_list(self.getLabelCols()), custom_objects=custom,
                          run_id=run_id, _metadata=dict(data.columns), _floatx=keras.backend.floatx())


declare(KerasEstimator, {
    "custom_objects": ({}, "custom classes and functions by name, for loading the model"),
    "checkpoint_callback": (None, "a Keras callback run on rank 0 (e.g. a ModelCheckpoint)"),
    "backend_env": ({}, "environment added to every training process"),
    "backward_passes_per_step": (1, "accepted for compatibility"),
})


class KerasModel(HorovodModel):
    """A trained Keras model as a Spark Transformer: `transform(df)` adds one prediction column
    per label (`<label>__output`, or `setOutputCols`)."""

    def getModel(self) -> Any:
        return self.getOrDefault(self.model)

    def getHistory(self) -> Any:
        return self.getOrDefault(self.history)

    def _transform(self, df: Any) -> Any:
        from .transform import predict_dataframe

        return predict_dataframe(self, df)


declare(KerasModel, {
    "custom_objects": ({}, "custom classes and functions by name, for loading the model"),
    "_floatx": (None, "Keras' float type the model was trained with"),
})
