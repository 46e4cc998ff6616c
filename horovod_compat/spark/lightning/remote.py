"""What every rank of a Lightning `TorchEstimator` fit runs: a Lightning 2 Trainer with DDP.

The ranks' environment is torchrun's (the engine sets it), so Lightning's own DDP strategy finds
its world without Horovod. The LightningModule's `training_step(batch, batch_idx)` gets a dict of
tensors by column, as Horovod's estimator gave it; every rank takes the same number of steps.
Rank 0 writes a checkpoint (plain state dict, epoch, history) to the store after every epoch, and
copies what the Trainer wrote (ModelCheckpoint files, profiler output) into the run's folder.
A fit on a run with a checkpoint goes on up to `epochs` in all, as Lightning's resume does up to
`max_epochs` (docs/estimators.md; the torch estimator trains `epochs` more instead).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..torch.remote import RunConfig, data_module_kwargs, load_checkpoint, shard_steps


@dataclass
class LightningConfig(RunConfig):
    """A LightningModule's run: the Trainer's extras too."""

    callbacks: List[Any]
    profiler: Any
    logger: Any
    trainer_args: Dict[str, Any]
    log_every_n_steps: int
    checkpoint: Optional[bytes] = None
    verbose: int = 1
    use_gpu: bool = True
    buffer_row_groups: int = 4


def lightning_package(model: Any) -> Any:
    """`lightning.pytorch` or `pytorch_lightning`, whichever the module's class derives from."""
    import importlib

    for base in type(model).__mro__:
        if base.__name__ == "LightningModule":
            root = base.__module__.split(".")[0]
            return importlib.import_module("pytorch_lightning" if root == "pytorch_lightning" else "lightning.pytorch")
    return None


class _ShardBatches:
    """An iterable of a rank's batches; each pass over it is the next (reshuffled) data epoch."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.epoch = 0

    def __iter__(self):
        from ..torch.remote import to_tensors

        epoch, self.epoch = self.epoch, self.epoch + 1
        for batch in self.reader.batches(epoch):
            names = list(batch)
            yield dict(zip(names, to_tensors(batch, names)))

    def __len__(self) -> int:
        return self.reader.steps


def train(cfg: LightningConfig) -> Optional[bytes]:
    import torch

    from ..torch.remote import _open_reader, save_checkpoint

    pl = lightning_package(cfg.model)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    model = cfg.model
    start, history = 0, []
    if cfg.checkpoint is not None:
        state = load_checkpoint(cfg.checkpoint)
        model.load_state_dict(state["model"])
        start, history = state["epoch"] + 1, list(state["history"])
        if rank == 0 and cfg.verbose:
            print(f"Resuming run {cfg.run_id} at epoch {start} from its checkpoint", flush=True)
    train_reader = _open_reader(cfg, cfg.data.train_path, cfg.batch_size, cfg.shuffle, rank, world)
    train_batches = _ShardBatches(train_reader)
    train_batches.epoch = start
    val_batches = None
    if cfg.data.val_path:
        val_batches = _ShardBatches(_open_reader(cfg, cfg.data.val_path, cfg.val_batch_size, False,
                                                 rank, world))
    store, run_id = cfg.store, cfg.run_id
    checkpoint_file = store.get_checkpoint_file(run_id) if store.saving_runs() else None
    final: List[bytes] = []

    class _Record(pl.Callback):
        """History and the store's per-epoch checkpoint."""

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            if trainer.sanity_checking:
                return
            epoch = start + trainer.current_epoch
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                       if getattr(v, "numel", lambda: 1)() == 1}
            history.append({"epoch": epoch, **metrics})
            if trainer.global_rank == 0:
                if cfg.verbose:
                    shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
                    print(f"epoch {epoch + 1}/{cfg.epochs} {shown}", flush=True)
                data = save_checkpoint(module, _NoOptimizer(), epoch, history)
                final[:] = [data]
                if checkpoint_file:
                    store.write(checkpoint_file, data)

    torch.manual_seed(cfg.seed)
    with tempfile.TemporaryDirectory() as root:
        accelerator = "gpu" if cfg.use_gpu and torch.cuda.is_available() else "cpu"
        args = dict(
            max_epochs=max(cfg.epochs - start, 0), accelerator=accelerator, devices=local,
            num_nodes=max(world // local, 1), strategy="ddp" if world > 1 else "auto",
            callbacks=[_Record(), *cfg.callbacks], profiler=cfg.profiler,
            logger=cfg.logger if cfg.logger is not None else False, default_root_dir=root,
            enable_progress_bar=False, enable_model_summary=cfg.verbose > 1,
            use_distributed_sampler=False, log_every_n_steps=cfg.log_every_n_steps,
            num_sanity_val_steps=0,
        )
        if cfg.train_steps:
            args["limit_train_batches"] = cfg.train_steps
        if cfg.val_steps:
            args["limit_val_batches"] = cfg.val_steps
        args.update(cfg.trainer_args or {})
        trainer = pl.Trainer(**args)
        if args["max_epochs"] > 0 and cfg.data_module is not None:
            steps = (cfg.train_steps or shard_steps(cfg.data.train_rows, cfg.batch_size, world),
                     cfg.val_steps or (shard_steps(cfg.data.val_rows, cfg.val_batch_size, world)
                                       if cfg.data.val_path else None))
            trainer.fit(model, datamodule=cfg.data_module(**data_module_kwargs(cfg, rank, world, *steps)))
        elif args["max_epochs"] > 0:
            trainer.fit(model, train_dataloaders=train_batches, val_dataloaders=val_batches)
        if rank == 0 and store.saving_runs():
            store.sync_fn(run_id)(root)
    if rank != 0:
        return None
    if not final:  # nothing left to train, or EarlyStopping before the first epoch ended
        final.append(save_checkpoint(model, _NoOptimizer(), max(start - 1, 0), history))
    return final[0]


class _NoOptimizer:
    """Lightning modules own their optimizers; the checkpoint keeps an empty optimizer state."""

    @staticmethod
    def state_dict() -> dict:
        return {}
