import pytorch_lightning as pl
import torch
import atexit
import gc
import os
import torch.distributed as dist


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    # TODO(horovod-compat): training_epoch_end: removed in Lightning 2.0 (fit raises): move it to on_train_epoch_end, keeping the step outputs yourself; Horovod's Lightning support ended with Lightning 1, so this never ran on a native stack. See https://lightning.ai/docs/pytorch/stable/upgrade/migration_guide.html
    def training_epoch_end(self, outputs):
        print(len(outputs))


class Printer(pl.Callback):
    # TODO(horovod-compat): on_epoch_end: no longer called since Lightning 1.8: use on_train_epoch_end / on_validation_epoch_end; Horovod's Lightning support ended with Lightning 1, so this never ran on a native stack. See https://lightning.ai/docs/pytorch/stable/upgrade/migration_guide.html
    def on_epoch_end(self, trainer, module):
        print("epoch")

    def on_train_epoch_end(self, trainer, module):
        print("train epoch")


def fit(use_gpu):
    if not dist.is_initialized():
        import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
        # no launcher (torchrun sets RANK, mpirun its own): rank 0 of 1, as Horovod ran without one
        if not any(name in os.environ for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
            os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    trainer = pl.Trainer(strategy="ddp", accelerator="gpu" if (1 if use_gpu else 0) else "cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")), max_epochs=2, callbacks=[Printer()])
    trainer.fit(Model())
    other = pl.Trainer(strategy="ddp", accelerator="auto", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")), max_epochs=1)
    return trainer, other
