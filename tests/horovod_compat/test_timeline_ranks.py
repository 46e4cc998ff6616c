"""Timelines recorded by real 2-rank jobs: Horovod's structure (checked against the reference files
of real Horovod 0.28.1), DYNAMIC start/stop semantics and errors, validity after SIGKILL, per-rank
files merged onto one time axis, summary and plot of the result."""
from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any
from pathlib import Path

import pytest

from distributor import RankFailedError
from horovod_compat.timeline.merge import merge_files
from horovod_compat.timeline.reader import format_summary, load_events, summarize
from warm import run_function_warm

REF = str(Path(__file__).resolve().parents[3] / "shared" / "reference" / "horovod_timeline")


def _balance(events):
    depth = defaultdict(int)
    for e in sorted((e for e in events if e.get("ph") in ("B", "E")), key=lambda e: e["ts"]):
        depth[(e["pid"], e.get("tid", 0))] += 1 if e["ph"] == "B" else -1
        assert depth[(e["pid"], e.get("tid", 0))] >= 0, f"E without B: {e}"
    return {k: v for k, v in depth.items() if v}


def _dynamic_job(path):
    """Every rank: misuse first, then the reference script's collectives inside start/stop."""
    import os
    import torch
    import horovod_compat.torch as hvd
    from horovod_compat.common import runtime

    errors = {}
    try:
        hvd.start_timeline(path)
    except ValueError as exc:
        errors["before_init"] = str(exc)
    hvd.init()
    r = hvd.rank()
    saved = os.environ.pop("HOROVOD_TIMELINE")
    try:
        hvd.start_timeline(path)
    except ValueError as exc:
        errors["no_env"] = str(exc)
    os.environ["HOROVOD_TIMELINE"] = saved
    hvd.allreduce(torch.ones(4), name="before_start")
    hvd.stop_timeline()                       # not recording: only logs, like Horovod
    hvd.start_timeline(path, mark_cycles=True)
    writing = runtime.current().timeline.current_path()
    hvd.allreduce(torch.ones(1000), name="grad_a")
    hs = [hvd.allreduce_async(torch.ones(100 * (i + 1)), name=f"fused_{i}") for i in range(3)]
    for h in hs:
        hvd.synchronize(h)
    hvd.allgather(torch.ones(r + 1, 2), name="gather_me")
    hvd.broadcast(torch.ones(3), root_rank=0, name="bcast_me")
    hvd.allreduce(torch.ones(10))
    hvd.grouped_allreduce([torch.ones(3), torch.ones(4)], name="grp")
    hvd.reducescatter(torch.ones(4), name="rs")
    hvd.alltoall(torch.ones(2), name="a2a")
    hvd.barrier()
    for _ in range(3):
        hvd.allreduce(torch.ones(8), name="same_name")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(4), name="after_stop")
    hvd.shutdown()
    return {"errors": errors, "writing": writing}


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tl") / "dyn.json")
    results = run_function_warm(_dynamic_job, path, num_processes=2, env={"HOROVOD_TIMELINE": "DYNAMIC"},
                           return_all=True, timeout=120)
    with open(path) as f:
        return results, json.load(f), path


def test_dynamic_errors_and_only_rank0_writes(dynamic_run):
    results, _, path = dynamic_run
    for res in results:
        assert res["errors"] == {
            "before_init": "Horovod has not been initialized; use hvd.init().",
            "no_env": "Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.",
        }
    assert results[0]["writing"] == path
    assert results[1]["writing"] is None


