"""A per-tensor Gantt chart of a Horovod timeline (matplotlib, PNG/SVG/PDF by file extension).

One row per tensor, named as Horovod names it (``allreduce.fc1.weight``: the op, then the tensor's
name -- for ``DistributedOptimizer`` and ``broadcast_parameters`` the parameter's name), one row per
tensor and rank for merged per-rank files.  In each row: negotiation in light grey, the op in its
colour, the backend transfer (``GLOO_ALLREDUCE``, ``SHM_ALLREDUCE``...) and fusion-buffer copies as
narrower bars inside it, each rank's readiness tick as a black ``|``.

**What is shown by default: the steady state** (``view_window``).  Start-up -- ``hvd.init``, the
first negotiation that waits for every rank to arrive, ``broadcast_parameters``, the first
training step with its one-off checks -- can last longer than many training steps and would squeeze
them into a sliver.  The window is therefore, in this order of preference:

1. the file has at least two ``STEP`` marks (written by ``DistributedOptimizer``, see
   ``writer``): from the first mark -- the end of training step 1 -- to the end of the timeline;
2. otherwise, some tensor row has at least two ops (a training loop repeats its collectives): from
   the start of the earliest *second occurrence* of any tensor (its ``NEGOTIATE_<OP>`` span, or
   the op itself when it has none) to the end of the timeline;
3. otherwise (nothing repeats): the whole timeline.

``--all`` (``view_window(..., everything=True)``) shows the whole timeline, ``--from MS`` /
``--to MS`` an explicit window, ``--steps A:B`` training steps A to B (with ``STEP`` marks).
Times on the x axis are milliseconds since the file's time origin (``hvd.init``; Horovod's files
count from its init too), the same numbers ``--from``/``--to`` take.

**Step boundaries**: a dashed vertical line at every ``STEP`` mark (the end of a
``DistributedOptimizer`` step: every gradient reduced) with the steps shaded alternately and
numbered on top; files without ``STEP`` marks but with Horovod's ``CYCLE_START`` marks
(``HOROVOD_TIMELINE_MARK_CYCLES=1``) get a thin dotted line per cycle instead.

Rows of horovod-compat's internal bookkeeping ops (``writer.INTERNAL_LABEL``) are hidden unless
``internal=True``.  Rows are ordered by their first activity in the window (for the optimizer:
the order in which backward produced the gradients), then by name; ``top`` keeps the rows that
cost most op time in the window.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

from distributor.extras import MissingExtraError, require

from .reader import Span, Timeline, parse, without_internal

__all__ = ["plot_gantt", "view_window", "Window", "PlotUnavailable", "PLOTTING",
           "require_matplotlib"]

#: what needs matplotlib, in the error that names the extra (``distributor.extras``)
PLOTTING = "plotting"

_OP_COLORS = {"ALLREDUCE": "#1f77b4", "ALLGATHER": "#2ca02c", "BROADCAST": "#ff7f0e",
              "ALLTOALL": "#9467bd", "REDUCESCATTER": "#8c564b", "BARRIER": "#7f7f7f",
              "JOIN": "#7f7f7f"}
_NEGOTIATE = "#cfcfcf"
_TRANSFER = "#1a1a1a"
_COPY = "#d62728"


PlotUnavailable = MissingExtraError  # matplotlib is not installed (the message says how to install it)


def require_matplotlib() -> None:
    """Raise ``PlotUnavailable`` (one line naming the install command) without matplotlib."""
    require("plot", PLOTTING)


class Window(NamedTuple):
    """The x range to draw, in the file's µs (``ts``), and which rule chose it."""

    start_us: float
    end_us: float
    rule: str      # "steps", "repeated", "whole" (nothing repeats), "all", "range"
    detail: str    # human-readable: what the window starts at

    @property
    def start_ms(self) -> float:
        return self.start_us / 1000.0

    @property
    def end_ms(self) -> float:
        return self.end_us / 1000.0


def _is_op(s: Span) -> bool:
    return s.depth == 0 and not s.name.startswith("NEGOTIATE_")


def _step_marks(tl: Timeline) -> List[Tuple[float, Dict[str, Any]]]:
    """The ``STEP`` marks of one rank (the lowest tid) and one optimizer (the lowest id)."""
    if not tl.steps:
        return []
    tid = min(t for _ts, t, _a in tl.steps)
    mine = [(ts, a) for ts, t, a in tl.steps if t == tid]
    opts = [a.get("optimizer") for _ts, a in mine if isinstance(a.get("optimizer"), int)]
    if opts:
        first = min(opts)
        mine = [(ts, a) for ts, a in mine if a.get("optimizer", first) == first]
    return mine


