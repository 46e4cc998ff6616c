"""CLI-tool style where heavy deps are imported lazily inside main(); Horovod is
imported there too and used only inside main (nothing else ever sees `hvd`).
"""
import os
import sys
import tempfile
import time


def parse_argv(argv):
    # hand-rolled "--key=value" parsing, as in small internal tools
    opts = {"epochs": 2, "batch": 24, "lr": 0.02, "seed": 7}
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            opts[k] = type(opts.get(k, v))(v)
    return opts


def make_model():
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv1d(1, 8, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Conv1d(8, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(4),
        nn.Flatten(),
        nn.Linear(64, 3),
    )


def make_signals(seed, n, length=32):
    """Three classes of noisy waveforms: sine, square, sawtooth."""
    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, length)
    y = torch.randint(0, 3, (n,), generator=g)
    freq = 2.0 + 3.0 * torch.rand(n, 1, generator=g)
    phase = torch.rand(n, 1, generator=g)
    arg = 2 * 3.14159265 * (freq * t + phase)
    sine = torch.sin(arg)
    square = torch.sign(sine)
    saw = 2 * ((freq * t + phase) % 1.0) - 1
    x = torch.where((y == 0).unsqueeze(1), sine, torch.where((y == 1).unsqueeze(1), square, saw))
    x = x + 0.2 * torch.randn(n, length, generator=g)
    return x.unsqueeze(1), y


def main(argv=None):
    import torch
    import torch.nn.functional as F
    import horovod.torch as hvd

    opts = parse_argv(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    torch.manual_seed(opts["seed"])

    x, y = make_signals(opts["seed"] * 1000 + rank, n=opts["batch"] * 5)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=opts["lr"] * world, momentum=0.5)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    t0 = time.time()
    step = 0
    bs = opts["batch"]
    for epoch in range(opts["epochs"]):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch + 31 * rank))
        for i in range(0, x.shape[0], bs):
            idx = perm[i:i + bs]
            opt.zero_grad()
            out = model(x[idx])
            loss = F.cross_entropy(out, y[idx])
            loss.backward()
            opt.step()
            step += 1
            print("CORPUS rank=%d step=%d loss=%.6f" % (rank, step, loss.item()), flush=True)

        val = hvd.allreduce(torch.tensor(loss.item()), name="epoch_loss").item()
        if rank == 0:
            print("epoch %d  loss(avg of last batch) %.4f  elapsed %.1fs" % (epoch, val, time.time() - t0))

    if rank == 0:
        out = os.path.join(os.environ.get("CORPUS_TMP", tempfile.gettempdir()), "b04_model.pt")
        torch.save(model.state_dict(), out)

    final = torch.stack([p.double().sum() for p in model.parameters()]).sum().item()
    print("CORPUS rank=%d final=%.6f" % (rank, final), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