def test_structure_matches_horovod_reference(dynamic_run):
    _, ev, _ = dynamic_run
    ref = json.load(open(os.path.join(REF, "tl_cycles.json")))
    # metadata: pid 0 carries the wall-clock origin; every tensor pid has a name and a sort index
    assert ev[0]["name"] == "process_name" and ev[0]["pid"] == 0
    assert isinstance(ev[0]["args"]["start_time_since_epoch_in_micros"], int)
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name" and e["pid"]}
    sorts = {e["pid"] for e in ev if e.get("name") == "process_sort_index"}
    assert set(names) | {0} == sorts
    ref_names = {e["args"]["name"] for e in ref if e.get("name") == "process_name" and e["pid"]}
    common = {"allreduce.grad_a", "allreduce.fused_0", "allreduce.fused_1", "allreduce.fused_2",
              "allgather.gather_me", "broadcast.bcast_me", "reducescatter.rs", "alltoall.a2a"}
    assert common <= ref_names and common <= set(names.values())
    assert not any("before_start" in n or "after_stop" in n for n in names.values())
    # same phases as Horovod's file, and the same event names (two documented differences)
    assert {e["ph"] for e in ev} == {e["ph"] for e in ref} == {"M", "B", "E", "X", "i"}
    ours = {e["name"] for e in ev if e["ph"] in ("B", "i")}
    theirs = {e["name"] for e in ref if e["ph"] in ("B", "i")}
    # Horovod: MPI_ALLTOALL; an E without B; SHM_ALLREDUCE: allreduce data through our
    # shared-memory transport (Horovod on gloo writes GLOO_ALLREDUCE)
    assert ours - theirs <= {"GLOO_ALLTOALL", "BARRIER", "SHM_ALLREDUCE"}
    for n in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "SHM_ALLREDUCE", "NEGOTIATE_ALLGATHER", "ALLGATHER",
              "GLOO_ALLGATHER", "NEGOTIATE_BROADCAST", "BROADCAST", "GLOO_BCAST",
              "NEGOTIATE_REDUCESCATTER", "REDUCESCATTER", "GLOO_REDUCESCATTER", "NEGOTIATE_ALLTOALL",
              "ALLTOALL", "NEGOTIATE_BARRIER", "CYCLE_START"):
        assert n in ours, n
    assert all(e["s"] == "g" for e in ev if e["ph"] == "i")
    assert _balance(ev) == {}
    last_ts = {}
    for e in ev:                       # per tensor, file order is time order (no viewer must sort)
        if "ts" in e and "pid" in e:
            assert e["ts"] >= last_ts.get(e["pid"], 0), e
            last_ts[e["pid"]] = e["ts"]
    # every negotiation starts with this rank's tick; the op's closing E carries dtype and shape
    pid_grad = next(p for p, n in names.items() if n == "allreduce.grad_a")
    seq = [e for e in ev if e.get("pid") == pid_grad and e["ph"] != "M"]
    assert (seq[0]["ph"], seq[0]["name"]) == ("B", "NEGOTIATE_ALLREDUCE")
    ticks = []
    for e in seq[1:]:
        if e["ph"] != "X":
            break
        ticks.append(e["name"])
    # this rank's tick; the others' too when negotiation reports their ready times
    assert "0" in ticks and set(ticks) <= {"0", "1"} and len(ticks) == len(set(ticks))
    assert seq[-1]["args"] == {"dtype": "float32", "shape": "[1000]"}
    pid_same = next(p for p, n in names.items() if n == "allreduce.same_name")
    assert sum(1 for e in ev if e.get("pid") == pid_same and e.get("name") == "ALLREDUCE") == 3
    assert sum(1 for e in ev if e["ph"] == "i") >= 10       # mark_cycles=True: one per burst
    ts = [e["ts"] for e in ev if "ts" in e]
    assert min(ts) >= 0 and max(ts) < 120e6                  # µs since init


def _crash_job(pattern, steps):
    """Rank 1 is late for every allreduce, then SIGKILLs itself mid-run; rank 0 is killed by the
    engine while it waits in the next collective."""
    import os
    import signal
    import time
    import torch
    import horovod_compat.torch as hvd

    hvd.init()
    hvd.start_timeline(pattern)
    r = hvd.rank()
    for _ in range(steps):
        if r == 1:
            time.sleep(0.02)
        hvd.allreduce(torch.ones(256), name="step")
    time.sleep(2.0)  # 40 x HOROVOD_TIMELINE_FLUSH_MS (50): on disk even if the writer waits its turn
    if r == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(torch.ones(256), name="step")      # rank 0 waits here until it is killed
    return "unreachable"


