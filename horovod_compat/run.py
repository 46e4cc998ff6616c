"""`horovodrun`: run a command on N ranks, with the engine's output prefixing and failure model.

    horovodrun -np 2 python train.py --epochs 3
    horovodrun -np 2 -H localhost:2 --timeline-filename /tmp/tl.json pytest test_torch.py
    python -m horovod_compat.run -np 2 python train.py

The common subset of Horovod's CLI. Ranks run on this host (`-H localhost:N`); `--mpi` starts
them with `mpirun`, `--gloo` (the default) starts each rank directly. Either way `hvd.init()`
finds its rank and size. The exit status is 0 when every rank succeeded, else the first failing
rank's status (1 for an exception, 128+N for a signal N).
In gloo mode every rank also gets Horovod's slot variables (HOROVOD_RANK, HOROVOD_SIZE,
HOROVOD_LOCAL_RANK/SIZE, HOROVOD_CROSS_RANK/SIZE, HOROVOD_HOSTNAME), set by
`horovod_compat.run_rank`; `--mpi` runs do not get them, as with Horovod's MPI launcher.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import List, Optional, Sequence, Tuple

from distributor import CommandTarget, DistributedRunError, LaunchRequest, RankFailedError, launch
from distributor.launchers import MpirunLauncher, PythonLauncher

from .runner import horovod_environment

_LOCAL_HOSTS = {"localhost", "127.0.0.1", os.uname().nodename}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovodrun", description="Run a command on N Horovod ranks (horovod-compat).",
    )
    parser.add_argument("-np", "--num-proc", dest="np", type=int, required=True,
                        help="number of ranks to start")
    parser.add_argument("-H", "--hosts", default=None,
                        help="host:slots list; only this host is supported (e.g. localhost:2)")
    parser.add_argument("--timeline-filename", default=None,
                        help="record a Horovod timeline to this file (sets HOROVOD_TIMELINE)")
    parser.add_argument("--timeline-mark-cycles", action="store_true",
                        help="mark cycles in the timeline (HOROVOD_TIMELINE_MARK_CYCLES=1)")
    parser.add_argument("--start-timeout", type=float, default=120.0,
                        help="seconds for every rank to start (default 120)")
    parser.add_argument("--verbose", action="store_true", help="print the launch plan")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--gloo", action="store_true", help="start ranks directly (default)")
    backend.add_argument("--mpi", action="store_true", help="start ranks with mpirun")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def parse_hosts(spec: str) -> List[Tuple[str, int]]:
    """`host:slots,host:slots` → [(host, slots)]; a missing slot count means 1."""
    hosts = []
    for item in spec.split(","):
        host, _, slots = item.strip().partition(":")
        if not host or (slots and not slots.isdigit()):
            raise ValueError(f"bad host entry {item!r}: expected host:slots, e.g. localhost:2")
        hosts.append((host, int(slots or 1)))
    return hosts


def plan(argv: Optional[Sequence[str]] = None) -> Tuple[LaunchRequest, bool, bool]:
    """Parse and check the command line; returns (request, use mpirun, verbose)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given; e.g. horovodrun -np 2 python train.py")
    if args.np < 1:
        parser.error(f"-np must be at least 1, got {args.np}")
    if args.hosts:
        try:
            hosts = parse_hosts(args.hosts)
        except ValueError as exc:
            parser.error(str(exc))
        remote = [h for h, _ in hosts if h not in _LOCAL_HOSTS]
        if remote:
            parser.error(f"only this host is supported for now; remove {remote} from -H "
                         "(use HorovodRunner(np=N) or TorchDistributor(local_mode=False) for a cluster)")
        slots = sum(s for _, s in hosts)
        if slots < args.np:
            parser.error(f"-H offers {slots} slot(s) but -np asks for {args.np}; raise the slot count")
    if shutil.which(command[0]) is None and not os.path.isfile(command[0]):
        parser.error(f"command {command[0]!r} not found on PATH")
    env = horovod_environment()
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.timeline_mark_cycles:
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    if not args.mpi:
        # As Horovod's gloo launcher: every rank also gets HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*/HOSTNAME.
        command = [sys.executable, "-m", "horovod_compat.run_rank", *command]
    request = LaunchRequest(CommandTarget(tuple(command)), args.np, env=env, start_timeout=args.start_timeout)
    return request, args.mpi, args.verbose


def main(argv: Optional[Sequence[str]] = None) -> int:
    request, use_mpi, verbose = plan(argv)
    launcher = MpirunLauncher() if use_mpi else PythonLauncher()
    if verbose:
        print(f"horovodrun: {request.num_processes} rank(s) of {' '.join(request.target.argv)!r} "
              f"on this host via {'mpirun' if use_mpi else 'direct processes'}", file=sys.stderr)
    try:
        launch(request, launcher=launcher)
    except RankFailedError as exc:
        print(f"horovodrun: {exc}", file=sys.stderr)
        code = exc.exit_code
        return 128 - code if code is not None and code < 0 else (code or 1)
    except DistributedRunError as exc:
        print(f"horovodrun: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
