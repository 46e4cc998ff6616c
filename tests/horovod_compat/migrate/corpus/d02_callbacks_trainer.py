"""Home-grown Keras/Lightning-like Trainer with a callback list, the kind of thing
teams write in-house: metric averaging over Horovod ranks and rank-0 checkpointing."""
import os
import tempfile

import torch
import torch.nn as nn
import horovod.torch as hvd

torch.set_num_threads(1)


class Callback:
    def on_train_begin(self, trainer):
        pass

    def on_step_end(self, trainer, step, logs):
        pass

    def on_epoch_end(self, trainer, epoch, logs):
        pass

    def on_train_end(self, trainer):
        pass


class CorpusLogger(Callback):
    def on_step_end(self, trainer, step, logs):
        print("CORPUS rank={} step={} loss={:.6f}".format(hvd.rank(), step, logs["loss"]), flush=True)

    def on_train_end(self, trainer):
        with torch.no_grad():
            s = sum(p.detach().double().sum() for p in trainer.model.parameters())
        print("CORPUS rank={} final={:.6f}".format(hvd.rank(), float(s)), flush=True)


class MetricAverageCallback(Callback):
    """Replaces per-rank epoch metrics by their cross-rank mean."""

    def on_epoch_end(self, trainer, epoch, logs):
        for key in sorted(logs):
            t = torch.tensor(logs[key], dtype=torch.float32)
            logs[key] = hvd.allreduce(t, name="metric.%s" % key).item()


class ModelCheckpoint(Callback):
    def __init__(self, dirpath, every=1):
        self.dirpath = dirpath
        self.every = every
        self.saved = []

    def on_epoch_end(self, trainer, epoch, logs):
        if hvd.rank() != 0 or (epoch + 1) % self.every:
            return
        path = os.path.join(self.dirpath, "ckpt_epoch%02d.pt" % epoch)
        torch.save({"epoch": epoch,
                    "model": trainer.model.state_dict(),
                    "optimizer": trainer.optimizer.state_dict(),
                    "val_loss": logs.get("val_loss")}, path)
        self.saved.append(path)

    def on_train_end(self, trainer):
        if hvd.rank() == 0:
            print("checkpoints written: %d" % len(self.saved), flush=True)


class History(Callback):
    def __init__(self):
        self.epochs = []

    def on_epoch_end(self, trainer, epoch, logs):
        self.epochs.append(dict(logs))
        if hvd.rank() == 0:
            print("epoch %d: %s" % (epoch, " ".join("%s=%.4f" % kv for kv in sorted(logs.items()))),
                  flush=True)


class Trainer:
    def __init__(self, model, optimizer, loss_fn, callbacks=None):
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.callbacks = list(callbacks or [])
        self.global_step = 0

    def _emit(self, hook, *args):
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def fit(self, train_batches, val_batches, epochs):
        self._emit("on_train_begin")
        for epoch in range(epochs):
            self.model.train()
            running = 0.0
            for xb, yb in train_batches:
                self.optimizer.zero_grad()
                loss = self.loss_fn(self.model(xb), yb)
                loss.backward()
                self.optimizer.step()
                running += loss.item()
                self._emit("on_step_end", self.global_step, {"loss": loss.item()})
                self.global_step += 1
            logs = {"loss": running / len(train_batches), "val_loss": self.evaluate(val_batches)}
            self._emit("on_epoch_end", epoch, logs)
        self._emit("on_train_end")

    @torch.no_grad()
    def evaluate(self, batches):
        self.model.eval()
        tot = 0.0
        for xb, yb in batches:
            tot += self.loss_fn(self.model(xb), yb).item()
        return tot / max(len(batches), 1)


def make_batches(gen, n_batches, bs, w_true):
    out = []
    for _ in range(n_batches):
        x = torch.randn(bs, 12, generator=gen)
        y = (x @ w_true).argmax(dim=1)
        out.append((x, y))
    return out


if __name__ == "__main__":
    hvd.init()
    torch.manual_seed(7)
    ckpt_dir = os.environ.get("CORPUS_TMP", tempfile.gettempdir())

    w_true = torch.randn(12, 4, generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(500 + hvd.rank())
    train = make_batches(g, 6, 16, w_true)
    val = make_batches(g, 2, 16, w_true)

    net = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    base_opt = torch.optim.RMSprop(net.parameters(), lr=0.003 * hvd.size(), alpha=0.9)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(base_opt, named_parameters=net.named_parameters())

    trainer = Trainer(net, opt, nn.CrossEntropyLoss(), callbacks=[
        MetricAverageCallback(),
        ModelCheckpoint(ckpt_dir),
        History(),
        CorpusLogger(),
    ])
    trainer.fit(train, val, epochs=3)