def test_sigkilled_ranks_leave_valid_per_rank_files_that_merge(tmp_path):
    pattern = str(tmp_path / "tl.{rank}.json")
    steps = 15
    with pytest.raises(RankFailedError):
        run_function_warm(_crash_job, pattern, steps, num_processes=2, timeout=120,
                     env={"HOROVOD_TIMELINE": "DYNAMIC", "HOROVOD_TIMELINE_FLUSH_MS": "50",
                          "HOROVOD_STALL_CHECK_DISABLE": "1"})
    files = [pattern.replace("{rank}", str(r)) for r in (0, 1)]
    for r, f in enumerate(files):
        with open(f) as fh:
            ev = json.load(fh)                       # valid JSON although the rank was killed
        assert ev[0]["args"]["horovod_compat"]["rank"] == r
        done = [e for e in ev if e["ph"] == "E" and e.get("args", {}).get("shape") == "[256]"]
        assert len(done) >= steps, (r, len(done))
    merged = str(tmp_path / "merged.json")
    info = merge_files(files, merged)
    assert info["ranks"] == [0, 1]
    m = json.load(open(merged))
    assert {e.get("tid") for e in m if e["ph"] == "X"} == {0, 1}
    s = summarize(m)
    per = s["negotiation"]["per_rank"]
    assert s["negotiation"]["multi_rank_instances"] >= steps
    # rank 1 came 20 ms late to every allreduce: it is the one that made rank 0 wait
    assert per[1]["last"] >= steps - 1 and per[1]["caused_us"] > (steps - 1) * 15_000
    assert per[0]["waited_us"] > per[1]["waited_us"]
    assert "rank 1 made the others wait most" in format_summary(s)
    from horovod_compat.timeline.plot import plot_gantt
    png = str(tmp_path / "merged.png")
    out = plot_gantt(m, png)
    assert sorted(out["rows"]) == ["allreduce.step [rank 0]", "allreduce.step [rank 1]"]
    assert os.path.getsize(png) > 20_000


def _env_job():
    import torch
    import horovod_compat.torch as hvd
    from horovod_compat.common import runtime

    hvd.init()
    writing = runtime.current().timeline.current_path()
    for _ in range(3):
        hvd.allreduce(torch.ones(5), name="env_started")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    hvd.shutdown()               # flushes the timeline; the next init continues the same file
    hvd.init()
    hvd.allreduce(torch.ones(2), name="after_reinit")
    hvd.shutdown()
    return writing


