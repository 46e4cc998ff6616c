"""Rank start-up, TensorFlow beside torch: process start to ``hvd.init()`` returned.

Each launch is ``horovodrun -np 2 python SCRIPT`` of a script that does only
``import horovod.<binding> as hvd; hvd.init()``, for three bindings:

  torch   import horovod.torch as hvd
  tf      import horovod.tensorflow as hvd
  keras   import horovod.tensorflow.keras as hvd

Every rank reports, right after ``hvd.init()`` returned, how long ago

  process  its own process started (``/proc/self/stat`` starttime against ``/proc/uptime``: the
           process that runs the script; 10 ms ticks). A rank forked from the warm fork server
           is a process from its fork on, so this column flatters it: read ``launch``.
  launch   ``horovodrun`` was started (a timestamp this benchmark passes as the script's
           argument; includes the driver's own start-up and the engine's)

A launch counts its slower rank; the table gives the median over the launches, beside the wall
time of a bare ``python -c "import tensorflow"`` and ``python -c "import torch"``, and the ratios
TF/torch. The launches of the three bindings take turns, so a change of load on the machine
spreads over all of them. Two ways of starting ranks are measured:

  new processes  ``HOROVOD_COMPAT_WARM_SECONDS=0``: every rank a new ``python`` process
  warm           the default on one host: ranks forked from this user's warm fork server
                 (``distributor/forkserver_daemon.py``; a private directory made for the run).
                 Its first launch starts the server, which then learns torch and TensorFlow
                 from its ranks: that launch is shown on its own, not in the medians.

With ``--warm``, also what a Spark task whose Python worker is reused does (the default for
``horovod.spark.run`` / ``HorovodRunner(np>0)``), here without a cluster: ranks forked from the
worker's fork server (``distributor.forkserver``, preload torch), job after job, the bindings
taking turns; each rank reports the time from the job's ``run_function`` call to ``hvd.init()``
returned (the first job of each binding, which starts the server or teaches it, not counted).
``--warm --no-learn`` turns off the server's learning (``forkserver.LEARNED``) for comparison.

Usage: python benchmarks/startup.py [--repeats 5] [--np 2] [--warm [--no-learn]] [--no-horovodrun]
Target (issue 39): the ``tf`` rank's start-up at most 1.5 x the ``torch`` rank's.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
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
print("STARTUP", hvd.rank(), age, now - float(sys.argv[1]), flush=True)
hvd.shutdown()
"""

BARE = {"import torch": "import torch", "import tensorflow": "import tensorflow"}


def horovodrun() -> List[str]:
    found = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [found] if os.path.exists(found) else [sys.executable, "-m", "horovod_compat.run"]


def launch(script: str, np_: int, env: Dict[str, str]) -> Dict[str, float]:
    """One ``horovodrun -np N python script T0``: the slowest rank's process and launch times
    (the start time travels as an argument: a variable that changes every launch would give
    every launch a warm fork server of its own)."""
    done = subprocess.run([*horovodrun(), "-np", str(np_), sys.executable, script, repr(time.time())],
                          env=env, capture_output=True, text=True, timeout=600)
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

    from distributor.forkserver_daemon import server_pids

    modes = {"new processes": {"HOROVOD_COMPAT_WARM_SECONDS": "0"}, "warm": {}}
    samples: Dict[str, List] = {f"{mode}/{name}": [] for mode in modes for name in BINDINGS}
    samples.update({name: [] for name in BARE})
    first: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        warm_dir = os.path.join(tmp, "warm")
        os.mkdir(warm_dir, 0o700)
        base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", HOROVOD_COMPAT_WARM_DIR=warm_dir)
        envs = {mode: {**base, **extra} for mode, extra in modes.items()}
        scripts = {}
        for name, module in BINDINGS.items():
            scripts[name] = os.path.join(tmp, f"startup_{name}.py")
            with open(scripts[name], "w") as f:
                f.write(SCRIPT.format(module=module))
        # builds the binding's cached op once, outside the figures
        launch(scripts["tf"], args.np, envs["new processes"])
        for name in BINDINGS:  # the warm server's start (the first) and its lessons, apart
            first[name] = launch(scripts[name], args.np, envs["warm"])
        try:
            for i in range(args.repeats):
                for mode, env in envs.items():
                    for name, script in scripts.items():
                        samples[f"{mode}/{name}"].append(launch(script, args.np, env))
                for name, code in BARE.items():
                    samples[name].append(bare(code))
                print(f"round {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
        finally:
            for pid in server_pids(warm_dir):  # stop the run's warm server by its PID
                os.kill(pid, signal.SIGTERM)

    med: Dict[str, object] = {}
    print(f"\nmedian over {args.repeats} launches, horovodrun -np {args.np}; seconds "
          f"(slowest rank of a launch)\n")
    print(f"{'':30} {'process start':>14} {'from horovodrun':>16}")
    for key in samples:
        if key in BARE:
            continue
        med[key] = {k: statistics.median(s[k] for s in samples[key]) for k in ("process", "launch")}
        print(f"{key + ' rank':30} {med[key]['process']:14.2f} {med[key]['launch']:16.2f}")
    for name in BINDINGS:
        print(f"{'warm, first launch: ' + name:30} {first[name]['process']:14.2f} "
              f"{first[name]['launch']:16.2f}   (once per server)")
    for name in BARE:
        med[name] = statistics.median(samples[name])
        print(f"{'python -c ' + repr(name):30} {med[name]:14.2f} (process wall)")
    for mode in modes:
        torch_ = med[f"{mode}/torch"]
        for name in ("tf", "keras"):
            mine = med[f"{mode}/{name}"]
            print(f"{mode}: ratio {name}/torch: process {mine['process'] / torch_['process']:.2f}x, "
                  f"from horovodrun {mine['launch'] / torch_['launch']:.2f}x")
    print(f"warm tf rank against a new-process torch rank, from horovodrun: "
          f"{med['warm/tf']['launch'] / med['new processes/torch']['launch']:.2f}x")
    print(f"bare import tensorflow / import torch: "
          f"{med['import tensorflow'] / med['import torch']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "first_warm": first, "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
