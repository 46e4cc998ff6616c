"""The chaos tier's elastic training program: Horovod elastic code (``hvd.elastic.run``, a
``TorchState`` that commits every step), run by ``horovodrun --min-np 2 --max-np 3
--host-discovery-script ... python elastic_program.py``.

The data set is ``CHAOS_SAMPLES`` samples (default 240; the harness uses 360), dealt out by a
cursor kept in the state: at each step rank R of a world of N processes trains on sample
``cursor + R``, and the step adds N to the cursor. Which samples the job has counted is part of
the state too: ``counts`` (one number per sample) gets the allreduce of each rank's one-hot vector
of its sample, at the start of the step, before the step's other collectives (the optimizer's, a
loss allreduce), so that a step whose later collective failed must be rolled back. A step counted
twice, a state that was not restored, or a newcomer that did not get rank 0's state shows up as a
count that is not 1. Rank 0 of the last round writes the final ``counts`` to
``CHAOS_DIR/result.json``; every rank appends the samples it trained on (after the allreduce that
counted them) to ``CHAOS_DIR/trained.<pid>``.

Lines for the harness: ``chaos-pid rank=R size=N pid=P t=T`` each time a worker (re)enters the
training function, ``chaos-reset rank=R size=N pid=P t=T`` from the reset callback, and
``step S rank R size N sample X`` after every step. ``CHAOS_FAULT=raise`` makes rank
``CHAOS_RANK`` raise ``ChaosError`` in step ``CHAOS_STEP`` (after the step counted its samples,
before its other collectives), once per job (a marker file in ``CHAOS_DIR``): a bug that does not
repeat, so the elastic driver replaces the worker.
"""
from __future__ import annotations

import json
import os
import sys
import time


class ChaosError(RuntimeError):
    """The exception a rank raises on purpose."""


def _first_raise(folder: str) -> bool:
    """True the first time in the job (a marker file in `folder`)."""
    try:
        os.close(os.open(os.path.join(folder, "raised"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main() -> int:
    import torch

    import horovod.torch as hvd

    samples = int(os.environ.get("CHAOS_SAMPLES", "240"))
    folder = os.environ["CHAOS_DIR"]
    fault = os.environ.get("CHAOS_FAULT", "")
    fault_rank = int(os.environ.get("CHAOS_RANK", "-1"))
    fault_step = int(os.environ.get("CHAOS_STEP", "-1"))
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0, cursor=0, counts=[0] * samples)
    log = open(os.path.join(folder, f"trained.{os.getpid()}"), "a", buffering=1)

    def on_reset() -> None:
        print(f"chaos-reset rank={hvd.rank()} size={hvd.size()} pid={os.getpid()} "
              f"t={time.time():.6f}", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        print(f"chaos-pid rank={rank} size={size} pid={os.getpid()} t={time.time():.6f}", flush=True)
        while state.cursor < samples:
            raising = fault == "raise" and rank == fault_rank and state.step >= fault_step
            sample = state.cursor + rank
            onehot = torch.zeros(samples)
            if sample < samples:
                onehot[sample] = 1.0
            counted = hvd.allreduce(onehot, op=hvd.Sum, name="counts")
            if sample < samples:
                log.write(f"{sample}\n")
            # counted before the step's other collectives: a failure in them must roll it back
            state.counts = [c + int(n) for c, n in zip(state.counts, counted.tolist())]
            state.cursor += size
            state.step += 1
            if raising and _first_raise(folder):  # between the step's collectives
                print(f"chaos-fault rank={rank} peer=-1 t={time.time():.6f}", flush=True)
                raise ChaosError(f"chaos: rank {rank} raises in step {state.step}")
            generator = torch.Generator().manual_seed(sample)
            x = torch.randn(4, 8, generator=generator)
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            hvd.allreduce(loss.detach(), name="loss")
            print(f"step {state.step} rank {rank} size {size} sample {sample}", flush=True)
            time.sleep(0.02)
            state.commit()
        return size

    size = train(state)
    if hvd.rank() == 0:
        path = os.path.join(folder, "result.json")
        with open(path + ".tmp", "w") as out:
            json.dump({"counts": state.counts, "size": size, "steps": state.step}, out)
        os.replace(path + ".tmp", path)
    print(f"chaos-done rank={hvd.rank()} size={size}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