def _cycle_marks(tl: Timeline) -> List[float]:
    return sorted(set(tl.cycles))


def _occurrence_starts(spans: List[Span]) -> List[float]:
    """Per op of one row (spans sorted by start): when it began, its negotiation included."""
    out: List[float] = []
    neg: Optional[float] = None
    for s in spans:
        if s.depth != 0:
            continue
        if s.name.startswith("NEGOTIATE_"):
            if neg is None:
                neg = s.start
        else:
            out.append(s.start if neg is None else min(neg, s.start))
            neg = None
    return out


def _extent(tl: Timeline) -> Tuple[float, float]:
    """First and last moment of the drawn rows and the step/cycle marks."""
    marks = [ts for ts, _a in _step_marks(tl)] + _cycle_marks(tl)
    xs = [s.start for s in tl.spans] + [t[3] for t in tl.ticks] + marks
    ys = [s.end for s in tl.spans] + [t[3] for t in tl.ticks] + marks
    if not xs:
        xs = ys = [tl.first_ts, tl.last_ts]
    return min(xs), max(ys)


def view_window(events: Union[Iterable[Dict[str, Any]], Timeline], *, everything: bool = False,
                from_ms: Optional[float] = None, to_ms: Optional[float] = None,
                steps: Optional[Tuple[Optional[int], Optional[int]]] = None,
                internal: bool = False) -> Window:
    """The time range the plot shows (see the module docstring for the rules).

    Pure: ``events`` (a list of trace events, or a parsed ``Timeline``) in, a ``Window`` out.
    ``everything``: the whole timeline.  ``from_ms``/``to_ms``: an explicit window in ms since the
    time origin (a missing side is the timeline's edge).  ``steps=(first, last)``: training steps
    ``first`` to ``last`` (1-based, inclusive, None: open end), from the end of step ``first - 1``
    to the end of step ``last``; needs ``STEP`` marks.  ``internal``: internal ops' rows count
    (they are otherwise ignored, as they are not drawn).  Raises ``ValueError`` for an empty window
    or ``steps`` without marks.
    """
    tl = events if isinstance(events, Timeline) else parse(events)
    if not internal:
        tl = without_internal(tl)
    lo, hi = _extent(tl)
    if steps is not None:
        marks = _step_marks(tl)
        if not marks:
            raise ValueError("no STEP marks in this timeline (they come from hvd.DistributedOptimizer): "
                             "pick the window with --from/--to instead")
        ends = {int(a.get("step", i + 1)): ts for i, (ts, a) in enumerate(marks)}
        first, last = steps
        first = first or 1
        a = ends.get(first - 1, lo) if first > 1 else lo
        b = ends.get(last, hi) if last is not None else hi
        if first > 1 and first - 1 not in ends:
            raise ValueError(f"no step {first}: the timeline marks steps {min(ends)}-{max(ends)}")
        if b <= a:
            raise ValueError(f"empty window: steps {first}-{last}")
        return Window(a, b, "range", f"steps {first}-{last if last is not None else max(ends)}")
    if from_ms is not None or to_ms is not None:
        a = lo if from_ms is None else from_ms * 1000.0
        b = hi if to_ms is None else to_ms * 1000.0
        if b <= a:
            raise ValueError(f"empty window: --from {a / 1000.0:g} ms is not before --to {b / 1000.0:g} ms")
        return Window(a, b, "range", f"{a / 1000.0:g}-{b / 1000.0:g} ms as asked")
    if everything:
        return Window(lo, hi, "all", "the whole timeline")
    marks = _step_marks(tl)
    if len(marks) >= 2 and marks[0][0] < hi:
        n = marks[0][1].get("step", 1)
        return Window(marks[0][0], hi, "steps", f"the end of training step {n}")
    rows: Dict[Tuple[int, int], List[Span]] = defaultdict(list)
    for s in tl.spans:
        rows[(s.pid, s.tid)].append(s)
    second: List[Tuple[float, str]] = []
    for (pid, _tid), spans in rows.items():
        occ = _occurrence_starts(spans)
        if len(occ) >= 2:
            second.append((occ[1], tl.processes.get(pid, f"pid {pid}")))
    if second:
        start, name = min(second)
        if lo < start < hi:
            return Window(start, hi, "repeated", f"the 2nd op of {name}")
    return Window(lo, hi, "whole", "the whole timeline (no op repeats)")


