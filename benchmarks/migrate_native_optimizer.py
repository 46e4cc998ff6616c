"""What ``hvd.DistributedOptimizer`` becomes where no ``DDP(model)`` wrap can be proven, against
hand-written DistributedDataParallel: steps/s and losses.

Two forms: the model made data-parallel in place, ``replicate(model, find_unused_parameters=True)``
(rules/inplace.py, the usual one), and the fallback optimizer ``_native_distributed_optimizer``
(rules/optimizer_hooks.py, where neither can be done). Issue 40's target: the native program's
steps/s >= 0.97 x hand-written DDP's, on the ~25M-parameter MLP and on the transformer of
benchmarks/train_step.py, 2 CPU ranks on gloo. One 2-rank job per model (torchrun's contract,
started by this project's engine) holds the three variants, each on its own copy of the same model
and batch; after a warm-up it times ``--rounds`` rounds of ``--steps`` steps, rotating which goes
first, so machine noise hits all alike. A round's rate is its slowest rank's; a ratio is
median(variant) / median(DDP). All see the same data from the same weights, so their losses must
agree: the largest difference from DDP's over every step is printed beside the speeds.

Usage: ``python benchmarks/migrate_native_optimizer.py [--steps 5 --rounds 9 --models mlp,transformer]``
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANTS = ("replicate", "fallback", "ddp")


def worker(kind: str, steps: int, rounds: int, warmup: int) -> Dict[str, Any]:
    """Every rank: the three variants side by side, timed in rotating rounds."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed._composable import replicate

    sys.path.insert(0, HERE)
    from train_step import build_model, make_batch

    from horovod_compat.migrate.helpers import HELPERS

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    namespace: Dict[str, Any] = {}
    exec(HELPERS["_native_wire_dtype"] + HELPERS["_native_distributed_optimizer"], namespace)  # as written
    x, y = make_batch(kind, dist.get_rank())
    models = {name: build_model(kind) for name in VARIANTS}
    replicate(models["replicate"], find_unused_parameters=True)  # the line the rewriter writes
    forward = {"replicate": models["replicate"], "fallback": models["fallback"],
               "ddp": torch.nn.parallel.DistributedDataParallel(models["ddp"])}
    optimizers = {name: torch.optim.SGD(models[name].parameters(), lr=1e-3, momentum=0.9) for name in VARIANTS}
    optimizers["fallback"] = namespace["_native_distributed_optimizer"](optimizers["fallback"])
    losses: Dict[str, List[float]] = {name: [] for name in VARIANTS}

    def step(name: str) -> Callable[[], None]:
        def run() -> None:
            optimizers[name].zero_grad()
            loss = F.mse_loss(forward[name](x), y)
            loss.backward()
            optimizers[name].step()
            losses[name].append(loss.item())
        return run

    variants = {name: step(name) for name in VARIANTS}
    for _ in range(warmup):
        for name in VARIANTS:
            variants[name]()
    rates: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                variants[name]()
            rates[name].append(steps / (time.perf_counter() - start))
    gaps = {name: max(abs(a - b) for a, b in zip(losses[name], losses["ddp"])) for name in VARIANTS}
    return {"rates": rates, "loss_gap": gaps, "steps": len(losses["ddp"]),
            "params": sum(p.numel() for p in models["ddp"].parameters()),
            "tensors": sum(1 for _ in models["ddp"].parameters())}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds per variant (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    ap.add_argument("--models", default="mlp,transformer")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from distributor import run_function

    print(f"{'model':<12} {'params':>8} {'tensors':>7} {'replicate st/s':>14} {'fallback st/s':>13} "
          f"{'DDP st/s':>9} {'replicate/DDP':>13} {'fallback/DDP':>12} {'target':>6} {'max loss gap':>12}")
    for kind in args.models.split(","):
        results = run_function(worker, kind, args.steps, args.rounds, args.warmup,
                               num_processes=2, return_all=True, timeout=1800,
                               env={"OMP_NUM_THREADS": "1"})
        median = {v: statistics.median(min(r["rates"][v][i] for r in results)
                                       for i in range(args.rounds)) for v in VARIANTS}
        gap = max(max(r["loss_gap"].values()) for r in results)
        print(f"{kind:<12} {results[0]['params'] / 1e6:>7.1f}M {results[0]['tensors']:>7} "
              f"{median['replicate']:>14.3f} {median['fallback']:>13.3f} {median['ddp']:>9.3f} "
              f"{median['replicate'] / median['ddp']:>13.2f} {median['fallback'] / median['ddp']:>12.2f} "
              f"{'>=0.97':>6} {gap:>12.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
