"""Elastic recovery on Spark: seconds from a worker's SIGKILL to the survivors' first completed
step, and to the first step with the replacement worker back in the world.

`horovod.spark.run_elastic(num_proc=2, min_num_proc=1)` on a `local-cluster[2,1,1024]` session: a
small model trains with `hvd.elastic.run`; worker 1 writes the time and SIGKILLs itself once at
step `kill_step`. Rank 0 (the survivor) notes the wall-clock time of its first step completed
after the kill (the job shrank to one worker) and of its first step with two workers again (the
replacement, started by the Spark task that hosted the killed worker, has joined). Every process
runs on this machine, so the clocks agree.

`measure_recovery(spark, runs)` is the function other benchmarks call (e.g.
benchmarks/elastic_recovery.py, with their own SparkSession on a local-cluster); run alone, this
script starts its own session and prints one line per run and the medians.

Usage: ``flock /work/notes/bench.lock python benchmarks/spark_elastic_recovery.py [--runs 3]``
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def recovery_train(marker: str, steps: int, kill_step: int, width: int) -> Dict[str, Any]:
    """The timed worker function (see the module doc); rank 0's figures, None elsewhere."""
    import os
    import signal
    import time

    import torch

    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Linear(width, width)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    seen: Dict[str, float] = {}  # outside the state: a restore must not roll it back
    data = torch.randn(8, width)

    @hvd.elastic.run
    def train(state):
        while True:  # at least one step per (re)entry: the first one with the replacement counts
            if state.step == kill_step and hvd.rank() == 1 and not os.path.exists(marker):
                with open(marker, "w") as out:
                    out.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(data).square().mean().backward()
            opt.step()
            state.step += 1
            state.commit()
            now = time.time()
            # steps up to kill_step may end just after worker 1 wrote the time; only later
            # steps needed the world to recover
            if hvd.rank() == 0 and state.step > kill_step and os.path.exists(marker):
                killed = float(open(marker).read() or "nan")
                if now > killed:
                    seen.setdefault("first", now - killed)
                    if hvd.size() == 2:
                        seen.setdefault("back", now - killed)
            if state.step >= steps and hvd.size() == 2:  # the same on every rank after a sync
                break
        return state.step

    step = train(state)
    if hvd.rank() != 0:
        return {}
    return {"to_first_step": seen.get("first"), "to_replacement_step": seen.get("back"),
            "steps": step}


def measure_recovery(spark: Any, runs: int = 1, steps: int = 40, kill_step: int = 10,
                     width: int = 256) -> List[Dict[str, Any]]:
    """`runs` kill-and-recover runs of `horovod.spark.run_elastic` on `spark`'s cluster (two task
    slots or more); one dict per run: seconds to the first step after the kill, to the first step
    with the replacement back, and the whole run."""
    import horovod.spark

    figures = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="spark-elastic-") as tmp:
            marker = os.path.join(tmp, "killed")
            started = time.perf_counter()
            results = horovod.spark.run_elastic(
                recovery_train, args=(marker, steps, kill_step, width), num_proc=2,
                min_num_proc=1, stdout=io.StringIO(), stderr=io.StringIO(), verbose=0)
            total = time.perf_counter() - started
        figures.append({**results[0], "run_s": total, "workers": len(results)})
    return figures


def _seconds(value: Optional[float]) -> str:
    return "not seen" if value is None else f"{value:.2f}"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    from launch_spark import MASTER, _start_session, _stop_session

    with tempfile.TemporaryDirectory(prefix="spark_elastic_recovery-") as tmp:
        spark = _start_session(Path(tmp), None)
        try:
            measure_recovery(spark, runs=1)  # warm-up: executors' Python workers, imports
            figures = measure_recovery(spark, runs=args.runs)
        finally:
            _stop_session(spark)
    print(f"\nhorovod.spark.run_elastic(num_proc=2, min_num_proc=1) on {MASTER}, worker 1 "
          f"SIGKILLed once per run, {args.runs} runs (load {os.getloadavg()[0]:.1f}):")
    print("| run | SIGKILL -> survivor's first step (s) | SIGKILL -> first step with the "
          "replacement (s) | whole run (s) |")
    print("|---|---|---|---|")
    for i, f in enumerate(figures, 1):
        print(f"| {i} | {_seconds(f.get('to_first_step'))} | {_seconds(f.get('to_replacement_step'))} "
              f"| {f['run_s']:.1f} |")
    firsts = [f["to_first_step"] for f in figures if f.get("to_first_step") is not None]
    backs = [f["to_replacement_step"] for f in figures if f.get("to_replacement_step") is not None]
    first = _seconds(statistics.median(firsts) if firsts else None)
    back = _seconds(statistics.median(backs) if backs else None)
    print(f"| median | {first} (target <= 0.5) | {back} (target <= 15 on Spark) | |")
    print("raw:", figures)


if __name__ == "__main__":
    main()
