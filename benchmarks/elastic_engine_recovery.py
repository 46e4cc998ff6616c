"""How fast an elastic job of the engine recovers from a SIGKILLed worker, locally, and where the
time goes. Plain torch.distributed (gloo) workers, no Horovod: this measures the engine
(`distributor.elastic`); benchmarks/elastic_recovery.py measures the same through hvd.elastic.

    python benchmarks/elastic_engine_recovery.py [--runs 5]

Each run trains a loop with one allreduce per step (10 ms sleep between steps) and SIGKILLs one
worker from inside it at step 20. Scenarios:

* shrink:      3 workers, min 2, the host cools down (no replacement): seconds from the SIGKILL
               to the survivors' first completed step in the new round (target <= 0.5 s).
* replacement: 2 workers, min 2 = max: the survivor waits; seconds from the SIGKILL to the first
               completed step of the round the replacement is in (target <= 5 s). The
               replacement is forked from the job's fork server, which imported torch once.
* cold replacement: the same with nothing preloaded in the fork server: the replacement imports
               torch itself (what a plain new process pays), for comparison.

Beside each figure, the driver's timeline (same monotonic clock): failure seen, replacement
started, replacement's JOIN, round formed. Prints one table: median, min, max per figure.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Dict, List

KILL_STEP = 20
STEPS = 60


def _worker(kill_file: str, steps: int = STEPS):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from distributor import worker

    me = worker.worker_id()
    committed = 0
    client = None
    firsts = []  # (round, size, monotonic time of the first completed step in that round)
    while True:
        world = worker.join_world(timeout=120)
        if client is None:
            client = dist.TCPStore(world.store_host, world.store_port, is_master=False,
                                   timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=dist.PrefixStore(world.store_prefix, client),
                                rank=world.rank, world_size=world.size, timeout=timedelta(seconds=60))
        step = committed
        try:
            t = torch.tensor([step])
            dist.broadcast(t, 0)
            step = committed = int(t[0])
            first = True
            while step < steps:
                if me == 1 and step == KILL_STEP:
                    with open(kill_file, "w") as f:
                        f.write(repr(time.monotonic()))
                    os.kill(os.getpid(), signal.SIGKILL)
                x = torch.ones(1)
                dist.all_reduce(x)
                step = committed = step + 1
                if first:
                    firsts.append((world.round, world.size, time.monotonic()))
                    first = False
                time.sleep(0.01)
            dist.destroy_process_group()
            return firsts
        except RuntimeError:
            dist.destroy_process_group()


def run_once(n: int, policy, kill_file: str, preload=("torch",)):
    from distributor import FunctionTarget, LaunchRequest
    from distributor.elastic.job import ElasticJob
    from distributor.launchers import PythonLauncher
    from distributor.placement import LocalPlacement

    request = LaunchRequest(FunctionTarget(_worker, (kill_file,), {}), n, elastic=policy,
                            return_all=True)
    job = ElasticJob(request, LocalPlacement(), PythonLauncher(preload=preload),
                     output=lambda *a: None)
    results = job.run()
    killed_at = float(open(kill_file).read())
    return killed_at, results, job.timeline


def _after(timeline, prefix: str, since: float):
    times = [t for t, what in timeline if what.startswith(prefix) and t >= since]
    return min(times) - since if times else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from distributor import ElasticPolicy

    logging.getLogger("distributor").setLevel(logging.ERROR)  # one warning per kill otherwise

    figures: Dict[str, List[float]] = {}
    failed = 0

    def add(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        kill_file = os.path.join(tmp, "killed")
        for _ in range(args.runs):
            try:
                killed, results, timeline = run_once(
                    3, ElasticPolicy(2, 3, cooldown_range=(600, 600)), kill_file)
                first = min(t for firsts in results for r, size, t in firsts if size == 2 and t > killed)
                add("shrink: SIGKILL -> survivors' first step", first - killed)
                add("  shrink: driver saw the failure", _after(timeline, "failed:", killed))
                add("  shrink: round formed", _after(timeline, "round ", killed))
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failed += 1
                print(f"shrink run failed: {exc}", file=sys.stderr)
            for name, preload in (("replacement", ("torch",)), ("cold replacement", ())):
                try:
                    killed, results, timeline = run_once(2, ElasticPolicy(2, 2), kill_file, preload)
                    first = min(t for firsts in results for r, size, t in firsts if t > killed)
                    add(f"{name}: SIGKILL -> first step with it", first - killed)
                    add(f"  {name}: driver saw the failure", _after(timeline, "failed:", killed))
                    add(f"  {name}: replacement started", _after(timeline, "start:", killed))
                    add(f"  {name}: its JOIN", _after(timeline, "join: worker 2", killed))
                    add(f"  {name}: round formed", _after(timeline, "round ", killed))
                except Exception as exc:  # noqa: BLE001
                    failed += 1
                    print(f"{name} run failed: {exc}", file=sys.stderr)
    print(f"load average: {os.getloadavg()[0]:.2f}; {args.runs} runs per scenario, "
          f"{3 * args.runs} kill-and-recover runs, {failed} failed")
    print(f"{'seconds after the SIGKILL':48} {'median':>8} {'min':>8} {'max':>8}")
    for name, values in figures.items():
        print(f"{name:48} {statistics.median(values):8.3f} {min(values):8.3f} {max(values):8.3f}")
    print("targets: shrink <= 0.5 s, replacement <= 5 s (issue 16)")


if __name__ == "__main__":
    main()
