"""Launch overhead of HorovodRunner in driver-only mode against plain mpirun.

The job, the same in both: `import horovod.torch as hvd; hvd.init(); hvd.allreduce(...)`.
  ours    HorovodRunner(np=-2).run(trivial)       (mpirun under the engine, results returned)
  mpirun  mpirun -np 2 python trivial.py          (process wall time)

Usage: python benchmarks/launch_mpi.py [--repeats 5]
Target (issue 5): ours <= 1.2 x plain mpirun.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from launch import timed  # benchmarks/launch.py, beside this script

TRIVIAL_SCRIPT = """
import torch
import horovod.torch as hvd
hvd.init()
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
"""


def trivial():
    import torch

    import horovod.torch as hvd

    hvd.init()
    return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from distributor.launchers.mpirun import mpirun_command
    from horovod_compat.runner import HorovodRunner

    def ours():
        assert HorovodRunner(np=-2).run(trivial) == 2.0

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(TRIVIAL_SCRIPT)
    command = mpirun_command(2, [sys.executable, script.name])

    def plain():
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        ours()  # warm the page cache for every contender alike
        results = {"ours": timed(ours, args.repeats), "mpirun": timed(plain, args.repeats)}
    finally:
        os.unlink(script.name)
    medians = {name: statistics.median(times) for name, times in results.items()}
    print(f"median wall time of a trivial 2-rank Horovod job ({args.repeats} runs each)")
    for name, times in results.items():
        print(f"  {name:7s} {medians[name]:6.2f} s   ({', '.join(f'{t:.2f}' for t in times)})")
    print(f"ratio HorovodRunner(np=-2) / plain mpirun = {medians['ours'] / medians['mpirun']:.2f}   (target <= 1.20)")


if __name__ == "__main__":
    main()
