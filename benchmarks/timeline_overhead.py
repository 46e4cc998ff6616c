"""Timeline overhead: training steps per second with the Horovod timeline recording vs not.

Issue 7's target: on 2 ranks (CPU, gloo) an unchanged Horovod training loop
(``hvd.DistributedOptimizer``) keeps >= 0.95 x its steps/s while ``HOROVOD_TIMELINE`` records
(Horovod's own docs warn of a large throughput loss with its timeline).

Method: the models of ``benchmarks/train_step.py`` (a ~25M-parameter MLP: few large tensors; a stack
of small transformer blocks: ~200 tensors, i.e. ~800 timeline events per step).  One 2-rank job per
model, launched with ``HOROVOD_TIMELINE=DYNAMIC``; after warm-up it times ``--rounds`` rounds of
``--steps`` steps, alternating timeline on (``hvd.start_timeline(<file per round>)`` .. ``stop``) and
off, on/off then off/on, so machine noise hits both alike.  Start/stop are outside the timed region.
A round's rate is the slowest rank's; the ratio is the median of per-round on/off ratios.  Also
reported: events and bytes written per step.

Usage: ``python benchmarks/timeline_overhead.py [--models mlp,transformer --steps 5 --rounds 6]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(kind: str, steps: int, rounds: int, warmup: int, out_dir: str) -> Dict[str, Any]:
    """Every rank: one model with DistributedOptimizer, timed with the timeline on and off."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import horovod_compat.torch as hvd
    from horovod_compat.common import timeline

    sys.path.insert(0, HERE)
    from train_step import build_model, make_batch   # the models of the training-step benchmark

    torch.set_num_threads(1)
    hvd.init()
    x, y = make_batch(kind, hvd.rank())
    model = build_model(kind)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def one_step() -> None:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        one_step()
    rates: Dict[str, List[float]] = {"on": [], "off": []}
    cpu: Dict[str, List[float]] = {"on": [], "off": []}   # process CPU seconds per step (all threads)
    files: List[str] = []
    for r in range(rounds):
        for variant in (("on", "off") if r % 2 == 0 else ("off", "on")):
            if variant == "on":
                path = os.path.join(out_dir, f"{kind}_round{r}.json")
                files.append(path)
                hvd.start_timeline(path)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                one_step()
            if variant == "on":
                rec = timeline._recorder
                if rec is not None:
                    rec.flush()      # the writer thread's work for these steps, counted in CPU time
            c1, t1 = time.process_time(), time.perf_counter()
            rates[variant].append(steps / (t1 - t0))
            cpu[variant].append((c1 - c0) / steps)
            if variant == "on":
                hvd.stop_timeline()
    hvd.shutdown()
    return {"rates": rates, "cpu": cpu, "files": files if os.environ.get("RANK") == "0" else [],
            "tensors": sum(1 for _ in model.parameters())}


def micro_cost(tensors: int = 194, steps: int = 20) -> Dict[str, float]:
    """CPU µs per hook event in this process: on the training thread (emit + our listener) and on the
    writer thread (translation + formatting + write), for a DistributedOptimizer-like event stream."""
    sys.path.insert(0, ROOT)
    from horovod_compat.timeline.writer import TimelineRecorder
    from horovod_compat.common import hooks

    names = [f"layer.{i}.weight" for i in range(tensors)]

    def stream() -> float:
        t0 = time.process_time()
        for _ in range(steps):
            for n in names:
                hooks.emit(hooks.NEGOTIATE_START, n, kind="allreduce")
                hooks.emit(hooks.ALL_READY, n)
                hooks.emit(hooks.OP_START, n, kind="allreduce", dtype="float32", shape=(128, 128), op=0)
            for n in names:
                hooks.emit(hooks.OP_END, n)
        return (time.process_time() - t0) / (steps * 4 * tensors) * 1e6

    with tempfile.TemporaryDirectory() as tmp:
        rec = TimelineRecorder(os.path.join(tmp, "micro.json"), rank=0, size=2, flush_ms=1e9)
        hooks.subscribe(rec.listener)
        try:
            hot = min(stream() for _ in range(3))
            t0 = time.process_time()
            rec.flush()
            writer = (time.process_time() - t0) / (3 * steps * 4 * tensors) * 1e6
        finally:
            hooks.unsubscribe(rec.listener)
            rec.close()
    return {"hot_us": hot, "writer_us": writer}


def run_model(kind: str, args: argparse.Namespace, out_dir: str) -> Dict[str, Any]:
    sys.path.insert(0, ROOT)
    from distributor import run_function
    from horovod_compat.timeline.reader import load_events

    env = {"HOROVOD_TIMELINE": "DYNAMIC"}
    results = run_function(worker, kind, args.steps, args.rounds, args.warmup, out_dir,
                           num_processes=2, return_all=True, timeout=1800, env=env)
    on = [min(r["rates"]["on"][i] for r in results) for i in range(args.rounds)]
    off = [min(r["rates"]["off"][i] for r in results) for i in range(args.rounds)]
    ratios = [a / b for a, b in zip(on, off)]
    # CPU seconds per step (max over ranks), less sensitive than wall time to other load on the host
    cpu_on = statistics.median(max(r["cpu"]["on"][i] for r in results) for i in range(args.rounds))
    cpu_off = statistics.median(max(r["cpu"]["off"][i] for r in results) for i in range(args.rounds))
    files = results[0]["files"]
    events = sum(len(load_events(f)) for f in files)
    nbytes = sum(os.path.getsize(f) for f in files)
    recorded_steps = args.steps * len(files)
    return {"tensors": results[0]["tensors"], "on": statistics.median(on), "off": statistics.median(off),
            "ratio": statistics.median(ratios), "ratios": ratios, "cpu_on": cpu_on, "cpu_off": cpu_off,
            "events_per_step": events / recorded_steps, "bytes_per_step": nbytes / recorded_steps}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds per variant (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    print(f"2 ranks, CPU, gloo, 1 torch thread per rank, hvd.DistributedOptimizer; {args.rounds} rounds x "
          f"{args.steps} steps per variant, alternating; rate = slowest rank; median of per-round ratios")
    ok = True
    out: Dict[str, Any] = {"micro": micro_cost()}
    print(f"cost per hook event (CPU): {out['micro']['hot_us']:.2f} us on the training thread, "
          f"{out['micro']['writer_us']:.2f} us on the timeline writer thread")
    with tempfile.TemporaryDirectory(prefix="tl_overhead_") as tmp:
        for kind in args.models.split(","):
            res = run_model(kind, args, tmp)
            out[kind] = res
            verdict = "OK" if res["ratio"] >= 0.95 else "BELOW TARGET"
            ok = ok and verdict == "OK"
            print(f"[{kind}] {res['tensors']} tensors: timeline off {res['off']:.2f} steps/s, on "
                  f"{res['on']:.2f} steps/s; ratio on/off = {res['ratio']:.3f} (target >= 0.95): {verdict}")
            print(f"  CPU per step (max over ranks, writer thread included): off {res['cpu_off'] * 1e3:.1f} ms, "
                  f"on {res['cpu_on'] * 1e3:.1f} ms (ratio off/on {res['cpu_off'] / res['cpu_on']:.3f})")
            print(f"  per-round ratios {', '.join(f'{r:.3f}' for r in res['ratios'])}; "
                  f"{res['events_per_step']:.0f} events, {res['bytes_per_step'] / 1024:.1f} KiB written per step")
    if args.json:
        print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
