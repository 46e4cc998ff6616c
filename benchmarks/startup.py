"""Rank start-up, TensorFlow beside torch: process start to ``hvd.init()`` returned.

Each launch is ``horovodrun -np 2 python SCRIPT`` of a script that does only
``import horovod.<binding> as hvd; hvd.init()``, for three bindings:

  torch   import horovod.torch as hvd
  tf      import horovod.tensorflow as hvd
  keras   import horovod.tensorflow.keras as hvd

Every rank reports, right after ``hvd.init()`` returned, how long ago

  process  its own process started (``/proc/self/stat`` starttime against ``/proc/uptime``: the
           process that runs the script, i.e. what the user's ``python SCRIPT`` is; 10 ms ticks)
  launch   ``horovodrun`` was started (a timestamp this benchmark passes in the environment;
           includes the driver's own start-up and the engine's, the same for every binding)

A launch counts its slower rank; the table gives the median over the launches, beside the wall
time of a bare ``python -c "import tensorflow"`` and ``python -c "import torch"``, and the ratios
TF/torch. The launches of the three bindings take turns, so a change of load on the machine
spreads over all of them.

With ``--warm``, also what a Spark task whose Python worker is reused does (the default for
``horovod.spark.run`` / ``HorovodRunner(np>0)``), here without a cluster: ranks forked from the
worker's fork server (``distributor.forkserver``, preload torch), job after job, the bindings
taking turns; each rank reports the time from the job's ``run_function`` call to ``hvd.init()``
returned (the first job of each binding, which starts the server or teaches it, not counted).
``--warm --no-learn`` turns off the server's learning (``forkserver.LEARNED``) for comparison.

Usage: python benchmarks/startup.py [--repeats 5] [--np 2] [--warm [--no-learn]] [--no-horovodrun]
Target (issue 39): the ``tf`` rank's process start-up at most 1.5 x the ``torch`` rank's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

BINDINGS = {
    "torch": "horovod.torch",
    "tf": "horovod.tensorflow",
    "keras": "horovod.tensorflow.keras",
}

SCRIPT = """
import os, sys, time
import {module} as hvd
hvd.init()
now = time.time()
with open("/proc/uptime") as f:
    uptime = float(f.read().split()[0])
with open("/proc/self/stat") as f:
    start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
print("STARTUP", hvd.rank(), age, now - float(os.environ["STARTUP_BENCH_T0"]), flush=True)
hvd.shutdown()
"""

BARE = {"import torch": "import torch", "import tensorflow": "import tensorflow"}


def horovodrun() -> List[str]:
    found = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [found] if os.path.exists(found) else [sys.executable, "-m", "horovod_compat.run"]


def launch(script: str, np_: int) -> Dict[str, float]:
    """One ``horovodrun -np N python script``: the slowest rank's process and launch times."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["STARTUP_BENCH_T0"] = repr(time.time())
    done = subprocess.run([*horovodrun(), "-np", str(np_), sys.executable, script], env=env,
                          capture_output=True, text=True, timeout=600)
    rows = [line.split("STARTUP", 1)[1].split() for line in done.stdout.splitlines()
            if "STARTUP" in line]
    if done.returncode != 0 or len(rows) != np_:
        raise RuntimeError(f"horovodrun failed (exit {done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"process": max(float(r[1]) for r in rows), "launch": max(float(r[2]) for r in rows)}


def bare(code: str) -> float:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _warm_rank(module: str, t0: float) -> tuple:
    import importlib

    hvd = importlib.import_module(module)
    hvd.init()
    now = time.time()
    hvd.shutdown()
    return now - t0


def warm(repeats: int, np_: int, learn: bool) -> Dict[str, float]:
    """Median seconds from `run_function` to `hvd.init()` returned (slowest rank), per binding,
    with ranks forked from a reused worker's fork server."""
    from distributor import forkserver, run_function
    from distributor.launchers import PythonLauncher

    if not learn:
        forkserver.LEARNED = ()
    launcher = PythonLauncher(preload=("torch",))
    launcher.in_reused_worker()
    samples: Dict[str, List[float]] = {name: [] for name in BINDINGS}
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    try:
        for i in range(repeats + 1):
            for name, module in BINDINGS.items():
                took = max(run_function(_warm_rank, module, time.time(), num_processes=np_,
                                        return_all=True, launcher=launcher, output=lambda *a: None))
                if i:
                    samples[name].append(took)
            print(f"warm round {i}/{repeats} done", file=sys.stderr, flush=True)
    finally:
        for server in forkserver._servers.values():
            server.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--json", help="also write the raw figures to this file")
    parser.add_argument("--warm", action="store_true", help="also ranks forked from a reused worker's fork server")
    parser.add_argument("--no-learn", action="store_true", help="with --warm: the server learns nothing")
    parser.add_argument("--no-horovodrun", action="store_true", help="skip the horovodrun launches")
    args = parser.parse_args()
    if args.warm:
        med = warm(args.repeats, args.np, learn=not args.no_learn)
        print(f"\nreused worker's fork server{' (no learning)' if args.no_learn else ''}, job after "
              f"job, -np {args.np}: median seconds from run_function to hvd.init() returned")
        for name, value in med.items():
            print(f"{name + ' rank':18} {value:8.2f}")
        for name in ("tf", "keras"):
            print(f"ratio {name}/torch: {med[name] / med['torch']:.2f}x")
    if args.no_horovodrun:
        return

    samples: Dict[str, List] = {name: [] for name in [*BINDINGS, *BARE]}
    with tempfile.TemporaryDirectory() as tmp:
        scripts = {}
        for name, module in BINDINGS.items():
            scripts[name] = os.path.join(tmp, f"startup_{name}.py")
            with open(scripts[name], "w") as f:
                f.write(SCRIPT.format(module=module))
        launch(scripts["tf"], args.np)  # builds the binding's cached op once, outside the figures
        for i in range(args.repeats):
            for name, script in scripts.items():
                samples[name].append(launch(script, args.np))
            for name, code in BARE.items():
                samples[name].append(bare(code))
            print(f"round {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    med = {}
    print(f"\nmedian over {args.repeats} launches, horovodrun -np {args.np}; seconds "
          f"(slowest rank of a launch)\n")
    print(f"{'':18} {'process start':>14} {'from horovodrun':>16}")
    for name in BINDINGS:
        med[name] = {k: statistics.median(s[k] for s in samples[name]) for k in ("process", "launch")}
        print(f"{name + ' rank':18} {med[name]['process']:14.2f} {med[name]['launch']:16.2f}")
    for name in BARE:
        med[name] = statistics.median(samples[name])
        print(f"{'python -c ' + repr(name):32} {med[name]:.2f} (process wall)")
    for name in ("tf", "keras"):
        print(f"ratio {name}/torch: process {med[name]['process'] / med['torch']['process']:.2f}x, "
              f"from horovodrun {med[name]['launch'] / med['torch']['launch']:.2f}x")
    print(f"bare import tensorflow / import torch: "
          f"{med['import tensorflow'] / med['import torch']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
