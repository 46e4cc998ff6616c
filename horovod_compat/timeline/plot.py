"""A per-tensor Gantt chart of a Horovod timeline (matplotlib, PNG/SVG/PDF by file extension).

One row per tensor (per tensor and rank for merged per-rank files), the tensors that cost most on
top: negotiation in light grey, the op in its colour, the backend activity (``GLOO_ALLREDUCE``...)
and fusion-buffer copies as narrower bars inside it, readiness ticks as black marks.  Readable at a
glance for the question "where did the time go, and who was waiting".
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .reader import Timeline, parse

__all__ = ["plot_gantt"]

_OP_COLORS = {"ALLREDUCE": "#1f77b4", "ALLGATHER": "#2ca02c", "BROADCAST": "#ff7f0e",
              "ALLTOALL": "#9467bd", "REDUCESCATTER": "#8c564b", "BARRIER": "#7f7f7f",
              "JOIN": "#7f7f7f"}


def plot_gantt(events: Iterable[Dict[str, Any]], out_path: str, top: int = 30,
               title: Optional[str] = None) -> Dict[str, Any]:
    """Draw the chart into ``out_path``; returns ``{"rows": [...labels...], "spans": n}``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl: Timeline = parse(events)
    t0 = tl.first_ts
    tids_per_pid: Dict[int, set] = defaultdict(set)
    total: Dict[Tuple[int, int], float] = defaultdict(float)
    first_seen: Dict[Tuple[int, int], float] = {}
    for s in tl.spans:
        key = (s.pid, s.tid)
        tids_per_pid[s.pid].add(s.tid)
        total[key] += s.dur if s.depth == 0 else 0.0
        first_seen.setdefault(key, s.start)
    keys = sorted(total, key=lambda k: -total[k])[:top]
    keys.sort(key=lambda k: (first_seen[k], k))
    row = {k: i for i, k in enumerate(keys)}

    def label(k: Tuple[int, int]) -> str:
        name = tl.processes.get(k[0], f"pid {k[0]}")
        if len(name) > 38:
            name = name[:17] + "..." + name[-18:]
        return f"{name} [rank {k[1]}]" if len(tids_per_pid[k[0]]) > 1 else name

    bars: Dict[Tuple[str, str], Dict[int, List[Tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for s in tl.spans:
        k = (s.pid, s.tid)
        if k not in row:
            continue
        x, w = (s.start - t0) / 1000.0, max(s.dur / 1000.0, 1e-3)
        if s.name.startswith("NEGOTIATE_"):
            bars[("negotiate", "#d0d0d0")][row[k]].append((x, w))
        elif s.depth == 0:
            bars[(s.name, _OP_COLORS.get(s.name, "#17becf"))][row[k]].append((x, w))
        elif s.name.startswith("MEMCPY") or s.name.startswith("INIT_FUSION"):
            bars[("fusion buffer copy", "#d62728")][row[k]].append((x, w))
        else:
            bars[("backend transfer", "#222222")][row[k]].append((x, w))

    height = max(3.0, 0.32 * len(keys) + 1.6)
    fig, ax = plt.subplots(figsize=(13, height))
    legend = []
    for (name, color), rows in bars.items():
        inner = name in ("backend transfer", "fusion buffer copy")
        for r, xs in rows.items():
            y = r - (0.15 if inner else 0.35)
            ax.broken_barh(xs, (y, 0.3 if inner else 0.7), facecolors=color,
                           alpha=0.55 if inner else 0.9, linewidth=0)
        legend.append(Patch(facecolor=color, label=name.lower() if name.isupper() else name))
    tick_x: List[float] = []
    tick_y: List[float] = []
    for pid, tid, _rank, ts in tl.ticks:
        k = (pid, tid)
        if k in row:
            tick_x.append((ts - t0) / 1000.0)
            tick_y.append(row[k])
    if tick_x:
        ax.scatter(tick_x, tick_y, marker="|", s=120, color="black", linewidths=1.2, zorder=5)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([label(k) for k in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xlabel("time since start of the timeline (ms)")
    ax.grid(axis="x", alpha=0.3)
    shown = f"top {len(keys)} of {len(total)} tensor rows by op time" if len(total) > len(keys) else \
        f"{len(keys)} tensor rows"
    ax.set_title(title or f"Horovod timeline: {shown}; | = rank ready tick", fontsize=10)
    if legend:
        ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(keys) > 6 else -0.25),
                  ncol=min(len(legend), 6), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return {"rows": [label(k) for k in keys], "spans": sum(len(v) for d in bars.values() for v in d.values())}
