"""Elastic recovery: how long a killed worker costs, and what `state.commit()` costs.

One run of each measurement, as a user would run them:

1. **Local, may shrink** (`horovod.run(train, num_proc=3, min_num_proc=2, max_num_proc=3)`): a
   training loop of short steps (`hvd.elastic.run`, `TorchState`, a commit per step). One worker
   SIGKILLs itself at a chosen step, after writing the time. Reported: seconds from the kill to the
   survivors' first completed step (in a world of 2), and to the first completed step with the
   replacement back in the world (size 3 again).
2. **Local, may not shrink** (`min_num_proc=3`): seconds from the kill to the first step of the
   full world again (the survivors wait for the replacement).
3. **Spark** (`horovod.spark.run_elastic` on a `local-cluster[2,1,1024]`, 2 workers, min 1): the
   same two figures; the replacement is started inside the Spark task of the killed worker.
   (`benchmarks/spark_elastic_recovery.py` runs this one several times and says more.)
4. **Commit cost**: a 25M-parameter MLP on 2 ranks with `hvd.DistributedOptimizer` (SGD with
   momentum, and Adam): the median time of one `state.commit()` against the median time of one
   optimizer step (forward, backward, allreduce, update), and of the deep copy Horovod's own
   `TorchState.save` makes, for comparison.

Targets (issue 16): shrink <= 0.5 s; replacement back <= 5 s locally, <= 15 s on Spark; commit
<= 1x a step. Real Horovod 0.28.1 resumes a shrunk job in 0.1-0.3 s (given two host names for this
machine; it cannot replace a worker on the same host, it blacklists it).

Usage: ``python benchmarks/elastic_recovery.py [--skip-spark] [--steps N]``
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def elastic_train(kill_file: str, victim: int, kill_at: int, steps: int, step_sleep: float,
                  kill_parent: bool = False) -> List[Tuple[float, int, int]]:
    """Runs in every worker: a tiny model trained with a commit per step; the worker whose rank is
    `victim` at step `kill_at` SIGKILLs itself once (with `kill_parent`: its parent, a Ray actor),
    the file records when. Returns rank 0's log of (time, world size, step) per completed step."""
    import signal

    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    log: List[Tuple[float, int, int]] = []
    x, y = torch.randn(16, 64), torch.randn(16, 1)

    @hvd.elastic.run
    def loop(state):
        while state.step < steps:
            if state.step == kill_at and hvd.rank() == victim and not os.path.exists(kill_file):
                with open(kill_file + ".tmp", "w") as f:
                    f.write(repr(time.time()))
                os.rename(kill_file + ".tmp", kill_file)
                os.kill(os.getppid() if kill_parent else os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            state.step += 1
            log.append((time.time(), hvd.size(), state.step))
            state.commit()
            if step_sleep:
                time.sleep(step_sleep)

    loop(state)
    return log if hvd.rank() == 0 else []


def recovery_figures(log: List[Tuple[float, int, int]], killed_at: float, full: int) -> Dict[str, Optional[float]]:
    after = [(t, size) for t, size, _ in log if t > killed_at]
    shrunk = next((t for t, size in after if size < full), None)
    # back: a full world after the shrink (a survivor can log the step it finished with the
    # victim a moment after the victim's kill: that one is not the replacement's)
    back = next((t for t, size in after if size == full and (shrunk is None or t > shrunk)), None)
    return {"shrink": None if shrunk is None else shrunk - killed_at,
            "back": None if back is None else back - killed_at}


def run_local(num: int, minimum: int, steps: int, kill_at: int, step_sleep: float) -> Dict[str, Optional[float]]:
    import horovod

    with tempfile.TemporaryDirectory() as tmp:
        kill_file = os.path.join(tmp, "killed")
        results = horovod.run(elastic_train, args=(kill_file, num - 1, kill_at, steps, step_sleep),
                              num_proc=num, min_num_proc=minimum, max_num_proc=num)
        log = next(r for r in results if r)
        killed_at = float(Path(kill_file).read_text())
    return recovery_figures(log, killed_at, num)


def run_spark(runs: int) -> List[Dict[str, Any]]:
    """`benchmarks/spark_elastic_recovery.py`'s measurement on a local-cluster[2,1,1024] session
    (started as launch_spark.py starts it), after one warm-up run."""
    sys.path.insert(0, str(HERE))
    from launch_spark import _start_session, _stop_session
    from spark_elastic_recovery import measure_recovery

    with tempfile.TemporaryDirectory(prefix="elastic_recovery-") as tmp:
        spark = _start_session(Path(tmp), None)
        try:
            measure_recovery(spark, runs=1)  # warm-up: the executors' Python workers, imports
            return measure_recovery(spark, runs=runs)
        finally:
            _stop_session(spark)


def commit_cost(optimizer: str, rounds: int) -> List[Dict[str, float]]:
    import distributor

    return distributor.run_function(_commit_worker, optimizer, rounds, num_processes=2,
                                    return_all=True, timeout=900)


def _commit_worker(optimizer: str, rounds: int) -> Dict[str, float]:
    """One rank: median seconds of an optimizer step, of `state.commit()`, and of the deep copy of
    the model's and optimizer's state dicts that Horovod's own TorchState.save makes."""
    import copy

    import torch
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024))  # 25.2M parameters
    base = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer == "sgd"
            else torch.optim.Adam(model.parameters(), lr=1e-3))
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, epoch=0, batch=0)
    x, y = torch.randn(32, 1024), torch.randn(32, 1024)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    def timed(fn) -> float:
        hvd.allreduce(torch.zeros(1), name="bench.barrier")  # both ranks start together
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    for _ in range(3):
        step()
    state.commit()  # the first commit sizes the saved buffers
    steps, commits, deep = [], [], []
    for _ in range(rounds):
        steps.append(timed(step))
        commits.append(timed(state.commit))
        deep.append(timed(lambda: (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))))
    return {"params": sum(p.numel() for p in model.parameters()), "step": statistics.median(steps),
            "commit": statistics.median(commits), "deepcopy": statistics.median(deep)}


