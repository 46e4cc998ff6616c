import pytorch_lightning as pl
import torch
import horovod.torch as hvd


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def training_epoch_end(self, outputs):
        print(len(outputs))


class Printer(pl.Callback):
    def on_epoch_end(self, trainer, module):
        print("epoch")

    def on_train_epoch_end(self, trainer, module):
        print("train epoch")


def fit(use_gpu):
    hvd.init()
    trainer = pl.Trainer(accelerator="horovod", gpus=1 if use_gpu else 0, max_epochs=2, callbacks=[Printer()])
    trainer.fit(Model())
    other = pl.Trainer(strategy="horovod", max_epochs=1)
    return trainer, other