def test_horovod_timeline_env_starts_at_init_and_records_the_optimizer(tmp_path):
    path = str(tmp_path / "env.json")
    writing = run_function_warm(_env_job, num_processes=2, return_all=True, timeout=120,
                           env={"HOROVOD_TIMELINE": path, "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert writing == [path, None]                    # only rank 0 writes, as in Horovod
    ev = json.load(open(path))
    assert _balance(ev) == {}
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name" and e["pid"]}
    by_name = defaultdict(list)
    for e in ev:
        if e["ph"] == "E" and "args" in e and e.get("pid") in names:
            by_name[names[e["pid"]]].append(e["args"])
    assert by_name["allreduce.env_started"] == [{"dtype": "float32", "shape": "[5]"}] * 3
    # DistributedOptimizer: one row per parameter, Horovod's naming, one allreduce per step
    for pname, shape in (("0.weight", "[3, 4]"), ("0.bias", "[3]"), ("2.weight", "[1, 3]"), ("2.bias", "[1]")):
        assert by_name[f"allreduce.{pname}"] == [{"dtype": "float32", "shape": shape}] * 3, pname
    # The optimizer's fused bucket reads as Horovod's fusion: inside each ALLREDUCE span the copy
    # into the fusion buffer, then the transfer; the first step also copies out (later steps
    # leave p.grad as a view of the bucket: no copy, no span).
    for pname in ("0.weight", "2.bias"):
        pid = next(p for p, n in names.items() if n == f"allreduce.{pname}")
        spans = [e["name"] for e in ev if e.get("pid") == pid and e["ph"] == "B"]
        ops = [spans[i:i + 5] for i, n in enumerate(spans) if n == "NEGOTIATE_ALLREDUCE"]
        assert len(ops) == 3
        # (the transfer is the shared-memory transport's: the ranks share this host)
        assert all(op[1:4] == ["ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "SHM_ALLREDUCE"] for op in ops), ops
        assert ops[0][4] == "MEMCPY_OUT_FUSION_BUFFER"
    assert by_name["allreduce.after_reinit"] == [{"dtype": "float32", "shape": "[2]"}]
    ts = [e["ts"] for e in ev if "ts" in e]
    last = max(e["ts"] for e in ev if e.get("args", {}).get("shape") == "[2]")
    assert last == max(ts)       # one time axis across shutdown -> init
    cycles = sum(1 for e in ev if e.get("name") == "CYCLE_START")
    assert 7 <= cycles <= 8    # 4 allreduces + 3 optimizer steps (+ the bucket-order rebuild)


def _late_rank_job(delay: float) -> str:
    """Rank 1 submits the named allreduce ``delay`` s after rank 0: first as a cache miss (checked
    in a verification round), then as a cache hit (speculative fast path)."""
    import time
    import torch
    import horovod_compat.torch as hvd
    from horovod_compat.common import process_sets

    hvd.init()
    control = type(hvd.global_process_set.negotiation.exchange).__name__
    for _ in range(2):
        hvd.barrier()
        if hvd.rank() == 1:
            time.sleep(delay)
        hvd.allreduce(torch.ones(16), name="late")
    if hvd.rank() == 0:      # rank 1 has joined: it has no readiness tick for this one
        hvd.allreduce(torch.ones(16), name="while_joined")
    hvd.join()
    hvd.shutdown()
    return control


@pytest.mark.parametrize("shm, control", [("1", "ShmExchange"), ("0", "TcpExchange")])
def test_negotiation_shows_each_ranks_readiness(tmp_path: Any, shm: str, control: str) -> None:
    """Rank 0's file (the only one written) holds one tick per rank in every NEGOTIATE span of the
    late tensor, rank 1's as late as rank 1 really was, over either control transport."""
    path = str(tmp_path / "late.json")
    delay = 0.3
    used = run_function_warm(_late_rank_job, delay, num_processes=2, return_all=True, timeout=120,
                        env={"HOROVOD_TIMELINE": path, "HOROVOD_COMPAT_SHM_CONTROL": shm,
                             "HOROVOD_STALL_CHECK_DISABLE": "1"})
    assert used == [control, control]
    ev = json.load(open(path))
    assert _balance(ev) == {}
    pid = next(e["pid"] for e in ev if e.get("name") == "process_name"
               and e["args"].get("name") == "allreduce.late")
    seq = [e for e in ev if e.get("pid") == pid and e["ph"] != "M"]
    spans = [i for i, e in enumerate(seq) if e["ph"] == "B" and e["name"] == "NEGOTIATE_ALLREDUCE"]
    assert len(spans) == 2
    # the data moved through shared memory with the shared-memory control, else over the TCP mesh
    activity = "SHM_ALLREDUCE" if shm == "1" else "TCP_ALLREDUCE"
    assert [e["name"] for e in seq if e["ph"] == "B" and e["name"].endswith("_ALLREDUCE")
            and not e["name"].startswith("NEGOTIATE")] == [activity] * 2
    for i in spans:
        begin, ticks = seq[i], {}
        j = i + 1
        while seq[j]["ph"] == "X":
            ticks[seq[j]["name"]] = seq[j]["ts"]
            j += 1
        end = seq[j]
        assert end["ph"] == "E"
        assert set(ticks) == {"0", "1"}, seq[i:j + 1]
        late_us = ticks["1"] - ticks["0"]
        assert 0.8 * delay * 1e6 < late_us < delay * 1e6 + 150_000, (ticks, seq[i:j + 1])
        # the span runs from the first rank's readiness to (at least) the last one's
        assert begin["ts"] == ticks["0"] and end["ts"] >= ticks["1"]
    pid = next(e["pid"] for e in ev if e.get("name") == "process_name"
               and e["args"].get("name") == "allreduce.while_joined")
    assert [e["name"] for e in ev if e.get("pid") == pid and e["ph"] == "X"] == ["0"]
