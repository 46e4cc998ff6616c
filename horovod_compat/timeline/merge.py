"""Merging per-rank timelines (``HOROVOD_TIMELINE=/path/tl.{rank}.json``) onto one time axis.

Each of our files records, in the ``pid 0`` metadata, ``start_time_since_epoch_in_micros`` (the
wall clock at the file's time origin) and ``horovod_compat.rank``.  Merging shifts every file by its
origin minus the earliest origin, keeps ONE pid per tensor name (so a tensor's row shows every rank)
and puts each rank on its own thread (``tid`` = rank, named ``rank N``).  Every rank's own readiness
tick then sits in its ``NEGOTIATE_<OP>`` span, so ``summarize`` can tell who made the others wait.
Wall clocks of different hosts are only as aligned as NTP keeps them; on one host they are exact.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .reader import load_events

__all__ = ["merge_files", "file_origin"]


def file_origin(events: Sequence[Dict[str, Any]]) -> Tuple[Optional[int], Optional[int]]:
    """``(start_time_since_epoch_in_micros, rank)`` from a file's pid-0 metadata (None if absent)."""
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name" and int(e.get("pid", -1)) == 0:
            args = e.get("args") or {}
            hc = args.get("horovod_compat") if isinstance(args.get("horovod_compat"), dict) else {}
            start = args.get("start_time_since_epoch_in_micros")
            return (int(start) if start is not None else None,
                    int(hc["rank"]) if "rank" in hc else None)
    return None, None


def merge_files(paths: Sequence[str], out_path: str) -> Dict[str, Any]:
    """Write the merged timeline of ``paths`` to ``out_path``; returns what was merged."""
    loaded = []
    for i, p in enumerate(paths):
        ev = load_events(p)
        start, rank = file_origin(ev)
        loaded.append((p, ev, start, rank if rank is not None else i))
    ranks = [r for _, _, _, r in loaded]
    if len(set(ranks)) != len(ranks):   # e.g. two rank-0 files: fall back to argument order
        loaded = [(p, ev, s, i) for i, (p, ev, s, _) in enumerate(loaded)]
    starts = [s for _, _, s, _ in loaded if s is not None]
    origin = min(starts) if starts else 0
    pid_of: Dict[str, int] = {}
    out: List[str] = []
    offsets: Dict[int, int] = {}
    for path, events, start, rank in loaded:
        shift = (start - origin) if start is not None else 0
        offsets[rank] = shift
        local_names: Dict[int, str] = {}
        local_labels: Dict[int, Any] = {}
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                pid = int(e.get("pid", 0))
                name = (e.get("args") or {}).get("name")
                if pid != 0 and name is not None:
                    local_names[pid] = str(name)
            elif e.get("ph") == "M" and e.get("name") == "process_labels":
                local_labels[int(e.get("pid", 0))] = (e.get("args") or {}).get("labels")
        seen_threads = set()
        for e in events:
            ph = e.get("ph")
            if ph == "M":
                continue
            e = dict(e)
            pid = int(e.get("pid", 0))
            if pid:
                name = local_names.get(pid, f"{os.path.basename(path)}:pid{pid}")
                new = pid_of.get(name)
                if new is None:
                    new = pid_of[name] = len(pid_of) + 1
                    out.append(json.dumps({"name": "process_name", "ph": "M", "pid": new,
                                           "args": {"name": name}}))
                    out.append(json.dumps({"name": "process_sort_index", "ph": "M", "pid": new,
                                           "args": {"sort_index": new}}))
                    if local_labels.get(pid):   # e.g. an internal op's row (writer.INTERNAL_LABEL)
                        out.append(json.dumps({"name": "process_labels", "ph": "M", "pid": new,
                                               "args": {"labels": local_labels[pid]}}))
                e["pid"] = new
                if (new, rank) not in seen_threads:
                    seen_threads.add((new, rank))
                    out.append(json.dumps({"name": "thread_name", "ph": "M", "pid": new, "tid": rank,
                                           "args": {"name": f"rank {rank}"}}))
                e["tid"] = rank
            if "ts" in e:
                e["ts"] = int(e["ts"]) + shift
            if ph == "i" and pid == 0:
                e["tid"] = rank
                e["s"] = "p"          # a rank's cycle marks stay on that rank (pid 0 row)
            out.append(json.dumps(e))
    head = [
        json.dumps({"name": "process_name", "ph": "M", "pid": 0,
                    "args": {"start_time_since_epoch_in_micros": origin,
                             "horovod_compat": {"merged": [p for p, _, _, _ in loaded],
                                                "ranks": [r for _, _, _, r in loaded],
                                                "offsets_us": {str(k): v for k, v in offsets.items()}}}}),
        json.dumps({"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}),
    ]
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(head + out) + "\n]\n")
    os.replace(tmp, out_path)
    return {"files": len(loaded), "ranks": [r for _, _, _, r in loaded], "tensors": len(pid_of),
            "events": len(out), "offsets_us": offsets}
