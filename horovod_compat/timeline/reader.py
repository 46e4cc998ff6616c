"""Reading a Horovod timeline back: tolerant loading, spans, and the summary.

Works on Horovod 0.28.1's own files, on ours, and on merged per-rank files (``tid`` = rank).

``load_events(path)`` accepts a file cut short by a crash (a missing ``]``, a half-written last
event, Horovod's ``[``-only file): it keeps every complete event.

``summarize(events)`` answers the questions people open a timeline for:

* per op (``ALLREDUCE``, ``BROADCAST``...) and per backend activity (``GLOO_ALLREDUCE``,
  ``MEMCPY_IN_FUSION_BUFFER``...): count, total and mean time;
* the tensors that cost most;
* negotiation wait per rank: in every ``NEGOTIATE_<OP>`` the per-rank ``X`` ticks say when each rank
  became ready; the last rank to tick made the others wait (``last - tick`` each).  With ticks from
  one rank only (a rank-0 file whose negotiation did not report the others), the per-rank line
  still shows how long that rank waited (span length).

Rows of horovod-compat's internal bookkeeping ops (a ``process_labels`` metadata event carrying
``writer.INTERNAL_LABEL``, see ``writer``) are in ``Timeline.internal``; ``summarize`` leaves them
out unless ``internal=True``.  ``STEP`` instants (training-step ends written for
``DistributedOptimizer``) are in ``Timeline.steps``, Horovod's ``CYCLE_START`` in ``Timeline.cycles``.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from .writer import INTERNAL_LABEL, STEP_MARK

__all__ = ["load_events", "Span", "Timeline", "parse", "without_internal", "summarize",
           "format_summary"]


def load_events(path: str) -> List[Dict[str, Any]]:
    """All complete events of a Chrome-trace JSON array (or ``{"traceEvents": [...]}``) file."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _salvage(text)
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def _salvage(text: str) -> List[Dict[str, Any]]:
    """Decode event after event until the text stops making sense (a crash-truncated file)."""
    dec = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        return []
    i += 1
    out: List[Dict[str, Any]] = []
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if isinstance(obj, dict):
            out.append(obj)
    return out


@dataclass
class Span:
    """A closed ``B``/``E`` pair (or an ``X`` with a duration) on one (pid, tid)."""

    pid: int
    tid: int
    name: str
    start: float
    end: float
    depth: int
    args: Dict[str, Any] = field(default_factory=dict)

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """Events organised: process names, spans, per-rank ticks and metadata."""

    processes: Dict[int, str]
    spans: List[Span]
    ticks: List[Tuple[int, int, int, float]]       # (pid, tid, rank, ts)
    cycles: List[float]
    unclosed: int                                   # B events without their E
    meta: Dict[str, Any]
    first_ts: float
    last_ts: float
    internal: Set[int] = field(default_factory=set)  # pids of internal ops' rows
    steps: List[Tuple[float, int, Dict[str, Any]]] = field(default_factory=list)  # (ts, tid, args)


def parse(events: Iterable[Dict[str, Any]]) -> Timeline:
    """Build spans from B/E pairs (matched per pid and tid, in timestamp order)."""
    processes: Dict[int, str] = {}
    meta: Dict[str, Any] = {}
    timed: List[Tuple[float, int, Dict[str, Any]]] = []
    cycles: List[float] = []
    internal: Set[int] = set()
    steps: List[Tuple[float, int, Dict[str, Any]]] = []
    for k, e in enumerate(events):
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "process_labels":
                labels = str((e.get("args") or {}).get("labels", ""))
                if INTERNAL_LABEL in (x.strip() for x in labels.split(",")):
                    internal.add(int(e.get("pid", 0)))
                continue
            if e.get("name") == "process_name":
                args = e.get("args") or {}
                if "name" in args:
                    processes[int(e.get("pid", 0))] = str(args["name"])
                else:
                    meta.update(args)
            elif e.get("name") not in ("process_sort_index", "thread_name", "thread_sort_index"):
                meta[str(e.get("name"))] = e.get("args")
            continue
        if "ts" not in e:
            continue
        if ph == "i" or ph == "I":
            if e.get("name") == "CYCLE_START":
                cycles.append(float(e["ts"]))
            elif e.get("name") == STEP_MARK:
                steps.append((float(e["ts"]), int(e.get("tid", 0) or 0), dict(e.get("args") or {})))
            continue
        timed.append((float(e["ts"]), k, e))
    # E before B at equal timestamps would break nesting: keep file order for ties
    timed.sort(key=lambda x: (x[0], x[1]))
    stacks: Dict[Tuple[int, int], List[Tuple[str, float, Dict[str, Any]]]] = defaultdict(list)
    spans: List[Span] = []
    ticks: List[Tuple[int, int, int, float]] = []
    first = timed[0][0] if timed else 0.0
    last = timed[-1][0] if timed else 0.0
    for ts, _, e in timed:
        pid, tid = int(e.get("pid", 0)), int(e.get("tid", 0))
        ph = e.get("ph")
        if ph == "B":
            stacks[(pid, tid)].append((str(e.get("name", "")), ts, dict(e.get("args") or {})))
        elif ph == "E":
            st = stacks[(pid, tid)]
            if not st:
                continue   # Horovod's barrier writes an E without a B
            name, start, args = st.pop()
            args.update(e.get("args") or {})
            spans.append(Span(pid, tid, name, start, ts, len(st), args))
        elif ph == "X":
            name = str(e.get("name", ""))
            dur = float(e.get("dur", 0) or 0)
            if dur == 0 and name.isdigit():
                ticks.append((pid, tid, int(name), ts))
            else:
                depth = len(stacks[(pid, tid)])
                spans.append(Span(pid, tid, name, ts, ts + dur, depth, dict(e.get("args") or {})))
    unclosed = sum(len(s) for s in stacks.values())
    spans.sort(key=lambda s: (s.start, s.depth))
    steps.sort(key=lambda x: x[0])
    return Timeline(processes, spans, ticks, cycles, unclosed, meta, first, last, internal, steps)


