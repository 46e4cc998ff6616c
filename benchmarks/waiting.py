"""What a rank pays while it waits for a late peer: CPU seconds per second waited, 2 ranks on one
host, CPU.

    python benchmarks/waiting.py [--late 0.005 0.05 0.5 4] [--repeats 3]

Rank 1 sleeps LATE seconds before an allreduce that rank 0 already waits in (a peer importing,
compiling a graph, writing a checkpoint). The waiting rank's CPU time is measured with
``time.process_time`` (all its threads), beside how long past the peer's arrival it returned (the
wake-up delay). Shared memory (the default on one host) waits by spinning briefly, yielding, then
sleeping in growing steps (``_shm.PeerWatch``); gloo (``HOROVOD_COMPAT_SHM_DATA=0
HOROVOD_COMPAT_SHM_CONTROL=0``) blocks in the kernel. On 2 cores a spinning waiter takes the CPU
the late peer needs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List, Sequence


def _measure(lates: Sequence[float], repeats: int) -> Dict[float, List[float]]:
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    out: Dict[float, List[float]] = {}
    for late in lates:
        cpu, delay = [], []
        for _ in range(repeats):
            hvd.allreduce(torch.ones(1), name="start")
            c0, t0 = time.process_time(), time.perf_counter()
            if hvd.rank() == 1:
                time.sleep(late)
            hvd.allreduce(torch.ones(1), name="late")
            cpu.append(time.process_time() - c0)
            delay.append(time.perf_counter() - t0 - late)
        out[late] = [statistics.median(cpu), statistics.median(delay)]
    hvd.shutdown()
    return out


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--late", type=float, nargs="+", default=[0.005, 0.05, 0.5, 4.0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from distributor import run_function

    print("2 ranks; rank 1 arrives LATE s after rank 0; median of", args.repeats)
    print(f"{'transport':38s} {'late s':>7s} {'waiter CPU s':>13s} {'CPU per s':>10s} "
          f"{'wake-up ms':>11s}")
    for transport, value in (("shared memory (default on one host)", "1"),
                             ("gloo (shared memory off)", "0")):
        res = run_function(_measure, args.late, args.repeats, num_processes=2, return_all=True,
                           timeout=600, env={"OMP_NUM_THREADS": "1", "HOROVOD_COMPAT_SHM_DATA": value,
                                             "HOROVOD_COMPAT_SHM_CONTROL": value})
        for late in args.late:
            cpu, delay = res[0][late]  # rank 0 waited
            print(f"{transport:38s} {late:7.3f} {cpu:13.3f} {cpu / late:10.3f} {delay * 1e3:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
