"""Launch overhead: wall time of `.run()` of a trivial 2-rank job, side by side.

The job: init_process_group("gloo") + one all_reduce, on 2 CPU ranks.
  ours     distributor.TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
  pyspark  pyspark.ml.torch.distributor.TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
  torchrun torchrun --standalone --nproc_per_node=2 (the same job as a script; process wall time)

Usage: python benchmarks/launch.py [--repeats 5]
Target (issue 2): ours <= 0.5 x pyspark, and ours <= torchrun.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time

TRIVIAL_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""


def trivial_job():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def run_ours():
    from distributor import TorchDistributor

    assert TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(trivial_job) == 2.0


def make_pyspark_runner():
    from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor
    from pyspark.sql import SparkSession

    SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()

    def run():
        with contextlib.redirect_stdout(io.StringIO()):
            result = PySparkTorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(trivial_job)
        assert result == 2.0

    return run


def make_torchrun_runner(script_path):
    def run():
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script_path],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(TRIVIAL_SCRIPT)
    try:
        run_ours()  # warm the page cache for torch's import, for every contender alike
        results = {"ours": timed(run_ours, args.repeats)}
        results["torchrun"] = timed(make_torchrun_runner(script.name), args.repeats)
        results["pyspark"] = timed(make_pyspark_runner(), args.repeats)
    finally:
        os.unlink(script.name)
    medians = {name: statistics.median(times) for name, times in results.items()}
    print(f"median wall time of .run() of a trivial 2-rank gloo job ({args.repeats} runs each)")
    for name, times in results.items():
        spread = ", ".join(f"{t:.2f}" for t in times)
        print(f"  {name:9s} {medians[name]:6.2f} s   ({spread})")
    print(f"ratio ours / pyspark  = {medians['ours'] / medians['pyspark']:.2f}   (target <= 0.50)")
    print(f"ratio ours / torchrun = {medians['ours'] / medians['torchrun']:.2f}   (target <= 1.00)")


if __name__ == "__main__":
    main()
