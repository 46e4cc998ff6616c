"""horovod.ray's RayExecutor beside Ray Train's TorchTrainer, on one warm local Ray cluster.

Two figures, each the median over ``--repeats`` rounds (the two sides take turns in every round,
so a change of load spreads over both):

  start   a job of ``--workers`` workers running a trivial function, from the call to the values:
          ``RayExecutor(num_workers=N).start(); run(fn); shutdown()`` with ``fn`` =
          ``hvd.init(); return hvd.rank()``, against ``TorchTrainer(fn', ScalingConfig(num_workers=N))
          .fit()`` with ``fn'`` reading ``torch.distributed.get_rank()`` (TorchTrainer has set up
          the process group before it calls the function). Ray Train V1's TorchTrainer
          (``RAY_TRAIN_V2_ENABLED=0``): V2 needs pydantic, which the ray extra does not bring.
(The allreduce inside the actors beside horovodrun's: benchmarks/ray_allreduce.py.)

Usage: python benchmarks/ray_start.py [--repeats 3] [--workers 2]
Target (issue 45): RayExecutor's start at most 1.5x TorchTrainer.fit()'s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

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

    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)

    ex, tr = statistics.median(executor_s), statistics.median(trainer_s)
    print(f"{args.workers} workers, {args.repeats} rounds (median), warm local Ray {ray.__version__}")
    print(f"{'':34}{'seconds':>10}")
    print(f"{'RayExecutor start+run+shutdown':34}{ex:>10.2f}   rounds: {', '.join(f'{s:.2f}' for s in executor_s)}")
    print(f"{'TorchTrainer.fit()':34}{tr:>10.2f}   rounds: {', '.join(f'{s:.2f}' for s in trainer_s)}")
    print(f"{'ratio RayExecutor / TorchTrainer':34}{ex / tr:>10.2f}   (target <= 1.5)")


if __name__ == "__main__":
    main()
