"""The rewriter's native optimizer (``_native_distributed_optimizer``, what ``hvd.DistributedOptimizer``
becomes where no DDP wrap can be proven) against DistributedDataParallel: steps/s and losses.

Issue 25's target: steps/s >= 0.97 x DDP's on the ~25M-parameter MLP and on the transformer of
benchmarks/train_step.py, 2 CPU ranks on gloo. One 2-rank job per model (torchrun's contract,
started by this project's engine) holds both variants, each on its own copy of the same model and
batch; after a warm-up it times ``--rounds`` rounds of ``--steps`` steps, alternating which goes
first, so machine noise hits both alike. A round's rate is its slowest rank's; the ratio is
median(native) / median(DDP). Both variants see the same data from the same weights, so their
losses must agree: the largest difference over every step is printed beside the speeds.

Usage: ``python benchmarks/migrate_native_optimizer.py [--steps 5 --rounds 9 --models mlp,transformer]``
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(kind: str, steps: int, rounds: int, warmup: int) -> Dict[str, Any]:
    """Every rank: the native optimizer and DDP side by side, timed in alternating rounds."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    sys.path.insert(0, HERE)
    from train_step import build_model, make_batch

    from horovod_compat.migrate.helpers import HELPERS

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    namespace: Dict[str, Any] = {}
    exec(HELPERS["_native_distributed_optimizer"], namespace)  # the code the rewriter writes
    x, y = make_batch(kind, dist.get_rank())
    native_model, ddp_model = build_model(kind), build_model(kind)
    native_opt = namespace["_native_distributed_optimizer"](
        torch.optim.SGD(native_model.parameters(), lr=1e-3, momentum=0.9))
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=1e-3, momentum=0.9)
    losses: Dict[str, List[float]] = {"native": [], "ddp": []}

    def native_step() -> None:
        native_opt.zero_grad()
        loss = F.mse_loss(native_model(x), y)
        loss.backward()
        native_opt.step()
        losses["native"].append(loss.item())

    def ddp_step() -> None:
        ddp_opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        ddp_opt.step()
        losses["ddp"].append(loss.item())

    variants = {"native": native_step, "ddp": ddp_step}
    for _ in range(warmup):
        native_step()
        ddp_step()
    rates: Dict[str, List[float]] = {"native": [], "ddp": []}
    for r in range(rounds):
        for name in (("native", "ddp") if r % 2 == 0 else ("ddp", "native")):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                variants[name]()
            rates[name].append(steps / (time.perf_counter() - start))
    gap = max(abs(a - b) for a, b in zip(losses["native"], losses["ddp"]))
    return {"rates": rates, "loss_gap": gap, "steps": len(losses["native"]),
            "params": sum(p.numel() for p in native_model.parameters()),
            "tensors": sum(1 for _ in native_model.parameters())}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds per variant (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    ap.add_argument("--models", default="mlp,transformer")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from distributor import run_function

    print(f"{'model':<12} {'params':>8} {'tensors':>7} {'native st/s':>11} {'DDP st/s':>9} "
          f"{'ratio':>6} {'target':>6} {'max loss gap':>12}")
    for kind in args.models.split(","):
        results = run_function(worker, kind, args.steps, args.rounds, args.warmup,
                               num_processes=2, return_all=True, timeout=1200,
                               env={"OMP_NUM_THREADS": "1"})
        median = {v: statistics.median(min(r["rates"][v][i] for r in results)
                                       for i in range(args.rounds)) for v in ("native", "ddp")}
        gap = max(r["loss_gap"] for r in results)
        print(f"{kind:<12} {results[0]['params'] / 1e6:>7.1f}M {results[0]['tensors']:>7} "
              f"{median['native']:>11.3f} {median['ddp']:>9.3f} "
              f"{median['native'] / median['ddp']:>6.2f} {'>=0.97':>6} {gap:>12.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