def without_internal(tl: Timeline) -> Timeline:
    """``tl`` without the rows of internal ops (spans, ticks and process names)."""
    if not tl.internal:
        return tl
    hide = tl.internal
    return Timeline({p: n for p, n in tl.processes.items() if p not in hide},
                    [s for s in tl.spans if s.pid not in hide],
                    [t for t in tl.ticks if t[0] not in hide],
                    tl.cycles, tl.unclosed, tl.meta, tl.first_ts, tl.last_ts, set(), tl.steps)


def _is_op(span: Span) -> bool:
    return span.depth == 0 and not span.name.startswith("NEGOTIATE_")


def _negotiations(tl: Timeline) -> List[Dict[int, float]]:
    """Every negotiation as ``{rank: ready ts}``; spans of one tensor are matched across tids by
    their order (k-th negotiation of a tensor on rank r belongs with the k-th on rank s)."""
    by_key: Dict[Tuple[int, int], List[Span]] = defaultdict(list)
    for s in tl.spans:
        if s.name.startswith("NEGOTIATE_"):
            by_key[(s.pid, s.tid)].append(s)
    ticks_by_key: Dict[Tuple[int, int], List[Tuple[float, int]]] = defaultdict(list)
    for pid, tid, rank, ts in tl.ticks:
        ticks_by_key[(pid, tid)].append((ts, rank))
    instances: Dict[Tuple[int, int], Dict[int, float]] = defaultdict(dict)
    for key, negs in by_key.items():
        negs.sort(key=lambda s: s.start)
        starts = [s.start for s in negs]
        for ts, rank in sorted(ticks_by_key.get(key, ())):
            # the latest negotiation that started at or before the tick
            lo, hi = 0, len(starts)
            while lo < hi:
                mid = (lo + hi) // 2
                if starts[mid] <= ts:
                    lo = mid + 1
                else:
                    hi = mid
            k = lo - 1
            if k >= 0:
                instances[(key[0], k)].setdefault(rank, ts)
    return [v for _, v in sorted(instances.items())]


def summarize(events: Iterable[Dict[str, Any]], internal: bool = False) -> Dict[str, Any]:
    """Per-op, per-activity and per-tensor times (µs) and the negotiation wait per rank.

    ``internal``: also count horovod-compat's internal bookkeeping ops (left out by default;
    ``internal_hidden`` says how many rows were)."""
    full = parse(events)
    tl = full if internal else without_internal(full)
    ops: Dict[str, List[float]] = defaultdict(list)
    op_intervals: Dict[str, List[Tuple[float, float]]] = defaultdict(list)
    acts: Dict[str, List[float]] = defaultdict(list)
    tensors: Dict[str, List[float]] = defaultdict(list)
    neg_spans: Dict[int, List[float]] = defaultdict(list)   # tid -> negotiation durations
    for s in tl.spans:
        if s.name.startswith("NEGOTIATE_"):
            neg_spans[s.tid].append(s.dur)
        elif _is_op(s):
            ops[s.name].append(s.dur)
            op_intervals[s.name].append((s.start, s.end))
            tensors[tl.processes.get(s.pid, f"pid {s.pid}")].append(s.dur)
        else:
            acts[s.name].append(s.dur)

    def stats(d: Dict[str, List[float]]) -> Dict[str, Dict[str, float]]:
        return {k: {"count": len(v), "total_us": sum(v), "mean_us": sum(v) / len(v)}
                for k, v in sorted(d.items(), key=lambda kv: -sum(kv[1]))}

    op_stats = stats(ops)
    for k, v in op_stats.items():
        v["wall_us"] = _union(op_intervals[k])
    negs = _negotiations(tl)
    ranks = sorted({r for inst in negs for r in inst})
    per_rank: Dict[int, Dict[str, float]] = {r: {"negotiations": 0, "waited_us": 0.0, "last": 0,
                                                  "caused_us": 0.0} for r in ranks}
    multi = [inst for inst in negs if len(inst) > 1]
    for inst in multi:
        last_rank = max(inst, key=lambda r: (inst[r], r))
        t_last = inst[last_rank]
        caused = 0.0
        for r, t in inst.items():
            per_rank[r]["negotiations"] += 1
            per_rank[r]["waited_us"] += t_last - t
            caused += t_last - t
        per_rank[last_rank]["last"] += 1
        per_rank[last_rank]["caused_us"] += caused
    single_rank = not multi
    if single_rank:
        # only one rank's ticks: report how long it waited in negotiation (span length)
        for tid, durs in neg_spans.items():
            r = ranks[0] if len(ranks) == 1 else tid
            per_rank[r] = {"negotiations": len(durs), "waited_us": sum(durs), "last": 0,
                           "caused_us": 0.0}
    hc = tl.meta.get("horovod_compat") if isinstance(tl.meta.get("horovod_compat"), dict) else {}
    return {
        "events": len(tl.spans) + len(tl.ticks) + len(tl.cycles),
        "duration_us": tl.last_ts - tl.first_ts,
        "cycles": len(tl.cycles),
        "unclosed_spans": tl.unclosed,
        "tensors_count": len(tl.processes),
        "internal_hidden": len(full.internal) - len(tl.internal),
        "steps": max(Counter(tid for _ts, tid, _a in tl.steps).values(), default=0),
        "ops": op_stats,
        "activities": stats(acts),
        "tensors": stats(tensors),
        "negotiation": {"per_rank": per_rank, "instances": len(negs),
                        "multi_rank_instances": len(multi), "single_rank_only": single_rank},
        "size": hc.get("size"),
        "truncated": tl.meta.get("timeline_truncated"),
    }


