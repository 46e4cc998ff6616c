"""Metric averaging with async collectives, like a hand-rolled MetricLogger in a
training framework: submit all allreduces at once, overlap with the next work,
then synchronize; one in-place op is polled until ready.
"""
import collections
import os
import tempfile
import time

import torch
import torch.nn as nn
import horovod.torch as hvd

torch.set_num_threads(1)


class MetricTracker:
    """Keeps per-step local metrics and averages them across workers asynchronously."""

    def __init__(self, names):
        self.names = list(names)
        self.history = collections.defaultdict(list)
        self._pending = None

    def submit(self, values):
        tensors = [torch.tensor(float(values[n]), dtype=torch.float32) for n in self.names]
        # one named op per metric; names must be unique while in flight
        handles = [hvd.allreduce_async(t, name=f"m{i}") for i, t in enumerate(tensors)]
        self._pending = handles

    def collect(self):
        if self._pending is None:
            return {}
        out = {}
        for n, h in zip(self.names, self._pending):
            out[n] = hvd.synchronize(h).item()
            self.history[n].append(out[n])
        self._pending = None
        return out


def make_data(rank):
    g = torch.Generator().manual_seed(8080 + rank)
    x = torch.randn(200, 5, generator=g)
    logits = x @ torch.tensor([[1.0, -1.0], [0.5, 0.5], [-0.3, 0.8], [0.0, 1.2], [0.9, -0.4]])
    y = logits.argmax(1)
    return x, y


def main():
    hvd.init()
    torch.manual_seed(5)
    rank = hvd.rank()

    x, y = make_data(rank)
    model = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.RMSprop(model.parameters(), lr=3e-3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    tracker = MetricTracker(["loss", "acc", "grad_norm"])
    bs = 25
    step = 0
    for epoch in range(2):
        for i in range(0, x.shape[0], bs):
            xb, yb = x[i:i + bs], y[i:i + bs]
            opt.zero_grad()
            out = model(xb)
            loss = crit(out, yb)
            loss.backward()
            opt.step()
            step += 1
            print(f"CORPUS rank={rank} step={step} loss={loss.item():.6f}", flush=True)

            gnorm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            acc = (out.argmax(1) == yb).float().mean().item()
            # results of the previous step are ready by now; collect, then submit the new ones
            prev = tracker.collect()
            tracker.submit({"loss": loss.item(), "acc": acc, "grad_norm": gnorm.item()})
            if prev and rank == 0 and step % 4 == 0:
                print("step %3d | loss %.4f acc %.3f |g| %.4f" % (step - 1, prev["loss"], prev["acc"], prev["grad_norm"]))
        tracker.collect()

        # count of samples seen, summed in place; poll until the op completes
        seen = torch.tensor([float(x.shape[0])], dtype=torch.float64)
        handle = hvd.allreduce_async_(seen, name="samples_seen", op=hvd.Sum)
        waited = 0
        while not hvd.poll(handle):
            time.sleep(0.001)
            waited += 1
        hvd.synchronize(handle)
        if rank == 0:
            print(f"epoch {epoch}: {int(seen.item())} samples across workers (polled {waited}x)")

    if rank == 0:
        path = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b08_metrics.csv")
        with open(path, "w") as fh:
            fh.write("loss,acc,grad_norm\n")
            for row in zip(*(tracker.history[n] for n in tracker.names)):
                fh.write(",".join("%.6f" % v for v in row) + "\n")

    final = sum(p.double().sum() for p in model.parameters()).item()
    print(f"CORPUS rank={rank} final={final:.6f}", flush=True)


if __name__ == "__main__":
    main()
