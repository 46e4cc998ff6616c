"""What every rank of a `TorchEstimator` fit runs: the training loop on its shard.

Plain torch.distributed (gloo on CPU, NCCL on GPU), no Horovod runtime: each rank reads its own
rows (`distributor.shards`), runs forward and backward, and the ranks sum their gradients and
row counts in one allreduce per optimizer step, so every step is the average over all the rows
of that step on every rank (ranks whose last batch is smaller or empty weigh less, never wait).
Rank 0 writes a checkpoint to the store after every epoch: the model's plain state dict (no
DDP `module.` prefix), the optimizer's, the run's epoch and this fit's history.

Resuming is Horovod's: a fit whose run already has a checkpoint loads model and optimizer state
from it and then trains `epochs` epochs more, with a history of its own (entries numbered from 0,
as Horovod's `for epoch in range(epochs)`). Only the order of the data goes on from the
checkpoint's epoch, so a resumed fit does not see the shuffles of the first one again.
"""
from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np


@dataclass
class RunConfig:
    """What every estimator's ranks need: the model, the data and the run; pickled once by the
    engine and sent to every rank."""

    model: Any
    feature_cols: List[str]
    label_cols: List[str]
    sample_weight_col: Optional[str]
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps: Optional[int]
    val_steps: Optional[int]
    shuffle: bool
    seed: int
    data: Any
    store: Any
    run_id: str
    data_module: Any


@dataclass
class TrainConfig(RunConfig):
    """A torch model's run: its optimizer, losses and metrics too."""

    optimizer: Any
    loss_fns: List[Any]
    loss_weights: Optional[List[float]]
    metrics: List[Any]
    input_shapes: Optional[List[Sequence[int]]]
    label_shapes: Optional[List[Sequence[int]]]
    backward_passes_per_step: int
    compression: Any
    transformation_fn: Any
    checkpoint: Optional[bytes] = None
    train_minibatch_fn: Any = None
    verbose: int = 1
    use_gpu: bool = True
    buffer_row_groups: int = 4


def to_tensors(batch: Dict[str, np.ndarray], columns: Sequence[str],
               shapes: Optional[Sequence[Any]] = None, device: Any = None) -> List[Any]:
    """Tensors of `columns` from a numpy batch; float64 becomes float32 (what models hold),
    and each is reshaped to its shape in `shapes` when one is given."""
    import torch

    tensors = []
    for i, name in enumerate(columns):
        values = batch[name]
        if isinstance(values, torch.Tensor):  # from a data_module
            tensor = values.float() if values.dtype == torch.float64 else values
        else:
            if values.dtype == np.float64:
                values = values.astype(np.float32)
            elif not values.flags.writeable:  # a view of Arrow's memory
                values = values.copy()
            tensor = torch.from_numpy(np.ascontiguousarray(values))
        shape = shapes[i] if shapes is not None and i < len(shapes) else None
        if shape is not None:
            tensor = tensor.reshape(list(shape))
        tensors.append(tensor.to(device) if device is not None else tensor)
    return tensors


