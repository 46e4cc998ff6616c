"""hvd.grouped_allreduce and hvd.grouped_allgather of many small tensors against
torch.distributed, 2 ranks on one host, CPU.

    python benchmarks/grouped.py [--tensors 100] [--numel 1024] [--iters 30]

Horovod fuses the tensors of a grouped allreduce into one transfer; raw ``torch.distributed``
offers one all_reduce per tensor (async, then waited) or the deprecated ``all_reduce_coalesced``.
Prints the median ms of each, and hvd's ratio to both, for hvd's data through shared memory (the
default on one host) and through gloo (``HOROVOD_COMPAT_SHM_DATA=0``, what ranks on several hosts
use).  A grouped allgather moves as one packed buffer per rank (below
``collectives.FUSED_ALLGATHER_BYTES``); it is shown beside the same call with packing turned off
(one transfer per tensor, as before) and beside ``dist.all_gather_into_tensor`` per tensor.  All
methods run interleaved in the same rounds, each timed after a barrier.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from typing import Dict, List


def _measure(tensors: int, numel: int, iters: int) -> Dict[str, float]:
    import torch
    import torch.distributed as dist
    import horovod.torch as hvd
    from horovod_compat.common import collectives

    warnings.simplefilter("ignore", FutureWarning)  # all_reduce_coalesced's deprecation notice
    torch.set_num_threads(1)
    hvd.init()
    ts = [torch.rand(numel) for _ in range(tensors)]

    def per_tensor() -> None:
        for w in [dist.all_reduce(t, async_op=True) for t in ts]:
            w.wait()

    outs = [torch.empty(2 * numel) for _ in ts]

    def gather_per_tensor() -> None:
        for w in [dist.all_gather_into_tensor(o, t, async_op=True) for o, t in zip(outs, ts)]:
            w.wait()

    def gather_unpacked() -> None:
        limit, collectives.FUSED_ALLGATHER_BYTES = collectives.FUSED_ALLGATHER_BYTES, 0
        try:
            hvd.grouped_allgather(ts)
        finally:
            collectives.FUSED_ALLGATHER_BYTES = limit

    methods = {
        "dist.all_reduce per tensor": per_tensor,
        "dist.all_reduce_coalesced": lambda: dist.all_reduce_coalesced(ts),
        "hvd.grouped_allreduce": lambda: hvd.grouped_allreduce(ts, op=hvd.Sum),
        "hvd.grouped_allreduce_": lambda: hvd.grouped_allreduce_(ts, op=hvd.Sum),
        "dist.all_gather_into_tensor per tensor": gather_per_tensor,
        "hvd.grouped_allgather": lambda: hvd.grouped_allgather(ts),
        "hvd.grouped_allgather, one transfer per tensor": gather_unpacked,
    }
    times: Dict[str, List[float]] = {k: [] for k in methods}
    for i in range(iters + 3):
        for name, fn in methods.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
            for t in ts:
                t.fill_(0.5)
    hvd.shutdown()
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--numel", type=int, default=1024, help="float32 elements per tensor")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from distributor import run_function

    print(f"2 ranks, {args.tensors} float32 tensors of {args.numel} elements, median ms "
          "(slowest rank)")
    for transport, shm_data in (("shared memory (default on one host)", "1"),
                                ("gloo (HOROVOD_COMPAT_SHM_DATA=0)", "0")):
        res = run_function(_measure, args.tensors, args.numel, args.iters, num_processes=2,
                           return_all=True, timeout=1800,
                           env={"OMP_NUM_THREADS": "1", "HOROVOD_COMPAT_SHM_DATA": shm_data})
        m = {k: max(r[k] for r in res) for k in res[0]}
        per, coal = m["dist.all_reduce per tensor"], m["dist.all_reduce_coalesced"]
        print(f"\n=== hvd data through {transport}")
        print(f"  dist.all_reduce per tensor  {per:8.3f}")
        print(f"  dist.all_reduce_coalesced   {coal:8.3f}")
        for k in ("hvd.grouped_allreduce", "hvd.grouped_allreduce_"):
            print(f"  {k:27s} {m[k]:8.3f}   / per tensor {m[k] / per:5.2f}   "
                  f"/ coalesced {m[k] / coal:5.2f}")
        gper = m["dist.all_gather_into_tensor per tensor"]
        print(f"  {'dist.all_gather_into_tensor per tensor':46s} {gper:8.3f}")
        for k in ("hvd.grouped_allgather", "hvd.grouped_allgather, one transfer per tensor"):
            print(f"  {k:46s} {m[k]:8.3f}   / per tensor {m[k] / gper:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
