"""``horovod.spark.torch``: `TorchEstimator` trains a torch model on a DataFrame; `TorchModel`
predicts with it.

`fit(df)` checks everything it can on the driver (columns, store, and one forward pass and loss
on two rows, so a model whose output does not fit the labels fails there), writes the data to
the store, trains on `num_proc` ranks (see `remote.py`) and returns a `TorchModel`. A `run_id`
whose run already has a checkpoint in the store resumes from it and trains `epochs` more epochs,
as Horovod's did (docs/estimators.md). `TorchModel.transform(df)`
predicts in Arrow batches (see `transform.py`).
"""
from __future__ import annotations

import copy
from typing import Any, List, Optional

from ..common.estimator import EstimatorError, HorovodEstimator, HorovodModel, as_list
from ..common.prepared import PreparedData
from ..common.params import declare
from . import remote

#: Rows the driver runs through the model and loss before training, to check their shapes.
PROBE_ROWS = 2


def rebind_optimizer(model: Any, optimizer: Any) -> Any:
    """`optimizer` (with its hyperparameters and state) rebuilt over `model.parameters()`, for
    a model and optimizer that were unpickled apart (from `load`), so that it updates the model
    again; unchanged when it already does or when the parameter counts differ."""
    if model is None or optimizer is None:
        return optimizer
    params = list(model.parameters())
    owned = {id(p) for p in params}
    groups = [len(g["params"]) for g in optimizer.param_groups]
    if any(id(p) in owned for g in optimizer.param_groups for p in g["params"]) or sum(groups) != len(params):
        return optimizer
    split, at = [], 0
    for size in groups:
        split.append({"params": params[at:at + size]})
        at += size
    try:
        rebuilt = type(optimizer)(split)
    except TypeError:  # a constructor with required hyperparameters: kept as loaded
        return optimizer
    rebuilt.load_state_dict(optimizer.state_dict())
    return rebuilt


def _rebind_after_load(self: Any) -> None:
    if self.isSet(self.optimizer):
        self._set(optimizer=rebind_optimizer(self.getModel(), self.getOptimizer()))