def apply_transformation(fn: Any, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """`transformation_fn` on a batch as a pandas DataFrame (one row per row, arrays as cells)."""
    import pandas as pd

    frame = pd.DataFrame({k: list(v) if v.ndim > 1 else v for k, v in batch.items()})
    out = fn(frame)
    return {k: np.stack(out[k].to_numpy()) if out[k].dtype == object else out[k].to_numpy()
            for k in out.columns}


def compute_loss(cfg: TrainConfig, outputs: List[Any], labels: List[Any], weights: Any) -> Any:
    """The batch's loss: the losses of every output/label pair, weighted by `loss_weights`;
    with sample weights the per-row losses (reduction='none') are weighted and averaged."""
    if len(cfg.loss_fns) == 1 and len(outputs) > 1:
        loss_fns = cfg.loss_fns * len(outputs)
    else:
        loss_fns = cfg.loss_fns
    loss_weights = cfg.loss_weights or [1.0] * len(outputs)
    total = 0
    for fn, weight, output, label in zip(loss_fns, loss_weights, outputs, labels):
        value = fn(output, label)
        if weights is not None:
            if value.dim() == 0:
                raise ValueError(
                    "sample_weight_col needs per-row losses, but the loss returned one value per "
                    "batch: construct it with reduction='none' (e.g. nn.MSELoss(reduction='none'))."
                )
            value = (value.reshape(len(weights), -1).mean(dim=1) * weights).mean()
        elif value.dim() != 0:
            value = value.mean()
        total = total + weight * value
    return total


def transformed(cfg: TrainConfig, batches: Iterator[Dict[str, np.ndarray]]) -> Iterator[Dict[str, np.ndarray]]:
    """The batches read from the shards, through `transformation_fn` when there is one."""
    for batch in batches:
        yield apply_transformation(cfg.transformation_fn, batch) if cfg.transformation_fn else batch


def shard_steps(rows: int, batch_size: int, world: int) -> int:
    """Steps per epoch of `rows` rows over `world` ranks (what `distributor.shards` plans)."""
    return max(-(-rows // (batch_size * world)), 1)


def data_module_kwargs(cfg: RunConfig, rank: int, world: int, train_steps: int,
                       val_steps: Optional[int]) -> Dict[str, Any]:
    """What a rank builds the estimator's `data_module` with (Horovod's names, and ours)."""
    columns = list(dict.fromkeys(cfg.feature_cols + cfg.label_cols +
                                 ([cfg.sample_weight_col] if cfg.sample_weight_col else [])))
    return dict(
        train_dir=cfg.data.train_path, val_dir=cfg.data.val_path, num_train_epochs=cfg.epochs,
        has_val=cfg.data.val_path is not None, train_batch_size=cfg.batch_size,
        val_batch_size=cfg.val_batch_size, shuffle=cfg.shuffle,
        transform_fn=getattr(cfg, "transformation_fn", None), cur_shard=rank, shard_count=world,
        schema_fields=columns, storage_options=getattr(cfg.store, "storage_options", None),
        steps_per_epoch_train=train_steps, steps_per_epoch_val=val_steps, verbose=cfg.verbose,
        random_seed=cfg.seed, seed=cfg.seed, feature_cols=list(cfg.feature_cols),
        label_cols=list(cfg.label_cols), filesystem=cfg.data.filesystem,
    )


def module_batches(cfg: TrainConfig, batches: Any) -> Iterator[Dict[str, Any]]:
    """A data module's batches as dicts by column: a `(features, label)` pair (Horovod's other
    form) becomes one dict, the label under the (single) label column."""
    for batch in batches:
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            features, label = batch
            batch = dict(features)
            if len(cfg.label_cols) != 1:
                raise ValueError(f"data_module yielded (features, label) pairs for {len(cfg.label_cols)} "
                                 "label columns; yield dicts by column instead.")
            batch[cfg.label_cols[0]] = label
        yield batch


def batch_tensors(cfg: TrainConfig, batch: Dict[str, np.ndarray], device: Any):
    """(inputs, labels, sample weights or None) of one batch, as tensors."""
    inputs = to_tensors(batch, cfg.feature_cols, cfg.input_shapes, device)
    labels = to_tensors(batch, cfg.label_cols, cfg.label_shapes, device)
    weights = None
    if cfg.sample_weight_col:
        weights = to_tensors(batch, [cfg.sample_weight_col], None, device)[0].float()
    return inputs, labels, weights


def _as_list(outputs: Any) -> List[Any]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def match_outputs(cfg: TrainConfig, outputs: Any, labels: List[Any]):
    """(outputs as a list, labels): without `label_shapes`, a label with as many values as its
    output takes the output's shape (a (N,) label against an (N, 1) output), as in Horovod."""
    outputs = _as_list(outputs)
    if cfg.label_shapes is None and hasattr(outputs[0], "shape"):
        labels = [label.reshape(output.shape) if label.numel() == output.numel() else label
                  for label, output in zip(labels, outputs)]
    return outputs, labels


def forward(cfg: TrainConfig, model: Any, batch: Dict[str, np.ndarray], device: Any):
    """(outputs, labels, weights, rows) of one batch."""
    inputs, labels, weights = batch_tensors(cfg, batch, device)
    rows = len(labels[0])
    outputs, labels = match_outputs(cfg, model(*inputs), labels)
    return outputs, labels, weights, rows


class AveragingOptimizer:
    """The optimizer a `train_minibatch_fn` is given: `step()` first averages the gradients over
    the ranks (one allreduce, with the estimator's gradient compression), as Horovod's
    DistributedOptimizer does; everything else is the wrapped optimizer's."""

    def __init__(self, optimizer: Any, model: Any, compression: Any, dist: Any) -> None:
        self.optimizer, self._model, self._compression, self._dist = optimizer, model, compression, dist

    def step(self, closure: Any = None) -> Any:
        _allreduce_gradients(self._model, 1.0, self._compression, self._dist)
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _minibatch_helpers(cfg: TrainConfig):
    """Horovod's `transform_outputs(outputs, labels)` and `loss_fn(outputs, labels,
    sample_weights)`, the helpers a `train_minibatch_fn` is called with."""

    def transform_outputs(outputs: Any, labels: List[Any]):
        return match_outputs(cfg, outputs, labels)

    def loss_fn(outputs: List[Any], labels: List[Any], sample_weights: Any) -> Any:
        return compute_loss(cfg, outputs, labels, sample_weights)

    return transform_outputs, loss_fn


def _cycle(reader: Any, start_epoch: int) -> Iterator[Dict[str, np.ndarray]]:
    """The reader's batches, data epoch after data epoch (each reshuffled)."""
    epoch = start_epoch
    while True:
        yield from reader.batches(epoch)
        epoch += 1


def _open_reader(cfg: TrainConfig, path: str, batch_size: int, shuffle: bool, rank: int, world: int):
    from distributor.shards import open_shard

    columns = list(dict.fromkeys(cfg.feature_cols + cfg.label_cols +
                                 ([cfg.sample_weight_col] if cfg.sample_weight_col else [])))
    return open_shard(path, rank, world, columns, batch_size, shuffle, cfg.seed,
                      cfg.buffer_row_groups, cfg.data.filesystem)


def _allreduce_gradients(model: Any, rows: float, compression: Any, dist: Any) -> float:
    """Sum every rank's gradients and rows in one allreduce; leave the average in `.grad`."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params] + [torch.tensor([rows], dtype=params[0].dtype,
                                                       device=params[0].device)])
    ctx = None
    if compression is not None:
        flat, ctx = compression.compress(flat)
    dist.all_reduce(flat)
    if compression is not None:
        flat = compression.decompress(flat, ctx)
    total = float(flat[-1])
    flat = flat[:-1] / max(total, 1.0)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype).clone()
        offset += n
    return total


def _epoch_sums(cfg: TrainConfig, model: Any, batches: Iterator[Any], steps: int,
                optimizer: Any, device: Any, dist: Any) -> Dict[str, float]:
    """Run `steps` steps (training when `optimizer` is given); the mean loss and metrics.

    Training steps are the estimator's own (each rank's gradients weighted by its rows, one
    allreduce per optimizer step) unless `train_minibatch_fn` is set: then, as in Horovod, it
    runs every batch with an `AveragingOptimizer` and owns zero_grad/backward/step, and the
    optimizer steps once more at the end of the epoch."""
    import torch

    training = optimizer is not None
    custom = training and cfg.train_minibatch_fn is not None
    model.train(training)
    sums = np.zeros(2 + len(cfg.metrics))  # loss*rows, rows, metric*rows...
    pending_rows = 0
    k = max(1, cfg.backward_passes_per_step) if training else 1
    if custom:
        optimizer = AveragingOptimizer(optimizer, model, cfg.compression, dist)
        transform_outputs, loss_fn = _minibatch_helpers(cfg)
    with torch.set_grad_enabled(training):
        if training and not custom:
            optimizer.zero_grad()
        for step in range(steps):
            batch = next(batches, None)
            if batch is None:
                raise ValueError(
                    f"The {'training' if training else 'validation'} batches ran out after {step} of "
                    f"the epoch's {steps} steps: a data_module's train_data()/val_data() must yield "
                    "steps_per_epoch_train/steps_per_epoch_val batches for every epoch."
                )
            rows = len(next(iter(batch.values()))) if batch else 0
            if custom:
                inputs, labels, weights = batch_tensors(cfg, batch, device)
                outputs, loss = cfg.train_minibatch_fn(model, optimizer, transform_outputs, loss_fn,
                                                       inputs, labels, weights, k, step)
                outputs = _as_list(outputs)
            elif rows:
                outputs, labels, weights, rows = forward(cfg, model, batch, device)
                loss = compute_loss(cfg, outputs, labels, weights)
                if training:
                    (loss * rows).backward()
            if rows:
                sums[0] += float(loss.detach()) * rows
                for m, metric in enumerate(cfg.metrics):
                    sums[2 + m] += float(metric(outputs[0].detach(), labels[0])) * rows
            sums[1] += rows
            pending_rows += rows
            if training and not custom and ((step + 1) % k == 0 or step == steps - 1):
                _allreduce_gradients(model, pending_rows, cfg.compression, dist)
                optimizer.step()
                optimizer.zero_grad()
                pending_rows = 0
        if custom:
            optimizer.step()
    totals = torch.tensor(sums, dtype=torch.float64)
    dist.all_reduce(totals)
    totals = totals.numpy()
    count = max(totals[1], 1.0)
    result = {"loss": float(totals[0] / count)}
    for m, metric in enumerate(cfg.metrics):
        result[getattr(metric, "__name__", f"metric_{m}")] = float(totals[2 + m] / count)
    return result


def save_checkpoint(model: Any, optimizer: Any, epoch: int, history: List[dict]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch, "history": history}, buffer)
    return buffer.getvalue()


def load_checkpoint(data: bytes) -> dict:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _sources(cfg: TrainConfig, stack: Any, start: int, rank: int, world: int):
    """(training batches, steps per epoch, a function giving an epoch's validation batches or
    None, validation steps): from the rank's Parquet shards, or from the `data_module` entered
    on `stack`."""
    data = cfg.data
    if cfg.data_module is not None:
        train_steps = cfg.train_steps or shard_steps(data.train_rows, cfg.batch_size, world)
        val_steps = cfg.val_steps or (shard_steps(data.val_rows, cfg.val_batch_size, world)
                                      if data.val_path else None)
        module = stack.enter_context(cfg.data_module(**data_module_kwargs(cfg, rank, world,
                                                                          train_steps, val_steps)))
        train_batches = module_batches(cfg, module.train_data())
        if not data.val_path:
            return train_batches, train_steps, None, None
        val_iter = module_batches(cfg, module.val_data())
        return train_batches, train_steps, lambda: val_iter, val_steps
    train_reader = _open_reader(cfg, data.train_path, cfg.batch_size, cfg.shuffle, rank, world)
    train_batches = transformed(cfg, _cycle(train_reader, start))
    if not data.val_path:
        return train_batches, cfg.train_steps or train_reader.steps, None, None
    val_reader = _open_reader(cfg, data.val_path, cfg.val_batch_size, False, rank, world)
    if cfg.val_steps:  # a fixed number of steps: continue where the last epoch stopped
        val_cycle = transformed(cfg, _cycle(val_reader, 0))
        return train_batches, cfg.train_steps or train_reader.steps, lambda: val_cycle, cfg.val_steps
    return (train_batches, cfg.train_steps or train_reader.steps,
            lambda: transformed(cfg, val_reader.batches(0)), val_reader.steps)


def train(cfg: TrainConfig) -> Optional[bytes]:
    """A rank's whole fit; rank 0 returns the final checkpoint's bytes."""
    import torch
    import torch.distributed as dist

    use_cuda = cfg.use_gpu and torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed + rank)
        model, optimizer = cfg.model, cfg.optimizer  # pickled together: still bound to each other
        if device is not None:
            model.to(device)
        start, history = 0, []  # start: the run's epochs before this fit
        if cfg.checkpoint is not None:
            state = load_checkpoint(cfg.checkpoint)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["epoch"] + 1
            if rank == 0 and cfg.verbose:
                print(f"Resuming run {cfg.run_id} from its checkpoint after {start} epoch(s): "
                      f"training {cfg.epochs} more", flush=True)
        with contextlib.ExitStack() as stack:
            train_batches, train_steps, val_batches, val_steps = _sources(cfg, stack, start, rank, world)
            checkpoint_file = cfg.store.get_checkpoint_file(cfg.run_id) if cfg.store.saving_runs() else None
            last = None
            for epoch in range(cfg.epochs):
                entry: Dict[str, Any] = {"epoch": epoch}
                entry["train"] = _epoch_sums(cfg, model, train_batches, train_steps, optimizer, device, dist)
                if val_batches is not None:
                    entry["validation"] = _epoch_sums(cfg, model, val_batches(), val_steps, None, device, dist)
                history.append(entry)
                if rank == 0:
                    if cfg.verbose:
                        print(_describe(entry, cfg.epochs), flush=True)
                    last = save_checkpoint(model, optimizer, start + epoch, history)
                    if checkpoint_file:
                        cfg.store.write(checkpoint_file, last)
        return last if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _describe(entry: Dict[str, Any], epochs: int) -> str:
    parts = [f"epoch {entry['epoch'] + 1}/{epochs}"]
    for phase in ("train", "validation"):
        for name, value in entry.get(phase, {}).items():
            parts.append(f"{'val_' if phase == 'validation' else ''}{name}={value:.4f}")
    return " ".join(parts)
