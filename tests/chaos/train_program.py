"""The chaos tier's training program: a loop of Horovod collectives, run as a script
(``horovodrun -np 3 python train_program.py``) or as a function (``horovod.run(main, num_proc=3)``).

Each step runs an allreduce, a ``DistributedOptimizer`` step of a small model, an allgather, a
``broadcast_object`` and an async allreduce + ``synchronize``, and prints ``step S rank R``.
The harness (``harness.py``) injects the faults; the program does the two it must do itself,
chosen by environment variables ``CHAOS_FAULT=raise|close``, ``CHAOS_RANK`` and ``CHAOS_STEP``:

* ``raise``: rank CHAOS_RANK raises ``ChaosError`` at step CHAOS_STEP;
* ``close``: rank CHAOS_RANK shuts down every TCP connection it holds to one other rank's process
  (gloo's, found through ``/proc``), as a network fault between the two would, and prints the peer.

With ``CHAOS_PHASE`` (not ``step``) rank CHAOS_RANK strikes itself with ``CHAOS_FAULT``
(``kill``: SIGKILL, ``raise``: ``ChaosError``, ``stop``: SIGSTOP) at a phase it reaches, whatever
the time it takes to get there (`PHASES`):

* ``init``: inside ``hvd.init()``, right after its process group formed, while the others go on
  setting up the job's runtime;
* ``broadcast``: as the first broadcast (``broadcast_parameters``) starts, the others in it;
* ``checkpoint``: while rank 0 writes the checkpoint of step CHAOS_STEP (every ``CHECKPOINT_EVERY``
  steps it saves the model; rank 0 itself strikes halfway through the file, another rank as rank 0
  starts writing);
* ``last``: in the last step, before its collectives;
* ``shutdown``: at ``hvd.shutdown()``, after the last step.

Before a fault it prints ``chaos-fault rank=R peer=P t=T`` (T: ``time.time()``). At the start each
rank prints ``chaos-pid rank=R pid=PID``, so the harness can SIGKILL the process that trains.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Optional

#: Where a phase fault strikes (see the module); ``step``: the harness's faults at a chosen step.
PHASES = ("init", "broadcast", "checkpoint", "last", "shutdown")
CHECKPOINT_EVERY = 5


class ChaosError(RuntimeError):
    """The exception a rank raises on purpose."""


def strike(rank: int, fault: str, where: str) -> None:
    """The phase fault `fault` on this rank, now."""
    print(f"chaos-fault rank={rank} peer=-1 t={time.time():.6f}", flush=True)
    if fault == "raise":
        raise ChaosError(f"chaos: rank {rank} raises {where}")
    os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)


@dataclass(frozen=True)
class Plan:
    """What this run injects, from the ``CHAOS_*`` variables (see the module)."""

    fault: str
    rank: int
    step: int
    phase: str
    steps: int
    checkpoint: Optional[str]  # where rank 0 saves (the phase runs': none without CHAOS_DIR)

    @classmethod
    def from_env(cls) -> "Plan":
        folder = os.environ.get("CHAOS_DIR")
        return cls(os.environ.get("CHAOS_FAULT", ""), int(os.environ.get("CHAOS_RANK", "-1")),
                   int(os.environ.get("CHAOS_STEP", "-1")), os.environ.get("CHAOS_PHASE", "step"),
                   int(os.environ.get("CHAOS_STEPS", "400")),
                   os.path.join(folder, "checkpoint.pt") if folder else None)

    def at(self, phase: str, rank: int, where: str) -> None:
        """Strike here if this is the run's phase and `rank` its target."""
        if self.phase == phase and rank == self.rank:
            strike(rank, self.fault, where)

    def after_step(self, step: int, rank: int, model) -> None:
        """Every `CHECKPOINT_EVERY` steps rank 0 saves `model`; at the checkpoint phase's step the
        target strikes (rank 0 halfway through the file, another rank as rank 0 starts it)."""
        if not self.checkpoint or step % CHECKPOINT_EVERY != CHECKPOINT_EVERY - 1:
            return
        at_fault = self.phase == "checkpoint" and step == self.step
        if rank == 0:
            _save(model, self.checkpoint, rank, self.fault if at_fault and self.rank == 0 else "")
        elif at_fault and rank == self.rank:
            strike(rank, self.fault, "while rank 0 writes a checkpoint")


def _strike_in_init(fault: str, target: int) -> None:
    """Make rank `target` strike inside ``hvd.init()``, once its process group formed."""
    import torch.distributed as dist

    init_process_group = dist.init_process_group

    def init(*args, **kwargs):
        done = init_process_group(*args, **kwargs)
        if kwargs.get("rank") == target:
            strike(target, fault, "in hvd.init()")
        return done

    dist.init_process_group = init


def _socket_inodes(pid: int) -> dict:
    """{socket inode: fd} of process `pid`."""
    found = {}
    base = f"/proc/{pid}/fd"
    for fd in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(fd)
    return found


def _tcp_connections() -> list:
    """(local port, remote port, inode) of every established TCP connection of this host."""
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as table:
                lines = table.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] != "01":  # ESTABLISHED
                continue
            local, remote = (int(parts[i].rsplit(":", 1)[1], 16) for i in (1, 2))
            rows.append((local, remote, int(parts[9])))
    return rows


