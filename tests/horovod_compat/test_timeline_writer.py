"""Timeline writer and reader without launching ranks: file validity at every flush, Horovod's
event structure from hook events, bounds, summary/plot/merge, and the CLI on the reference files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from horovod_compat.timeline.merge import merge_files
from horovod_compat.timeline.reader import format_summary, load_events, parse, summarize
from horovod_compat.timeline.writer import TimelineRecorder, TraceFile, display_name

REF = str(Path(__file__).resolve().parents[3] / "shared" / "reference" / "horovod_timeline")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def balanced_per_pid(events):
    """{pid: open B count} after replaying B/E in timestamp order (0 everywhere = balanced)."""
    depth = defaultdict(int)
    bad = []
    for e in sorted((e for e in events if e.get("ph") in ("B", "E")), key=lambda e: e["ts"]):
        key = (e["pid"], e.get("tid", 0))
        depth[key] += 1 if e["ph"] == "B" else -1
        if depth[key] < 0:
            bad.append(e)
    return {k: v for k, v in depth.items() if v}, bad


def feed(rec, events):
    for ev, name, info in events:
        rec.listener(ev, name, info)


def test_trace_file_is_valid_json_after_every_append(tmp_path):
    path = str(tmp_path / "t.json")
    f = TraceFile(path, ['{"name": "process_name", "ph": "M", "pid": 0, "args": {}}'])
    assert json.load(open(path)) == [{"name": "process_name", "ph": "M", "pid": 0, "args": {}}]
    for i in range(50):
        f.append([json.dumps({"ph": "i", "name": "x", "ts": i, "s": "g"})] * (i % 3 + 1))
        data = json.load(open(path))           # valid after EVERY write
        assert data[-1]["ts"] == i
    assert f.size == os.path.getsize(path)
    f.close()
    assert len(json.load(open(path))) == 1 + sum(i % 3 + 1 for i in range(50))


def test_reader_salvages_truncated_files(tmp_path):
    good = [{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1}, {"ph": "E", "ts": 5, "pid": 1}]
    p = tmp_path / "cut.json"
    p.write_text("[\n" + ",\n".join(json.dumps(e) for e in good) + ',\n{"ph": "B", "na')
    assert load_events(str(p)) == good
    p.write_text("[\n")                       # Horovod's file after a crash
    assert load_events(str(p)) == []


SPECULATIVE = [  # a cache hit: the transfer starts before negotiation has finished
    ("NEGOTIATE_START", "grad", {"kind": "allreduce"}),
    ("OP_START", "grad", {"kind": "allreduce", "dtype": "float32", "shape": (4, 2), "op": 0}),
    ("ALL_READY", "grad", {}),
    ("OP_END", "grad", {}),
]
SLOW = [  # first time: negotiation, then the transfer
    ("NEGOTIATE_START", "grad", {"kind": "allreduce"}),
    ("ALL_READY", "grad", {}),
    ("OP_START", "grad", {"kind": "allreduce", "dtype": "float32", "shape": (4, 2), "op": 0}),
    ("OP_END", "grad", {}),
]


def test_recorder_builds_horovod_structure_for_both_negotiation_paths(tmp_path):
    path = str(tmp_path / "tl.json")
    rec = TimelineRecorder(path, rank=0, size=2, mark_cycles=True, flush_ms=10_000)
    feed(rec, SLOW + SPECULATIVE + [
        ("NEGOTIATE_START", "", {"kind": "broadcast"}),
        ("ALL_READY", "", {}),
        ("OP_START", "", {"kind": "broadcast", "dtype": "torch.int64", "shape": (3,)}),
        ("OP_END", "", {}),
    ])
    rec.close()
    ev = json.load(open(path))
    assert ev[0]["pid"] == 0 and "start_time_since_epoch_in_micros" in ev[0]["args"]
    assert ev[1] == {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name" and e["pid"]}
    assert names == {1: "allreduce.grad", 2: "broadcast.noname"}
    seq = [(e["ph"], e.get("name")) for e in ev if e.get("pid") == 1 and e["ph"] != "M"]
    one = [("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"), ("E", None), ("B", "ALLREDUCE"),
           ("B", "GLOO_ALLREDUCE"), ("E", None), ("E", None)]
    assert seq == one + one
    closing = [e for e in ev if e.get("pid") == 1 and e["ph"] == "E" and "args" in e]
    assert [c["args"] for c in closing] == [{"dtype": "float32", "shape": "[4, 2]"}] * 2
    bcast = [e for e in ev if e.get("pid") == 2]
    assert "GLOO_BCAST" in [e.get("name") for e in bcast]
    assert bcast[-1]["args"] == {"dtype": "int64", "shape": "[3]"}
    assert sum(1 for e in ev if e.get("name") == "CYCLE_START") == 3      # three bursts
    assert balanced_per_pid(ev) == ({}, [])
    assert all(isinstance(e["ts"], int) and e["ts"] >= 0 for e in ev if "ts" in e)


def test_ready_ticks_from_negotiation_show_every_rank(tmp_path):
    path = str(tmp_path / "tl.json")
    rec = TimelineRecorder(path, rank=0, size=3, flush_ms=10_000)
    t_neg = time.time_ns() // 1000
    rec.listener("NEGOTIATE_START", "w", {"kind": "allreduce"})
    time.sleep(0.01)
    ready = [t_neg, t_neg + 5000, t_neg + 9000]
    rec.listener("ALL_READY", "w", {"ready_us": ready, "ranks": [0, 1, 2]})
    rec.listener("OP_START", "w", {"kind": "allreduce", "dtype": "float32", "shape": (1,)})
    rec.listener("OP_END", "w", {})
    rec.close()
    ev = json.load(open(path))
    ticks = [(e["name"], e["ts"]) for e in ev if e["ph"] == "X"]
    assert [t[0] for t in ticks] == ["0", "1", "2"]
    assert abs(ticks[1][1] - ticks[0][1] - 5000) < 1000 and abs(ticks[2][1] - ticks[0][1] - 9000) < 1000
    s = summarize(ev)
    per = s["negotiation"]["per_rank"]
    assert per[2]["last"] == 1 and per[0]["last"] == 0
    assert per[0]["waited_us"] > per[1]["waited_us"] > 0
    assert "rank 2 made the others wait most" in format_summary(s)


def test_a_rank_ready_for_the_next_op_before_this_rank_finished_the_previous_one(tmp_path) -> None:
    """Rank 1 finished op 1 of tensor "w" first and submitted op 2 while rank 0 was still in op 1:
    its tick is drawn at op 1's end, so the spans of "w" do not overlap and stay in time order."""
    path = str(tmp_path / "tl.json")
    rec = TimelineRecorder(path, rank=0, size=2, flush_ms=10_000)
    op = {"kind": "allreduce", "dtype": "float32", "shape": (1,)}
    rec.listener("NEGOTIATE_START", "w", {"kind": "allreduce"})
    rec.listener("ALL_READY", "w", {})
    rec.listener("OP_START", "w", op)
    time.sleep(0.005)
    early = time.time_ns() // 1000          # rank 1 submits op 2 here
    time.sleep(0.005)
    rec.listener("OP_END", "w", {})
    time.sleep(0.002)
    rec.listener("NEGOTIATE_START", "w", {"kind": "allreduce"})
    rec.listener("ALL_READY", "w", {"ready_us": [time.time_ns() // 1000, early], "ranks": [0, 1]})
    rec.listener("OP_START", "w", op)
    rec.listener("OP_END", "w", {})
    rec.close()
    ev = [e for e in json.load(open(path)) if e.get("pid") == 1 and e["ph"] != "M"]
    assert [e["ts"] for e in ev] == sorted(e["ts"] for e in ev)
    i = next(i for i, e in enumerate(ev) if e["ph"] == "E" and "args" in e)   # op 1's closing E
    first_end, second = ev[i]["ts"], ev[i + 1:]
    assert [(e["ph"], e.get("name")) for e in second[:3]] == [
        ("B", "NEGOTIATE_ALLREDUCE"), ("X", "1"), ("X", "0")]
    assert second[0]["ts"] == second[1]["ts"] == first_end
    assert balanced_per_pid(ev) == ({}, [])


def test_ranks_ready_before_the_writer_open_the_span_and_speculative_ops_nest(tmp_path):
    """Rank 1 was ready 3 ms before rank 0 submitted (a cache hit: rank 0 launched at once)."""
    path = str(tmp_path / "tl.json")
    rec = TimelineRecorder(path, rank=0, size=2, flush_ms=10_000)
    time.sleep(0.01)
    # read before rank 0's own tick (its NEGOTIATE_START), so that rank 1's tick is at least 3 ms
    # before it however long the machine takes between the two lines
    t0 = (time.perf_counter_ns() - rec._anchor_perf) // 1000
    rec.listener("NEGOTIATE_START", "w", {"kind": "allreduce"})
    rec.listener("OP_START", "w", {"kind": "allreduce", "dtype": "float32", "shape": (1,)})
    rec.listener("ALL_READY", "w", {"ready_us": [rec._anchor_wall_us + t0, rec._anchor_wall_us + t0 - 3000],
                                    "ranks": [0, 1]})
    rec.listener("OP_END", "w", {})
    rec.close()
    ev = [e for e in json.load(open(path)) if e.get("pid") == 1 and e["ph"] != "M"]
    assert [(e["ph"], e.get("name")) for e in ev] == [
        ("B", "NEGOTIATE_ALLREDUCE"), ("X", "1"), ("X", "0"), ("E", None), ("B", "ALLREDUCE"),
        ("B", "GLOO_ALLREDUCE"), ("E", None), ("E", None)]
    assert ev[0]["ts"] == ev[1]["ts"] <= ev[2]["ts"] - 3000          # span opens at rank 1's tick
    assert ev[3]["ts"] <= ev[4]["ts"]                                  # op after negotiation
    assert balanced_per_pid(ev) == ({}, [])
    per = summarize(json.load(open(path)))["negotiation"]["per_rank"]
    assert per[0]["last"] == 1 and per[1]["waited_us"] >= 3000


def test_fusion_activities_and_ops_without_negotiation(tmp_path):
    """An op without negotiation, with fusion-buffer copies reported as activities: the copy out
    ends the backend transfer span and nests in the op."""
    path = str(tmp_path / "tl.json")
    rec = TimelineRecorder(path, rank=0, size=2, flush_ms=10_000)
    feed(rec, [
        ("OP_START", "fc.weight", {"kind": "allreduce", "dtype": "float32", "shape": (10,)}),
        ("ACTIVITY_START", "fc.weight", {"activity": "MEMCPY_OUT_FUSION_BUFFER"}),
        ("ACTIVITY_END", "fc.weight", {}),
        ("OP_END", "fc.weight", {}),
    ])
    rec.close()
    ev = json.load(open(path))
    assert [e["args"]["name"] for e in ev if e.get("name") == "process_name" and e["pid"]] == ["allreduce.fc.weight"]
    seq = [(e["ph"], e.get("name")) for e in ev if e.get("pid") == 1 and e["ph"] != "M"]
    assert seq == [("B", "ALLREDUCE"), ("B", "GLOO_ALLREDUCE"), ("E", None),
                   ("B", "MEMCPY_OUT_FUSION_BUFFER"), ("E", None), ("E", None)]
    assert balanced_per_pid(ev) == ({}, [])


def test_unfinished_ops_are_closed_on_stop_and_errors_recorded(tmp_path):
    path = str(tmp_path / "tl.json")
    rec = TimelineRecorder(path, rank=0, size=2, flush_ms=10_000)
    feed(rec, [
        ("NEGOTIATE_START", "bad", {"kind": "allreduce"}),
        ("OP_END", "bad", {"error": "Mismatched ALLREDUCE tensor shapes"}),
        ("NEGOTIATE_START", "hung", {"kind": "allgather"}),
    ])
    rec.close()
    ev = json.load(open(path))
    assert balanced_per_pid(ev) == ({}, [])
    ends = [e for e in ev if e["ph"] == "E"]
    assert ends[0]["args"] == {"error": "Mismatched ALLREDUCE tensor shapes"}
    assert ends[1]["args"] == {"incomplete": True}


def test_max_bytes_and_cycle_window_bound_the_file(tmp_path):
    def run(**kw):
        path = str(tmp_path / f"tl{len(kw)}{sorted(kw)}.json")
        rec = TimelineRecorder(path, rank=0, size=2, flush_ms=10_000, **kw)
        for i in range(400):
            feed(rec, SLOW)
            if i % 50 == 0:
                rec.flush()
        rec.close()
        return path, json.load(open(path))

    _, full = run()
    path, small = run(max_bytes=8000)
    assert os.path.getsize(path) < 9000 < len(json.dumps(full))
    assert balanced_per_pid(small) == ({}, [])
    assert any(e.get("name") == "timeline_truncated" for e in small)
    _, window = run(cycles=(10, 15))
    assert sum(1 for e in window if e.get("name") == "ALLREDUCE") == 5
    assert balanced_per_pid(window) == ({}, [])


def test_display_names_follow_horovod():
    assert display_name("grad_a", "allreduce") == "allreduce.grad_a"
    assert display_name("allreduce.noname.7", "allreduce") == "allreduce.noname.7"
    assert display_name("grp", "grouped_allreduce") == "grouped_allreduce.grp"
    assert display_name("", "barrier") == "barrier.noname"


def test_summary_of_horovods_reference_timeline():
    s = summarize(load_events(os.path.join(REF, "tl.json")))
    assert s["ops"]["ALLREDUCE"]["count"] == 7
    # fused_0..2 and grp_1of2/2of2 ran together: in-flight wall time is less than the sum
    ar = s["ops"]["ALLREDUCE"]
    assert ar["total_us"] - ar["wall_us"] > 36_000
    assert s["ops"]["BROADCAST"]["wall_us"] == s["ops"]["BROADCAST"]["total_us"]
    assert set(s["ops"]) == {"ALLREDUCE", "ALLGATHER", "BROADCAST", "REDUCESCATTER", "ALLTOALL"}
    assert s["activities"]["MEMCPY_IN_FUSION_BUFFER"]["count"] == 6
    per = s["negotiation"]["per_rank"]
    assert per[0]["negotiations"] == per[1]["negotiations"] == 12
    assert per[1]["last"] == 10 and per[0]["last"] == 2     # read off the ticks by hand
    assert per[1]["caused_us"] == pytest.approx(per[0]["waited_us"])


def test_cli_summarize_plot_and_merge(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    png = str(tmp_path / "g.png")
    out = subprocess.run([sys.executable, "-m", "horovod_compat.timeline", "summarize",
                          os.path.join(REF, "tl_cycles.json"), "--plot", png],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ALLREDUCE" in out.stdout and "made the others wait most" in out.stdout
    assert "cycles marked" in out.stdout and " 0 cycles" not in out.stdout
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 20_000
    # merge two copies of a rank file shifted by 1 s: the second lands 1 s later, own tid
    ev = load_events(os.path.join(REF, "dyn_rank0.json"))
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    for path, rank, shift in ((a, 0, 0), (b, 1, 1_000_000)):
        ev2 = json.loads(json.dumps(ev))
        ev2[0]["args"]["start_time_since_epoch_in_micros"] += shift
        ev2[0]["args"]["horovod_compat"] = {"rank": rank}
        for e in ev2:
            if e.get("name") in ("0", "1") and e["ph"] == "X":
                e["name"] = str(rank)
        json.dump(ev2, open(path, "w"))
    merged = str(tmp_path / "m.json")
    out = subprocess.run([sys.executable, "-m", "horovod_compat.timeline", "merge", b, a, "-o", merged],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    m = json.load(open(merged))
    firsts = {}
    for e in m:
        if e.get("ph") == "B" and e.get("tid") not in firsts:
            firsts[e["tid"]] = e["ts"]
    assert firsts[1] - firsts[0] == 1_000_000
    assert [e["args"]["name"] for e in m if e.get("name") == "process_name" and e["pid"]] == ["allreduce.same_name"]
    assert balanced_per_pid(m) == ({}, [])
    s = summarize(m)
    # only the first negotiation has ticks (the other two hit Horovod's response cache)
    assert s["negotiation"]["multi_rank_instances"] == 1
    assert s["negotiation"]["per_rank"][1]["last"] == 1      # rank 1's file starts 1 s later
    assert s["negotiation"]["per_rank"][0]["waited_us"] == pytest.approx(1_000_000, abs=20_000)


def test_adapter_env_parsing_and_stop_without_start(caplog, monkeypatch):
    import logging
    from horovod_compat.common import timeline

    assert timeline._parse_bytes("64M") == 64 * 1024 * 1024
    assert timeline._parse_bytes("1.5k") == 1536
    assert timeline._parse_bytes("4096") == 4096
    assert timeline._parse_bytes("") == 0
    assert timeline._parse_steps("10:20") == (10, 20)
    assert timeline._parse_steps("5:") == (5, None)
    assert timeline._parse_steps(":3") == (0, 3)
    assert timeline._parse_steps("") is None
    assert timeline.resolve_path("/x/tl.{rank}.json", 3) == "/x/tl.3.json"
    assert timeline.resolve_path("/x/tl.json", 0) == "/x/tl.json"
    assert timeline.resolve_path("/x/tl.json", 1) is None
    monkeypatch.delenv("HOROVOD_TIMELINE", raising=False)
    session = timeline.Session()
    with pytest.raises(ValueError, match=r"^Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage\.$"):
        session.start("/tmp/never.json", False, 0, 1)
    with caplog.at_level(logging.INFO, logger="horovod_compat.timeline"):
        session.stop()
    assert "Timeline is already stopped" in caplog.text
    assert not session.is_recording() and session.state is timeline.State.OFF


def test_session_states_through_shutdown_and_init(tmp_path, monkeypatch):
    """An env recording pauses at shutdown and goes on in the same file at the next init; a
    start_timeline recording ends at shutdown."""
    from horovod_compat.common import timeline

    path = str(tmp_path / "tl.json")
    monkeypatch.setenv("HOROVOD_TIMELINE", path)
    session = timeline.Session()
    session.on_init(0, 1)
    assert session.state is timeline.State.RECORDING and session.current_path() == path
    session.on_shutdown()
    assert session.state is timeline.State.PAUSED and session.current_path() == path
    session.on_init(0, 1)
    assert session.state is timeline.State.RECORDING and session.current_path() == path
    other = str(tmp_path / "dyn.json")
    session.start(other, False, 0, 1)  # another path: the env file closes, the new one opens
    assert session.current_path() == other and not session.from_env
    session.on_shutdown()
    assert session.state is timeline.State.OFF and session.current_path() is None
    assert json.load(open(path)) and json.load(open(other))  # both valid JSON when closed


def test_unwritable_env_timeline_warns_instead_of_failing_init(tmp_path, monkeypatch):
    from horovod_compat.common import timeline

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("HOROVOD_TIMELINE", str(blocker / "sub" / "tl.json"))   # parent is a file
    session = timeline.Session()
    with pytest.warns(RuntimeWarning, match="will not write a timeline"):
        session.on_init(0, 1)
    assert not session.is_recording() and session.current_path() is None