class TorchEstimator(HorovodEstimator):
    """Horovod's PyTorch Spark estimator (see Horovod's docs for the parameters)."""

    _after_load = _rebind_after_load

    def _check_model_params(self) -> None:
        import torch

        model = self.getModel()
        if not isinstance(model, torch.nn.Module):
            raise EstimatorError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        if self.getOptimizer() is None:
            raise EstimatorError("The estimator needs optimizer=, e.g. torch.optim.SGD(model.parameters(), lr=0.01).")
        owned = {id(p) for p in model.parameters()}
        optimized = [p for g in self.getOptimizer().param_groups for p in g["params"]]
        if not any(id(p) in owned for p in optimized):
            raise EstimatorError("The optimizer does not optimize this model's parameters: build it "
                                 "from model.parameters() of the model given to the estimator.")
        if self.getLoss() is not None and self.getLossConstructors() is not None:
            raise EstimatorError("Give either loss= or loss_constructors=, not both.")
        if self.getLoss() is None and self.getLossConstructors() is None:
            raise EstimatorError("The estimator needs loss= (e.g. torch.nn.MSELoss()) or loss_constructors=.")
        shapes = self.getInputShapes()
        if shapes is not None and len(shapes) != len(as_list(self.getFeatureCols())):
            raise EstimatorError(f"input_shapes has {len(shapes)} shape(s) for "
                                 f"{len(as_list(self.getFeatureCols()))} feature column(s); give one per column.")
        module = self.getDataModule()
        if module is not None and not isinstance(module, type):
            raise EstimatorError(f"data_module must be a class (each rank builds its own), got an "
                                 f"instance of {type(module).__name__}; pass the class itself.")
        minibatch = self.getTrainMinibatchFn()
        if minibatch is not None and not callable(minibatch):
            raise EstimatorError(f"train_minibatch_fn must be a function, got {type(minibatch).__name__}.")
        bpps = self.getBackwardPassesPerStep()
        if isinstance(bpps, bool) or not isinstance(bpps, int) or bpps < 1:
            raise EstimatorError(f"backward_passes_per_step must be a positive int, got {bpps!r}.")

    def _loss_fns(self) -> List[Any]:
        if self.getLossConstructors() is not None:
            return [make() for make in as_list(self.getLossConstructors())]
        return as_list(self.getLoss())

    def _config(self, data: PreparedData, run_id: str, checkpoint: Optional[bytes]) -> remote.TrainConfig:
        seed = self.getRandomSeed()
        buffer = self.getShuffleBufferSize()
        return remote.TrainConfig(
            model=self.getModel(), optimizer=self.getOptimizer(), loss_fns=self._loss_fns(),
            loss_weights=self.getLossWeights(), metrics=as_list(self.getMetrics()),
            feature_cols=as_list(self.getFeatureCols()), label_cols=as_list(self.getLabelCols()),
            input_shapes=self.getInputShapes(), label_shapes=self.getLabelShapes(),
            sample_weight_col=self.getSampleWeightCol(), batch_size=self.getBatchSize(),
            val_batch_size=self.getValBatchSize() or self.getBatchSize(), epochs=self.getEpochs(),
            train_steps=self.getTrainStepsPerEpoch(), val_steps=self.getValidationStepsPerEpoch(),
            shuffle=bool(self.getShuffle()) and buffer != 0, seed=seed if seed is not None else 0,
            backward_passes_per_step=self.getBackwardPassesPerStep(),
            compression=self.getGradientCompression(), transformation_fn=self.getTransformationFn(),
            data=data, store=self.getStore(), run_id=run_id, checkpoint=checkpoint,
            train_minibatch_fn=self.getTrainMinibatchFn(), data_module=self.getDataModule(),
            verbose=self.getVerbose(),
            use_gpu=bool(self.getUseGpu()),
        )

    def _probe(self, config: remote.TrainConfig) -> None:
        """One forward pass and loss on the first rows, on the driver, before any rank starts."""
        import torch

        from distributor.shards import open_shard

        reader = open_shard(config.data.train_path, 0, 1, list(config.data.columns), PROBE_ROWS,
                            False, 0, 1, config.data.filesystem)
        batch = next(remote.transformed(config, reader.batches(0)))
        model = copy.deepcopy(config.model)
        try:
            with torch.no_grad():
                outputs, labels, weights, rows = remote.forward(config, model.eval(), batch, None)
        except Exception as exc:  # noqa: BLE001 - reported with the shapes the model got
            shapes = {c: tuple(batch[c].shape) for c in config.feature_cols}
            raise EstimatorError(
                f"The model failed on a batch of {PROBE_ROWS} rows before training started "
                f"({type(exc).__name__}: {exc}). Feature column shapes per batch: {shapes}; "
                f"input_shapes={config.input_shapes}. Check feature_cols and input_shapes against "
                "the model's forward()."
            ) from exc
        if len(outputs) != len(labels):
            raise EstimatorError(f"The model returns {len(outputs)} output(s) for {len(labels)} label "
                                 "column(s); return one output per label column.")
        for name, output, label in zip(config.label_cols, outputs, labels):
            out_size = output.numel() // max(rows, 1)
            label_size = label.numel() // max(rows, 1)
            if output.shape[0] != rows or (label_size > 1 and out_size != label_size):
                raise EstimatorError(
                    f"The model's output of shape {tuple(output.shape)} does not match label "
                    f"column {name!r} of shape {tuple(label.shape)} for a batch of {rows} rows. "
                    "Make the model's last layer produce the label's size per row (or reshape "
                    "with label_shapes)."
                )
        try:
            remote.compute_loss(config, outputs, labels, weights)
        except Exception as exc:  # noqa: BLE001
            shapes = [(tuple(o.shape), tuple(l.shape)) for o, l in zip(outputs, labels)]
            raise EstimatorError(
                f"The loss failed on the model's output before training started "
                f"({type(exc).__name__}: {exc}); (output, label) shapes: {shapes}. Make the "
                "model's output and the label columns fit the loss."
            ) from exc

    def _fit_on_prepared_data(self, backend: Any, data: PreparedData, run_id: str) -> "TorchModel":
        num_proc = backend.num_processes()
        if self.getTrainMinibatchFn() is not None and self.getBatchSize() == 1 and \
                data.train_rows % num_proc:
            raise EstimatorError(
                f"train_minibatch_fn with batch_size=1 needs the {data.train_rows} training rows to "
                f"split evenly over the {num_proc} processes (otherwise a rank gets an empty last "
                "batch that the function would have to handle); use batch_size >= 2 or another "
                "number of processes."
            )
        checkpoint = self._read_checkpoint(run_id)
        config = self._config(data, run_id, checkpoint)
        self._probe(config)
        results = backend.run(remote.train, args=(config,))
        return self._create_model(results[0], run_id, data)

    def _create_model(self, checkpoint: bytes, run_id: str, data: PreparedData) -> "TorchModel":
        state = remote.load_checkpoint(checkpoint)
        model, optimizer = copy.deepcopy((self.getModel(), self.getOptimizer()))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        model.eval()
        return TorchModel(history=state["history"], model=model, optimizer=optimizer,
                          feature_columns=as_list(self.getFeatureCols()),
                          label_columns=as_list(self.getLabelCols()),
                          input_shapes=self.getInputShapes(), run_id=run_id,
                          _metadata=dict(data.columns), loss=self.getLoss(),
                          loss_constructors=self.getLossConstructors())


declare(TorchEstimator, {
    "input_shapes": (None, "shape of each feature column's tensor, e.g. [[-1, 1, 28, 28]]"),
    "loss_constructors": (None, "functions returning the loss, instead of loss="),
    "train_minibatch_fn": (None, "fn(model, optimizer, transform_outputs, loss_fn, inputs, labels, "
                                 "sample_weights, backward_passes_per_step, batch_idx) -> (outputs, loss) "
                                 "run on every training batch instead of the default step; the optimizer "
                                 "averages the gradients over the ranks in step()"),
    "backward_passes_per_step": (1, "batches whose gradients are summed per optimizer step"),
    "data_module": (None, "horovod.spark.common.datamodule.DataModule subclass each rank reads its "
                          "batches from (default: the rank's own Parquet shards)"),
})


class TorchModel(HorovodModel):
    """A trained torch model as a Spark Transformer: `transform(df)` adds one prediction column
    per label (`<label>__output`, or `setOutputCols`)."""

    def getOptimizer(self) -> Any:
        return self.getOrDefault(self.optimizer)

    _after_load = _rebind_after_load

    def getModel(self) -> Any:
        return self.getOrDefault(self.model)

    def _transform(self, df: Any) -> Any:
        from .transform import predict_dataframe

        return predict_dataframe(self, df)


declare(TorchModel, {
    "optimizer": (None, "optimizer, with its state after training"),
    "input_shapes": (None, "shape of each feature column's tensor"),
    "loss": (None, "loss"),
    "loss_constructors": (None, "loss constructors"),
})
