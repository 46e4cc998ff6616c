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
``step S rank R size N sample X`` after every step, ``chaos-fault rank=R peer=-1 t=T`` as a fault
the program injects in itself strikes. Faults, each once per job (a marker file in ``CHAOS_DIR``),
on rank ``CHAOS_RANK`` of the first round (``CHAOS_FAULT``):

* ``raise``: ``ChaosError`` in step ``CHAOS_STEP`` (after the step counted its samples, before its
  other collectives): a bug that does not repeat, so the elastic driver replaces the worker;
* ``stop``: SIGSTOP of its own process in step ``CHAOS_STEP``, at the same point (a frozen rank);
* ``broadcast``: SIGKILL of its own process as its first transfer starts: the first state sync's
  broadcast, while its peers are in it. With ``CHAOS_LATE_RANK=L`` rank L enters that transfer
  ``CHAOS_LATE_SECONDS`` (default 1.5) late, after the others have failed and reset: it then
  waits on ranks that have left (the early-kill hang of issue 41).

* ``resets``: SIGKILL of its own process at the same point, ``CHAOS_REPEAT`` times,
  ``REPEAT_EVERY`` steps apart, each time in the worker that then has rank ``CHAOS_RANK`` (a
  replacement too): that many resets of the survivors, whose reset lines carry their resident
  memory (``rss_kb=``).

Faults at a phase, each a SIGKILL of the worker's own process, once per job:

* ``start``: rank ``CHAOS_RANK`` inside its first ``hvd.init()``, right after the first round's
  process group formed, while its peers still set up theirs;
* ``commit``: rank ``CHAOS_RANK`` inside ``state.commit()`` of step ``CHAOS_STEP``, after its save,
  as the commit's check for host updates (a broadcast) starts, its peers in it;
* ``last``: rank ``CHAOS_RANK`` as the last step starts, before its collectives;
* ``joining``: rank ``CHAOS_RANK`` in step ``CHAOS_STEP`` (as ``resets`` strikes), then the first
  replacement inside the ``hvd.init()`` of the round it joins, right after that round's process
  group formed.

``CHAOS_INIT_RANK=I`` adds a second fault: once the first has struck, the worker that had rank I
in the first round SIGKILLs itself inside its next ``hvd.init()``, right after its process group
formed, while its peers still set theirs up (the lost commit of issue 41). ``CHAOS_STUCK_RANK=S``
adds, in that same next ``hvd.init()``, a worker (rank S of the first round) whose set-up never
ends once its process group formed: it prints ``chaos-stuck rank=R pid=P`` and blocks, as a worker
left in gloo's ``connectFullMesh`` by a peer that quit the round would, and the runtime must make
it exit (``HOROVOD_COMPAT_LOST_ROUND_EXIT_SECONDS``). With ``CHAOS_INIT_AFTER=stuck`` the
``CHAOS_INIT_RANK`` worker dies only once that worker's group formed (its marker file), so both
strike in the same round.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time


class ChaosError(RuntimeError):
    """The exception a rank raises on purpose."""


