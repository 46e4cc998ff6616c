"""Launch overhead on a Spark cluster: every way this project starts ranks on Spark vs PySpark's
TorchDistributor.

On one warm `local-cluster[2,1,1024]` session (two executor JVMs), it times a trivial 2-rank job —
`init_process_group("gloo")` and one `all_reduce` — run by our `TorchDistributor(local_mode=False)`,
`horovod.spark.run(num_proc=2)` (direct start and `use_mpi=True`), `HorovodRunner(np=2)` (mpirun
across the tasks) and `pyspark.ml.torch.distributor.TorchDistributor(num_processes=2,
local_mode=False, use_gpu=False)`, rotating which goes first in each round so machine noise hits
all alike, and prints a table of medians and their ratios to PySpark's. Then it times the "slots short" failure (3 ranks on 2 slots): ours fails
before submitting; PySpark's is watched for a few seconds only (Spark retries such a barrier stage
for about ten minutes) and then cancelled.

PySpark's TorchDistributor needs pandas and pyarrow in the driver and the executors; this project
does not. Point `--pyspark-deps` at a folder that has them (e.g. made with
`pip install --target DIR --no-deps pandas pyarrow python-dateutil six tzdata`), or skip PySpark's
side with `--ours-only`.

Usage: ``python benchmarks/launch_spark.py [--rounds 5] [--pyspark-deps DIR] [--ours-only]``
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

MASTER = "local-cluster[2,1,1024]"


def trivial_job() -> float:
    """The timed job: join the process group, one all_reduce, leave."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    dist.destroy_process_group()
    return value.item()


def _spark_home_mirror(root: Path) -> Path:
    """SPARK_HOME as symlinks to the pip pyspark folder, so that the local-cluster's executor work
    directories land in `root` instead of inside site-packages."""
    import pyspark

    home = root / "spark-home"
    home.mkdir()
    for entry in Path(pyspark.__file__).parent.iterdir():
        if entry.name not in ("work", "__pycache__"):
            (home / entry.name).symlink_to(entry)
    return home


def _start_session(root: Path, extra_pythonpath: Optional[str]):
    os.environ.update({
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(_spark_home_mirror(root)),
    })
    if extra_pythonpath:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (extra_pythonpath, os.environ.get("PYTHONPATH")) if p)
        sys.path.insert(0, extra_pythonpath)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(MASTER).appName("launch_spark benchmark")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + 180
    while len(tracker.getExecutorInfos()) - 1 < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("executors did not register")
        time.sleep(0.2)
    return spark


def _stop_session(spark) -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if gateway is not None:
        gateway.shutdown()
    if proc is not None:
        proc.stdin.close()
        proc.wait(timeout=30)


#: Kept open for the whole run: loggers created during a quiet call keep writing to it.
_DEVNULL = open(os.devnull, "w")


def _quiet(fn: Callable[[], object]) -> object:
    """Run `fn` with the ranks' output lines dropped (both distributors print them)."""
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _DEVNULL
    try:
        return fn()
    finally:
        sys.stdout, sys.stderr = saved


def ours(num_processes: int = 2) -> object:
    from distributor import TorchDistributor

    return TorchDistributor(num_processes=num_processes, local_mode=False, use_gpu=False).run(trivial_job)


def hvd_spark_direct(num_processes: int = 2) -> object:
    import horovod.spark

    return horovod.spark.run(trivial_job, num_proc=num_processes)[0]


def hvd_spark_mpi(num_processes: int = 2) -> object:
    import horovod.spark

    return horovod.spark.run(trivial_job, num_proc=num_processes, use_mpi=True)[0]


def horovod_runner(num_processes: int = 2) -> object:
    from sparkdl import HorovodRunner

    return HorovodRunner(np=num_processes).run(trivial_job)