def _short(name: str, limit: int = 50) -> str:
    if len(name) <= limit:
        return name
    keep = limit - 1
    return name[:keep // 2] + "\u2026" + name[-(keep - keep // 2):]


def plot_gantt(events: Iterable[Dict[str, Any]], out_path: str, top: int = 30,
               title: Optional[str] = None, *, everything: bool = False,
               from_ms: Optional[float] = None, to_ms: Optional[float] = None,
               steps: Optional[Tuple[Optional[int], Optional[int]]] = None,
               internal: bool = False, source: Optional[str] = None) -> Dict[str, Any]:
    """Draw the chart into ``out_path`` (format from its extension).

    Returns ``{"rows": [...row labels, top to bottom...], "spans": n, "window": Window,
    "steps": k, "internal_hidden": m}``.  Raises ``PlotUnavailable`` without matplotlib.
    """
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory

    full: Timeline = parse(events)
    tl = full if internal else without_internal(full)
    win = view_window(tl, everything=everything, from_ms=from_ms, to_ms=to_ms, steps=steps,
                      internal=True)
    w0, w1 = win.start_us, win.end_us

    def inside(s: Span) -> bool:
        return s.end >= w0 and s.start <= w1

    tids_per_pid: Dict[int, set] = defaultdict(set)
    total: Dict[Tuple[int, int], float] = defaultdict(float)
    first_seen: Dict[Tuple[int, int], float] = {}
    for s in tl.spans:
        key = (s.pid, s.tid)
        tids_per_pid[s.pid].add(s.tid)
        if not inside(s):
            continue
        if _is_op(s):
            total[key] += min(s.end, w1) - max(s.start, w0)
        else:
            total.setdefault(key, 0.0)
        first_seen[key] = min(first_seen.get(key, s.start), max(s.start, w0))
    names = {k: tl.processes.get(k[0], f"pid {k[0]}") for k in total}
    keys = sorted(total, key=lambda k: (-total[k], names[k], k[1]))[:top]
    # tensors in order of first activity, the ranks of one tensor together
    tensor_first: Dict[int, float] = {}
    for k in keys:
        tensor_first[k[0]] = min(tensor_first.get(k[0], first_seen[k]), first_seen[k])
    keys.sort(key=lambda k: (tensor_first[k[0]], names[k], k[1]))
    row = {k: i for i, k in enumerate(keys)}

    def label(k: Tuple[int, int]) -> str:
        name = _short(names[k])
        if k[0] in full.internal:
            name += " (internal)"
        return f"{name} [rank {k[1]}]" if len(tids_per_pid[k[0]]) > 1 else name

    labels = [label(k) for k in keys]
    bars: Dict[Tuple[str, str], Dict[int, List[Tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    n_spans = 0
    for s in tl.spans:
        k = (s.pid, s.tid)
        if k not in row or not inside(s):
            continue
        n_spans += 1
        x, w = s.start / 1000.0, max(s.dur / 1000.0, 1e-4)
        if s.name.startswith("NEGOTIATE_"):
            bars[("negotiation (waiting for every rank)", _NEGOTIATE)][row[k]].append((x, w))
        elif s.depth == 0:
            bars[(s.name.lower(), _OP_COLORS.get(s.name, "#17becf"))][row[k]].append((x, w))
        elif s.name.startswith("MEMCPY") or s.name.startswith("INIT_FUSION"):
            bars[("fusion-buffer copy", _COPY)][row[k]].append((x, w))
        else:
            bars[("backend transfer (gloo/nccl/shm)", _TRANSFER)][row[k]].append((x, w))

    nrows = max(len(keys), 1)
    label_len = max((len(lab) for lab in labels), default=10)
    fig_w = 14.0
    fig_h = max(3.6, 0.36 * nrows + 2.4)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    x0, x1 = w0 / 1000.0, w1 / 1000.0
    pad = (x1 - x0) * 0.01 or 0.05
    ax.set_xlim(x0 - pad, x1 + pad)

    # step boundaries: shading, lines, numbers
    legend_extra: List[Any] = []
    marks = [(ts / 1000.0, a) for ts, a in _step_marks(tl)]
    shown_marks = [(x, a) for x, a in marks if x0 - pad <= x <= x1 + pad]
    top_tf = blended_transform_factory(ax.transData, ax.transAxes)
    if shown_marks:
        xs = [x for x, _a in marks]
        bounds = [x0 - pad] + [x for x in xs if x0 - pad < x < x1 + pad] + [x1 + pad]
        # band i runs from bound i to bound i+1; the step it shows is the one that ENDS at its right
        # edge (a STEP mark is the end of a step)
        after = {x: a.get("step") for x, a in marks}
        widths = [b - a for a, b in zip(bounds, bounds[1:])]
        typical = sorted(widths)[len(widths) // 2] if widths else 1.0
        stride = max(1, math.ceil(0.035 * (x1 - x0 + 2 * pad) / max(typical, 1e-9)))
        # marks closer than ~5 px: thin faint lines, no shading (--steps or --from/--to zoom in)
        dense = typical < 0.004 * (x1 - x0 + 2 * pad)
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            if i % 2 == 1 and not dense:
                ax.axvspan(a, b, color="#f3f3f3", zorder=0, linewidth=0)
            prev = after.get(a)
            step_no = (prev + 1) if isinstance(prev, int) else None
            if step_no is not None and b < x1 + pad and step_no % stride == 0 and (b - a) > 0:
                ax.text((a + b) / 2, 1.005, str(step_no), transform=top_tf, ha="center", va="bottom",
                        fontsize=8, color="#444444")
        ax.vlines([x for x, _a in shown_marks], 0, 1, transform=top_tf, colors="#555555",
                  linestyles=(0, (4, 3)), linewidth=0.4 if dense else 0.9,
                  alpha=0.45 if dense else 1.0, zorder=1)
        legend_extra.append(Line2D([], [], color="#555555", linestyle=(0, (4, 3)), linewidth=0.9,
                                   label="end of a training step (numbers on top: step)"))
    else:
        cyc = [c / 1000.0 for c in _cycle_marks(tl) if w0 <= c <= w1]
        if cyc:
            ax.vlines(cyc, 0, 1, transform=top_tf, colors="#999999", linestyles=":", linewidth=0.7,
                      zorder=1)
            legend_extra.append(Line2D([], [], color="#999999", linestyle=":", linewidth=0.7,
                                       label="CYCLE_START"))

    legend: List[Any] = []
    order = sorted(bars, key=lambda nc: (nc[1] in (_TRANSFER, _COPY), nc[1] != _NEGOTIATE, nc[0]))
    for name, color in order:
        inner = color in (_TRANSFER, _COPY)
        for r, xs in bars[(name, color)].items():
            y = r - (0.13 if inner else 0.34)
            ax.broken_barh(xs, (y, 0.26 if inner else 0.68), facecolors=color,
                           alpha=0.7 if inner else 0.95, linewidth=0, zorder=2 if not inner else 3)
        legend.append(Patch(facecolor=color, label=name if color != _OP_COLORS.get(name.upper())
                            else f"{name} (the op)"))
    tick_x: List[float] = []
    tick_y: List[float] = []
    for pid, tid, _rank, ts in tl.ticks:
        k = (pid, tid)
        if k in row and w0 <= ts <= w1:
            tick_x.append(ts / 1000.0)
            tick_y.append(row[k])
    if tick_x:
        ax.scatter(tick_x, tick_y, marker="|", s=110, color="black", linewidths=1.1, zorder=5)
        legend.append(Line2D([], [], color="black", marker="|", linestyle="", markersize=9,
                             label="a rank became ready"))
    legend += legend_extra

    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels(labels, fontsize=9 if label_len <= 40 else 8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xlabel("time since hvd.init (the timeline's time origin), ms", fontsize=10)
    ax.tick_params(axis="x", labelsize=9)
    ax.grid(axis="x", alpha=0.25, zorder=0)
    ax.set_axisbelow(True)
    total_rows = len(total)
    hidden = len(full.internal) - len(tl.internal)
    head = title or f"Horovod timeline {os.path.basename(source) if source else ''}".rstrip()
    if win.rule in ("steps", "repeated"):
        what = (f"steady state: {x0:.1f}-{x1:.1f} ms, from {win.detail} "
                f"(start-up before it hidden; --all shows it)")
    elif win.rule == "range":
        what = f"{x0:.1f}-{x1:.1f} ms ({win.detail})"
    else:
        what = f"{x0:.1f}-{x1:.1f} ms, {win.detail}"
    rows_txt = (f"top {len(keys)} of {total_rows} rows by op time" if total_rows > len(keys)
                else f"{len(keys)} row" + ("" if len(keys) == 1 else "s"))
    extra = f"; {hidden} internal rows hidden (--internal)" if hidden else ""
    ax.set_title(f"{head}\n{what}; {rows_txt}{extra}", fontsize=10.5,
                 pad=16 if shown_marks else 8)
    if legend:
        ncol = min(len(legend), 4)
        fig.legend(handles=legend, loc="lower center", ncol=ncol, fontsize=9, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
    if not keys:
        ax.text(0.5, 0.5, "no ops in this window", transform=ax.transAxes, ha="center", va="center")
    legend_rows = math.ceil(len(legend) / 4) if legend else 0
    fig.tight_layout(rect=(0, 0.035 * legend_rows * 4.0 / fig_h + 0.01, 1, 1))
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return {"rows": labels, "spans": n_spans, "window": win,
            "steps": len(shown_marks), "internal_hidden": hidden}