def _first_time(folder: str, what: str = "raised") -> bool:
    """True the first time in the job (a marker file `what` in `folder`)."""
    try:
        os.close(os.open(os.path.join(folder, what), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


#: Steps between two strikes of a repeated fault (``CHAOS_REPEAT``).
REPEAT_EVERY = 8


def _strikes(folder: str) -> int:
    """How many times a repeated fault has struck so far (marker files ``raised``, ``raised.1``...)."""
    return sum(1 for name in os.listdir(folder) if name == "raised" or name.startswith("raised."))


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _strike(rank: int, sig: int) -> None:
    print(f"chaos-fault rank={rank} peer=-1 t={time.time():.6f}", flush=True)
    os.kill(os.getpid(), sig)


def _phase_faults(folder: str, fault: str, rank: int) -> None:
    """The faults that strike inside the runtime (``broadcast``, ``CHAOS_LATE_RANK``,
    ``CHAOS_INIT_RANK``): wrappers of the torch.distributed calls that mark those phases."""
    import torch.distributed as dist

    fault_rank = int(os.environ.get("CHAOS_RANK", "-1"))
    late = os.environ.get("CHAOS_LATE_RANK") == str(rank)
    broadcast = dist.broadcast
    if (fault == "broadcast" and rank == fault_rank) or late:
        def first_transfer(*args, **kwargs):
            if late and _first_time(folder, "late"):
                time.sleep(float(os.environ.get("CHAOS_LATE_SECONDS", "1.5")))
            elif not late and _first_time(folder):
                _strike(rank, signal.SIGKILL)
            return broadcast(*args, **kwargs)

        dist.broadcast = first_transfer
    if os.environ.get("CHAOS_INIT_RANK") == str(rank):
        init_process_group = dist.init_process_group

        def init(*args, **kwargs):
            done = init_process_group(*args, **kwargs)
            if os.path.exists(os.path.join(folder, "raised")) and _first_time(folder, "init"):
                after = os.environ.get("CHAOS_INIT_AFTER")  # a marker another worker makes
                deadline = time.monotonic() + 60
                while after and not os.path.exists(os.path.join(folder, after)) \
                        and time.monotonic() < deadline:
                    time.sleep(0.01)
                _strike(kwargs["rank"], signal.SIGKILL)
            return done

        dist.init_process_group = init
    elif os.environ.get("CHAOS_STUCK_RANK") == str(rank):
        init_process_group = dist.init_process_group

        def stuck_init(*args, **kwargs):
            done = init_process_group(*args, **kwargs)
            if os.path.exists(os.path.join(folder, "raised")) and _first_time(folder, "stuck"):
                print(f"chaos-stuck rank={kwargs['rank']} pid={os.getpid()}", flush=True)
                threading.Event().wait()  # no Python-level way out, as in a C++ connect
            return done

        dist.init_process_group = stuck_init


def _init_faults(folder: str, fault: str, fault_rank: int) -> None:
    """The faults that strike inside ``hvd.init()`` once a round's process group formed:
    ``start`` (rank `fault_rank` of the first round) and ``joining`` (the first worker started
    after the job's first fault: a replacement, in the round it joins)."""
    import torch.distributed as dist

    replacement = os.path.exists(os.path.join(folder, "raised"))
    if not (fault == "start" or (fault == "joining" and replacement)):
        return
    init_process_group = dist.init_process_group

    def init(*args, **kwargs):
        done = init_process_group(*args, **kwargs)
        if fault == "joining" and _first_time(folder, "joining"):
            _strike(kwargs["rank"], signal.SIGKILL)
        elif fault == "start" and kwargs["rank"] == fault_rank and _first_time(folder):
            _strike(kwargs["rank"], signal.SIGKILL)
        return done

    dist.init_process_group = init


def _commit_fault(state, folder: str, rank: int, fault_step: int) -> None:
    """``commit``: this rank dies inside ``state.commit()`` of step `fault_step`, after its save,
    as the commit's host-update check (a broadcast with its peers) starts."""
    check_host_updates = state.check_host_updates

    def check():
        if state.step >= fault_step and _first_time(folder):
            _strike(rank, signal.SIGKILL)
        check_host_updates()

    state.check_host_updates = check


def main() -> int:
    import torch

    import horovod.torch as hvd

    samples = int(os.environ.get("CHAOS_SAMPLES", "240"))
    folder = os.environ["CHAOS_DIR"]
    fault = os.environ.get("CHAOS_FAULT", "")
    fault_rank = int(os.environ.get("CHAOS_RANK", "-1"))
    fault_step = int(os.environ.get("CHAOS_STEP", "-1"))
    torch.set_num_threads(1)
    _init_faults(folder, fault, fault_rank)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0, cursor=0, counts=[0] * samples)
    log = open(os.path.join(folder, f"trained.{os.getpid()}"), "a", buffering=1)

    repeat = int(os.environ.get("CHAOS_REPEAT", "1"))

    def on_reset() -> None:
        print(f"chaos-reset rank={hvd.rank()} size={hvd.size()} pid={os.getpid()} "
              f"t={time.time():.6f} rss_kb={_rss_kb()}", flush=True)

    state.register_reset_callbacks([on_reset])
    _phase_faults(folder, fault, hvd.rank())
    if fault == "commit" and hvd.rank() == fault_rank:
        _commit_fault(state, folder, fault_rank, fault_step)

    @hvd.elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        print(f"chaos-pid rank={rank} size={size} pid={os.getpid()} t={time.time():.6f}", flush=True)
        while state.cursor < samples:
            struck = _strikes(folder) if fault == "resets" else 0
            raising = (fault in ("raise", "stop", "resets", "joining") and rank == fault_rank
                       and struck < repeat and state.step >= fault_step + REPEAT_EVERY * struck)
            if (fault == "last" and rank == fault_rank and state.cursor + size >= samples
                    and _first_time(folder)):
                _strike(rank, signal.SIGKILL)
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
            # between the step's collectives
            if raising and _first_time(folder, f"raised.{struck}" if struck else "raised"):
                if fault == "stop":
                    _strike(rank, signal.SIGSTOP)  # until the driver kills it
                elif fault in ("resets", "joining"):
                    _strike(rank, signal.SIGKILL)
                else:
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
