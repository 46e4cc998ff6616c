"""The fuzz tier's training program: a small deterministic Horovod training loop, run as
``horovodrun -np N python train_program.py`` (``FUZZ_ELASTIC=1``: inside ``hvd.elastic.run``,
for ``horovodrun --min-np ...``).

Each rank trains a small MLP on its own seeded data with ``hvd.DistributedOptimizer`` for
``FUZZ_STEPS`` steps, allreduces its loss each step and prints ``step S rank R loss L``. At the end
it prints ``fuzz-result rank=R params=<sha256 of the final weights> loss=<last global loss>``:
the same bytes in every run with the same configuration, fuzzed or not. At the start it prints
``fuzz-pid rank=R pid=PID`` (the process that trains, whose memory the harness watches).

``FUZZ_HOLD_DIR=DIR``: before the first TCP mesh of the job is connected, each rank prints
``fuzz-mesh rank=R port=P`` (its mesh listener, open only while the mesh is set up) and waits
until ``DIR/go`` exists, so that the harness can queue strangers' connections on every listener
ahead of the ranks' own (the set-up failure of issue 28).
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path


def _hold_mesh_setup(hold_dir: Path) -> None:
    from horovod_compat.common import _mesh

    connect = _mesh.Mesh._connect.__func__
    held = []

    def hold_then_connect(cls, ls, me, addrs, secret):
        if not held:  # the job's first mesh only
            held.append(me)
            print(f"fuzz-mesh rank={me} port={ls.getsockname()[1]}", flush=True)
            deadline = time.monotonic() + 60
            while not (hold_dir / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return connect(cls, ls, me, addrs, secret)

    _mesh.Mesh._connect = classmethod(hold_then_connect)


def _digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    import torch

    import horovod.torch as hvd

    steps = int(os.environ.get("FUZZ_STEPS", "200"))
    pause = float(os.environ.get("FUZZ_STEP_PAUSE", "0.01"))
    hold = os.environ.get("FUZZ_HOLD_DIR")
    if hold:
        _hold_mesh_setup(Path(hold))
    hvd.init()
    rank = hvd.rank()
    print(f"fuzz-pid rank={rank} pid={os.getpid()}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def batch(step: int):
        g = torch.Generator().manual_seed(1000 * step + hvd.rank())
        x = torch.randn(16, 8, generator=g)
        return x, x.sum(dim=1, keepdim=True).sin()

    def train(state) -> float:
        loss_sum = float("nan")
        while state.step < steps:
            x, y = batch(state.step)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum = float(hvd.allreduce(loss.detach(), name="loss", op=hvd.Sum))
            print(f"step {state.step} rank {hvd.rank()} loss {loss_sum:.6f}", flush=True)
            state.step += 1
            if os.environ.get("FUZZ_ELASTIC") == "1":
                state.commit()
            time.sleep(pause)
        return loss_sum

    if os.environ.get("FUZZ_ELASTIC") == "1":
        state = hvd.elastic.TorchState(model, optimizer, step=0)
        loss = hvd.elastic.run(train)(state)
    else:
        class _Step:
            step = 0

        loss = train(_Step())
    print(f"fuzz-result rank={hvd.rank()} params={_digest(model)} loss={loss:.9f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