def _fmt(value: Optional[float]) -> str:
    return "never" if value is None else f"{value:.3f} s"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="training steps per run")
    ap.add_argument("--kill-at", type=int, default=100, help="step at which a worker kills itself")
    ap.add_argument("--step-sleep", type=float, default=0.02, help="seconds of 'work' per step")
    ap.add_argument("--commit-rounds", type=int, default=10)
    ap.add_argument("--skip-spark", action="store_true")
    args = ap.parse_args(argv)
    print(f"{'measurement':78} {'seconds':>10} {'target':>8} met")

    def row(name: str, value: Optional[float], target: float) -> None:
        met = "yes" if value is not None and value <= target else "NO"
        print(f"{name:78} {_fmt(value):>10} {target:>6.1f} s {met}", flush=True)

    shrink = run_local(3, 2, args.steps, args.kill_at, args.step_sleep)
    row("local, 3 workers, min 2: kill -> survivors' first step (shrunk)", shrink["shrink"], 0.5)
    row("local, 3 workers, min 2: kill -> first step with the replacement back", shrink["back"], 5.0)
    full = run_local(3, 3, args.steps, args.kill_at, args.step_sleep)
    row("local, 3 workers, min 3: kill -> first step of the full world again", full["back"], 5.0)
    if not args.skip_spark:
        spark = run_spark(1)[0]
        row("Spark local-cluster, 2 workers, min 1: kill -> survivor's first step",
            spark["to_first_step"], 0.5)
        row("Spark local-cluster, 2 workers, min 1: kill -> replacement back",
            spark["to_replacement_step"], 15.0)
    print(f"\nstate.commit() vs one optimizer step, 25M-parameter MLP, hvd.DistributedOptimizer, 2 ranks "
          f"(medians of {args.commit_rounds}):")
    print(f"{'optimizer':10} {'rank':>4} {'step ms':>9} {'commit ms':>10} {'commit/step':>12} "
          f"{'deepcopy ms':>12} {'deepcopy/step':>14}")
    for optimizer in ("sgd", "adam"):
        for rank, cost in enumerate(commit_cost(optimizer, args.commit_rounds)):
            print(f"{optimizer:10} {rank:>4} {cost['step'] * 1e3:9.1f} {cost['commit'] * 1e3:10.1f} "
                  f"{cost['commit'] / cost['step']:11.2f}x {cost['deepcopy'] * 1e3:12.1f} "
                  f"{cost['deepcopy'] / cost['step']:13.2f}x")
    print("(target: commit/step <= 1.00; 'deepcopy' is the copy Horovod's TorchState.save makes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