def pysparks(num_processes: int = 2) -> object:
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=num_processes, local_mode=False, use_gpu=False).run(trivial_job)


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    value = _quiet(fn)
    elapsed = time.perf_counter() - started
    if value != 2.0:
        raise RuntimeError(f"{fn.__name__} returned {value!r} instead of 2.0")
    return elapsed


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pyspark-deps", default=os.environ.get("PYSPARK_BENCH_DEPS"),
                        help="folder with pandas and pyarrow for PySpark's TorchDistributor")
    parser.add_argument("--ours-only", action="store_true")
    parser.add_argument("--watch-seconds", type=float, default=20.0,
                        help="how long to watch PySpark's slots-short run before cancelling it")
    args = parser.parse_args(argv)

    with_pyspark = not args.ours_only
    if with_pyspark:
        if args.pyspark_deps:
            sys.path.insert(0, args.pyspark_deps)
        try:
            import pandas  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError:
            print("pandas/pyarrow not found: PySpark's TorchDistributor cannot run; timing ours only. "
                  "Pass --pyspark-deps DIR to compare.")
            with_pyspark = False

    with tempfile.TemporaryDirectory(prefix="launch_spark-") as tmp:
        started = time.perf_counter()
        spark = _start_session(Path(tmp), args.pyspark_deps if with_pyspark else None)
        print(f"{MASTER} session up in {time.perf_counter() - started:.1f}s; "
              f"{args.rounds} timed rounds after one warm-up run each")
        try:
            contenders = [
                ("TorchDistributor (ours)", ours),
                ("horovod.spark.run", hvd_spark_direct),
                ("horovod.spark.run(use_mpi=True)", hvd_spark_mpi),
                ("HorovodRunner(np=2)", horovod_runner),
            ]
            if with_pyspark:
                contenders.append(("PySpark TorchDistributor", pysparks))
            for _, fn in contenders:
                _timed(fn)  # warm-up: executors' Python workers and imports
            times: Dict[str, List[float]] = {name: [] for name, _ in contenders}
            for round_no in range(args.rounds):
                shift = round_no % len(contenders)
                for name, fn in contenders[shift:] + contenders[:shift]:
                    times[name].append(_timed(fn))
            medians = {name: statistics.median(values) for name, values in times.items()}
            reference = medians.get("PySpark TorchDistributor")
            print(f"\nwarm .run() of a trivial 2-rank job on {MASTER}, {args.rounds} rounds:")
            print(f"| {'launcher':<33} | median s | vs PySpark | runs (s)")
            print(f"|{'-' * 35}|{'-' * 10}|{'-' * 12}|{'-' * 30}")
            for name, values in times.items():
                ratio = f"{medians[name] / reference:.2f}x" if reference else "n/a"
                runs = ", ".join(f"{t:.2f}" for t in values)
                print(f"| {name:<33} | {medians[name]:8.2f} | {ratio:>10} | {runs}")
            print()

            # ---- slots short: 3 ranks on 2 slots ------------------------------------------
            from distributor import LaunchValidationError

            started = time.perf_counter()
            try:
                ours(3)
                print("ours: slots-short run did not fail (unexpected)")
            except LaunchValidationError as exc:
                print(f"ours    slots short (3 ranks, 2 slots): failed in {time.perf_counter() - started:.3f}s: "
                      f"{str(exc)[:110]}...")
            if with_pyspark:
                _watch_pyspark_slots_short(spark, args.watch_seconds)
        finally:
            _stop_session(spark)


def _watch_pyspark_slots_short(spark, seconds: float) -> None:
    outcome: List[object] = []

    def run() -> None:
        try:  # not _quiet: swapping sys.stdout from this thread would silence the main one
            outcome.append(pysparks(3))
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    started = time.perf_counter()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        print(f"pyspark slots short (3 ranks, 2 slots): no answer after {seconds:.0f}s (Spark retries "
              "the barrier stage for ~10 minutes before failing); cancelled")
        spark.sparkContext.cancelAllJobs()
        thread.join(60)
    else:
        print(f"pyspark slots short: ended after {time.perf_counter() - started:.1f}s with "
              f"{type(outcome[0]).__name__}: {str(outcome[0])[:120]}")


if __name__ == "__main__":
    main()