def _union(intervals: List[Tuple[float, float]]) -> float:
    """Length of the union of intervals: time during which at least one of them was open."""
    total, cur_s, cur_e = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _ms(us: float) -> str:
    return f"{us / 1000.0:10.3f}"


def format_summary(summary: Dict[str, Any], top: int = 10, title: str = "") -> str:
    """The summary as a plain-text report."""
    lines: List[str] = []
    if title:
        lines.append(f"timeline {title}")
    lines.append(f"{summary['tensors_count']} tensors, {summary['events']} events over "
                 f"{summary['duration_us'] / 1e6:.3f} s, {summary['cycles']} cycles marked"
                 + (f", {summary['unclosed_spans']} spans never closed (crash?)"
                    if summary["unclosed_spans"] else "")
                 + (f", {summary['steps']} training steps" if summary.get("steps") else "")
                 + (f"; TRUNCATED ({summary['truncated'].get('reason')})" if summary.get("truncated") else ""))
    if summary.get("internal_hidden"):
        lines.append(f"({summary['internal_hidden']} rows of horovod-compat's internal bookkeeping ops "
                     f"left out; --internal counts them)")

    def table(head: str, rows: Dict[str, Dict[str, float]], limit: Optional[int] = None) -> None:
        lines.append("")
        lines.append(f"{head:<40} {'count':>7} {'total ms':>10} {'mean ms':>10}")
        for i, (k, v) in enumerate(rows.items()):
            if limit is not None and i >= limit:
                lines.append(f"  ... {len(rows) - limit} more")
                break
            lines.append(f"{k[:40]:<40} {v['count']:>7} {_ms(v['total_us'])} {_ms(v['mean_us'])}")

    table("op", summary["ops"])
    lines.append("(total sums every tensor's op; ops in flight together overlap.)  Wall time with at "
                 "least one in flight: " + ", ".join(
        f"{k} {v['wall_us'] / 1000.0:.3f} ms" for k, v in summary["ops"].items()))
    table("activity", summary["activities"])
    table(f"tensor (top {top} by total time)", summary["tensors"], top)
    neg = summary["negotiation"]
    lines.append("")
    if neg["single_rank_only"]:
        lines.append("negotiation (ticks from one rank only: time it waited for the others)")
        lines.append(f"{'rank':<6} {'negotiations':>12} {'waited ms':>10}")
        for r, v in sorted(neg["per_rank"].items()):
            lines.append(f"{r:<6} {int(v['negotiations']):>12} {_ms(v['waited_us'])}")
    else:
        lines.append("negotiation wait per rank (from per-rank ready ticks; the last rank to be ready "
                     "makes the others wait)")
        lines.append(f"{'rank':<6} {'negotiations':>12} {'waited ms':>10} {'was last':>9} "
                     f"{'made others wait ms':>20}")
        for r, v in sorted(neg["per_rank"].items()):
            lines.append(f"{r:<6} {int(v['negotiations']):>12} {_ms(v['waited_us'])} {int(v['last']):>9} "
                         f"{v['caused_us'] / 1000.0:>20.3f}")
        worst = max(neg["per_rank"].items(), key=lambda kv: kv[1]["caused_us"], default=None)
        if worst is not None and worst[1]["caused_us"] > 0:
            lines.append(f"-> rank {worst[0]} made the others wait most "
                         f"({worst[1]['caused_us'] / 1000.0:.3f} ms in {int(worst[1]['last'])} negotiations)")
    return "\n".join(lines)
