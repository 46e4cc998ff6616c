"""horovod.ray's RayExecutor beside Ray Train's TorchTrainer, on one warm local Ray cluster.

Two figures, each the median over ``--repeats`` rounds (the two sides take turns in every round,
so a change of load spreads over both):

  start   a job of ``--workers`` workers running a trivial function, from the call to the values:
          ``RayExecutor(num_workers=N).start(); run(fn); shutdown()`` with ``fn`` =
          ``hvd.init(); return hvd.rank()``, against ``TorchTrainer(fn', ScalingConfig(num_workers=N))
          .fit()`` with ``fn'`` reading ``torch.distributed.get_rank()`` (TorchTrainer has set up
          the process group before it calls the function). Ray Train V1's TorchTrainer
          (``RAY_TRAIN_V2_ENABLED=0``): V2 needs pydantic, which the ray extra does not bring.
  allreduce  inside a started RayExecutor: ``hvd.allreduce`` of ``--size`` float32 elements, mean
          over ``--iters`` (after 3 warm-up calls), the slower rank; beside the same loop under
          ``horovodrun -np N`` on this host (the same runtime: shared memory on one node).

Usage: python benchmarks/ray_start.py [--repeats 3] [--workers 2] [--size 1048576] [--iters 20]
Target (issue 45): RayExecutor's start at most 1.5x TorchTrainer.fit()'s; the allreduce the same
as under horovodrun.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ALLREDUCE = """\
import sys, time, torch
import horovod.torch as hvd

def allreduce_seconds(size, iters):
    hvd.init()
    t = torch.ones(size)
    for _ in range(3):
        hvd.allreduce(t, name="warm")
    start = time.perf_counter()
    for _ in range(iters):
        hvd.allreduce(t, name="timed")
    return (time.perf_counter() - start) / iters

if __name__ == "__main__":
    print("SECONDS", allreduce_seconds(int(sys.argv[1]), int(sys.argv[2])), flush=True)
"""


def rank_after_init():
    import horovod.torch as hvd

    hvd.init()
    return hvd.rank()


def torch_rank():
    import torch.distributed as dist

    return dist.get_rank()


def ray_executor_start(workers: int) -> float:
    from horovod.ray import RayExecutor

    start = time.perf_counter()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=workers)
    executor.start()
    ranks = executor.run(rank_after_init)
    executor.shutdown()
    took = time.perf_counter() - start
    assert ranks == list(range(workers)), ranks
    return took


def torch_trainer_fit(workers: int, storage: str) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    start = time.perf_counter()
    trainer = TorchTrainer(torch_rank, scaling_config=ScalingConfig(num_workers=workers),
                           run_config=RunConfig(storage_path=storage))
    trainer.fit()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    os.environ["RAY_TRAIN_V2_ENABLED"] = "0"
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # (TorchTrainer holds one CPU for its trainer actor beside the workers)
    ray.init(num_cpus=args.workers + 1, include_dashboard=False, configure_logging=False,
             log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    storage = tempfile.mkdtemp(prefix="ray_start_")
    try:
        ray_executor_start(args.workers)  # (warm-up: the cluster's first workers)
        torch_trainer_fit(args.workers, storage)
        executor_s, trainer_s = [], []
        for _ in range(args.repeats):
            executor_s.append(ray_executor_start(args.workers))
            trainer_s.append(torch_trainer_fit(args.workers, storage))

        from horovod.ray import RayExecutor

        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "allreduce_bench.py")
            with open(script, "w") as f:
                f.write(ALLREDUCE)
            sys.path.insert(0, tmp)
            import allreduce_bench

            ray.cloudpickle.register_pickle_by_value(allreduce_bench)
            executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.workers)
            executor.start()
            in_ray = max(executor.run(allreduce_bench.allreduce_seconds, args=[args.size, args.iters]))
            executor.shutdown()
            done = subprocess.run([sys.executable, "-m", "horovod_compat.run", "-np", str(args.workers),
                                   sys.executable, script, str(args.size), str(args.iters)],
                                  capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            times = [float(line.split()[-1]) for line in done.stdout.splitlines() if "SECONDS" in line]
            assert len(times) == args.workers, done.stdout[-2000:] + done.stderr[-2000:]
            under_horovodrun = max(times)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)

    ex, tr = statistics.median(executor_s), statistics.median(trainer_s)
    print(f"{args.workers} workers, {args.repeats} rounds (median), warm local Ray {ray.__version__}")
    print(f"{'':34}{'seconds':>10}")
    print(f"{'RayExecutor start+run+shutdown':34}{ex:>10.2f}   rounds: {', '.join(f'{s:.2f}' for s in executor_s)}")
    print(f"{'TorchTrainer.fit()':34}{tr:>10.2f}   rounds: {', '.join(f'{s:.2f}' for s in trainer_s)}")
    print(f"{'ratio RayExecutor / TorchTrainer':34}{ex / tr:>10.2f}   (target <= 1.5)")
    mb = args.size * 4 / 2**20
    print(f"allreduce of {mb:g} MB float32, {args.iters} iterations, slower rank:")
    print(f"{'in RayExecutor actors':34}{in_ray * 1e3:>10.2f} ms")
    print(f"{'under horovodrun':34}{under_horovodrun * 1e3:>10.2f} ms")
    print(f"{'ratio Ray / horovodrun':34}{in_ray / under_horovodrun:>10.2f}   (target ~1)")


if __name__ == "__main__":
    main()