def close_connections_to_a_peer(pids: list, me: int) -> int:
    """Shut down every TCP connection between this process and the process of the lowest other
    rank it has one with (not the rendezvous store's); return that rank (-1: none found)."""
    store_port = int(os.environ.get("MASTER_PORT", "0"))
    mine = _socket_inodes(os.getpid())
    conns = _tcp_connections()
    by_local_port = {local: inode for local, _remote, inode in conns}
    for peer, pid in sorted(enumerate(pids), key=lambda p: (p[0] == me, p[0])):
        if peer == me:
            continue
        try:
            theirs = set(_socket_inodes(pid))
        except OSError:
            continue
        fds = [mine[inode] for local, remote, inode in conns
               if inode in mine and store_port not in (local, remote)
               and by_local_port.get(remote) in theirs]
        if not fds:
            continue
        print(f"chaos-fault rank={me} peer={peer} t={time.time():.6f}", flush=True)
        for fd in fds:
            sock = socket.socket(fileno=fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.detach()  # the fd stays its owner's (gloo's): only the connection ends
        return peer
    return -1


def main() -> int:
    import torch

    import horovod.torch as hvd

    plan = Plan.from_env()
    if plan.phase == "init":
        _strike_in_init(plan.fault, plan.rank)
    hvd.init()
    rank = hvd.rank()
    print(f"chaos-pid rank={rank} pid={os.getpid()}", flush=True)
    pids = hvd.allgather_object(os.getpid())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    plan.at("broadcast", rank, "as the first broadcast starts")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(plan.steps):
        if step == plan.steps - 1:
            plan.at("last", rank, "in the last step")
        if plan.phase == "step" and rank == plan.rank and step == plan.step:
            if plan.fault == "raise":
                strike(rank, plan.fault, f"at step {step}")
            if plan.fault == "close":
                close_connections_to_a_peer(pids, rank)
        total = hvd.allreduce(torch.ones(4) * rank, name="sum")
        x = torch.randn(32, 8)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        gathered = hvd.allgather(torch.full((2,), float(rank)), name="gather")
        config = hvd.broadcast_object({"step": step}, root_rank=0, name="config")
        handle = hvd.allreduce_async(torch.ones(3), name="async")
        hvd.synchronize(handle)
        assert config["step"] == step and gathered.numel() == 2 * hvd.size()
        print(f"step {step} rank {rank} sum {float(total[0]):.1f}", flush=True)
        plan.after_step(step, rank, model)
        time.sleep(0.01)
    plan.at("shutdown", rank, "at hvd.shutdown()")
    hvd.shutdown()
    return rank


def main_in(env: dict) -> int:
    """`main` with `env` added to this rank's environment first: the entry point for launchers
    that forward no environment of the caller's (``HorovodRunner``, ``TorchDistributor``)."""
    os.environ.update(env)
    return main()


def torch_main(env: dict) -> int:
    """The same loop written with torch.distributed and DDP, as a ``TorchDistributor`` user would
    (`env` added to the environment first): per step an all_reduce, a DDP step, an all_gather and
    a broadcast_object_list. The ``raise`` fault at a step is the program's own; so are the
    phase faults, at the same phases as `main` (``init``: right after ``init_process_group``;
    ``broadcast``: as DDP's wrap broadcasts rank 0's parameters; ``shutdown``: at
    ``destroy_process_group``)."""
    os.environ.update(env)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    plan = Plan.from_env()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    print(f"chaos-pid rank={rank} pid={os.getpid()}", flush=True)
    plan.at("init", rank, "right after init_process_group")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    plan.at("broadcast", rank, "as DDP's first broadcast starts")
    model = DistributedDataParallel(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(plan.steps):
        if step == plan.steps - 1:
            plan.at("last", rank, "in the last step")
        if plan.fault == "raise" and step == plan.step:
            plan.at("step", rank, f"at step {step}")
        total = torch.ones(4) * rank
        dist.all_reduce(total)
        optimizer.zero_grad()
        model(torch.randn(32, 8)).pow(2).mean().backward()
        optimizer.step()
        gathered = [torch.zeros(2) for _ in range(size)]
        dist.all_gather(gathered, torch.full((2,), float(rank)))
        config = [{"step": step}]
        dist.broadcast_object_list(config, src=0)
        assert config[0]["step"] == step
        print(f"step {step} rank {rank} sum {float(total[0]):.1f}", flush=True)
        plan.after_step(step, rank, module)
        time.sleep(0.01)
    plan.at("shutdown", rank, "at destroy_process_group()")
    dist.destroy_process_group()
    return rank


def _save(model, path: str, rank: int, fault: str) -> None:
    """Rank 0's checkpoint (torch.save to a new file, then renamed over the last); with `fault`,
    rank 0 strikes halfway through writing it."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    data = buffer.getvalue()
    with open(path + ".tmp", "wb") as handle:
        handle.write(data[:len(data) // 2])
        handle.flush()
        if fault:
            strike(rank, fault, "while it writes a checkpoint")
        handle.write(data[len(data) // 2:])
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
    sys.exit(0)
