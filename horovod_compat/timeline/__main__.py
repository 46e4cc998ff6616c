"""``python -m horovod_compat.timeline``: read Horovod timelines.

    summarize FILE [--top N] [--json] [--internal] [--plot OUT.png]
    plot FILE [-o OUT.png] [--top N] [--all | --from MS --to MS | --steps A:B] [--internal]
    merge A B ... -o OUT

Works on Horovod 0.28.1's own files, on ours, and on files cut short by a crash.  ``--help`` on
each subcommand explains every argument; ``horovod_compat.timeline.plot`` documents what the
plot's default view (the steady state) is.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Tuple

from .merge import merge_files
from .reader import format_summary, load_events, summarize

_FILE_HELP = ("the timeline JSON file: what HOROVOD_TIMELINE=FILE or hvd.start_timeline(FILE) wrote "
              "(Horovod's or horovod-compat's; a file cut short by a crash is read up to its last "
              "complete event), or the output of 'merge'")
_INTERNAL_HELP = ("also show horovod-compat's internal bookkeeping ops (e.g. the DistributedOptimizer's "
                  "agreement check and bucket-order exchange, broadcast_parameters' fused buffer); "
                  "they are marked in the file and hidden by default")

_PLOT_DESCRIPTION = """\
Draw a per-tensor Gantt chart: one row per tensor as Horovod names it (allreduce.fc1.weight),
negotiation in grey, the op in colour, the backend transfer and fusion-buffer copies inside it,
each rank's readiness as a black |, training-step boundaries as dashed lines.

By default only the STEADY STATE is drawn, without the start-up (init, the first negotiation
waiting for every rank, broadcast_parameters, the first training step):
  1. with two or more STEP marks (written by hvd.DistributedOptimizer at the end of each step):
     from the first mark, i.e. the end of training step 1, to the end;
  2. else, if some tensor has two or more ops: from the start of the earliest 2nd op of a tensor
     (its negotiation included) to the end;
  3. else the whole timeline.
--all draws everything; --from/--to pick a window in ms (the x axis' unit: ms since hvd.init);
--steps A:B picks training steps."""

_PLOT_EPILOG = """\
examples:
  HOROVOD_TIMELINE=/tmp/tl.json horovodrun -np 2 python train.py
  python -m horovod_compat.timeline plot /tmp/tl.json                 # -> /tmp/tl.png
  python -m horovod_compat.timeline plot /tmp/tl.json -o tl.svg --all
  python -m horovod_compat.timeline plot /tmp/tl.json --from 150 --to 180 --internal
  python -m horovod_compat.timeline plot /tmp/tl.json --steps 5:8

exit status: 0 written; 1 no events in FILE or matplotlib missing
(pip install 'horovod-compat[plot]'); 2 bad arguments or FILE unreadable."""

_SUMMARIZE_EPILOG = """\
examples:
  python -m horovod_compat.timeline summarize /tmp/tl.json
  python -m horovod_compat.timeline summarize /tmp/tl.json --top 20 --plot /tmp/tl.png
  python -m horovod_compat.timeline summarize /tmp/tl.json --json > summary.json"""

_MERGE_EPILOG = """\
example:
  HOROVOD_TIMELINE='/tmp/tl.{rank}.json' horovodrun -np 2 python train.py
  python -m horovod_compat.timeline merge /tmp/tl.0.json /tmp/tl.1.json -o /tmp/tl.json"""


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(
        prog="python -m horovod_compat.timeline", formatter_class=fmt,
        description="Summarize, plot and merge Horovod timelines (HOROVOD_TIMELINE files).",
        epilog="'python -m horovod_compat.timeline COMMAND --help' explains each command.\n\n"
               + _PLOT_EPILOG.split("\n\nexit")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("summarize", formatter_class=fmt, epilog=_SUMMARIZE_EPILOG,
                       help="per-op and per-tensor times, negotiation wait per rank",
                       description="Print per-op and per-activity counts and times, the tensors that\n"
                                   "cost most, and how long each rank waited for the others in\n"
                                   "negotiation (and which rank made them wait).  horovod-compat's\n"
                                   "internal bookkeeping ops are left out unless --internal.")
    s.add_argument("file", metavar="FILE", help=_FILE_HELP)
    s.add_argument("--top", type=int, default=10, metavar="N",
                   help="how many tensors to list, most expensive first (default 10)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    s.add_argument("--internal", action="store_true", help=_INTERNAL_HELP)
    s.add_argument("--plot", metavar="OUT",
                   help="also draw the Gantt chart (as 'plot' does, default view) into OUT; the format "
                        "follows the extension: .png, .svg, .pdf")

    p = sub.add_parser("plot", formatter_class=fmt, description=_PLOT_DESCRIPTION,
                       epilog=_PLOT_EPILOG, help="per-tensor Gantt chart (PNG/SVG/PDF)")
    p.add_argument("file", metavar="FILE", help=_FILE_HELP)
    p.add_argument("-o", "--output", metavar="OUT",
                   help="the image to write; the format follows the extension (.png, .svg, .pdf). "
                        "Default: FILE with its extension replaced by .png")
    p.add_argument("--top", type=int, default=30, metavar="N",
                   help="draw at most N rows, those with the most op time in the window "
                        "(default 30)")
    p.add_argument("--all", action="store_true", dest="everything",
                   help="draw the whole timeline, start-up included")
    p.add_argument("--from", type=float, dest="from_ms", metavar="MS",
                   help="start of the window, in ms since hvd.init (the x axis' unit); "
                        "without --to: up to the end")
    p.add_argument("--to", type=float, dest="to_ms", metavar="MS",
                   help="end of the window, in ms since hvd.init; without --from: from the start")
    p.add_argument("--steps", type=_step_range, metavar="A:B",
                   help="draw training steps A to B (1-based, inclusive; 'A:' or ':B' leave one end "
                        "open), from the end of step A-1 to the end of step B; needs the STEP marks "
                        "hvd.DistributedOptimizer writes")
    p.add_argument("--internal", action="store_true", help=_INTERNAL_HELP)
    p.add_argument("--title", help="the chart's title (default: the file's name)")

    m = sub.add_parser("merge", formatter_class=fmt, epilog=_MERGE_EPILOG,
                       help="merge per-rank timelines onto one time axis",
                       description="Merge per-rank files (HOROVOD_TIMELINE=/path/tl.{rank}.json) into\n"
                                   "one: one row per tensor, one thread per rank, every file shifted\n"
                                   "onto the earliest file's time origin (wall clock).")
    m.add_argument("files", nargs="+", metavar="FILE",
                   help="the per-rank timeline files, any order (the rank is read from each file)")
    m.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the merged timeline JSON to write (required)")
    return ap


def _step_range(text: str) -> Tuple[Optional[int], Optional[int]]:
    """``"2:5"`` -> (2, 5); ``"3"`` -> (3, 3); ``"3:"`` -> (3, None); ``":5"`` -> (None, 5)."""
    a, sep, b = text.partition(":")
    try:
        first = int(a) if a.strip() else None
        last = (int(b) if b.strip() else None) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B with step numbers, got {text!r}") from None
    if (first is not None and first < 1) or (first and last and last < first):
        raise argparse.ArgumentTypeError(f"expected 1 <= A <= B, got {text!r}")
    return first, last


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the process exit code."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.cmd == "plot" and sum((args.everything, args.from_ms is not None or args.to_ms is not None,
                                   args.steps is not None)) > 1:
        ap.error("plot: --all, --from/--to and --steps exclude each other")

    try:
        if args.cmd == "merge":
            info = merge_files(args.files, args.output)
            print(f"merged {info['files']} files (ranks {info['ranks']}, {info['tensors']} tensors, "
                  f"{info['events']} events) into {args.output}; offsets (us): {info['offsets_us']}")
            return 0
        from .plot import PlotUnavailable, plot_gantt, require_matplotlib
        try:
            if args.cmd == "plot" or args.plot:
                require_matplotlib()     # before reading a possibly large file
        except PlotUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        events = load_events(args.file)
        if not events:
            print(f"{args.file}: no timeline events", file=sys.stderr)
            return 1
        if args.cmd == "plot":
            out = args.output or os.path.splitext(args.file)[0] + ".png"
            info = plot_gantt(events, out, top=args.top, title=args.title, everything=args.everything,
                              from_ms=args.from_ms, to_ms=args.to_ms, steps=args.steps,
                              internal=args.internal,
                              source=args.file)
            print(_wrote(out, info))
            return 0
        summary = summarize(events, internal=args.internal)
        if args.json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            print(format_summary(summary, top=args.top, title=args.file))
        if args.plot:
            info = plot_gantt(events, args.plot, top=max(args.top, 30), internal=args.internal,
                              source=args.file)
            print("\n" + _wrote(args.plot, info))
        return 0
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _wrote(out: str, info: dict) -> str:
    win = info["window"]
    text = (f"wrote {out} ({len(info['rows'])} rows, {info['spans']} spans, "
            f"{win.start_ms:.1f}-{win.end_ms:.1f} ms")
    if win.rule in ("steps", "repeated"):
        text += f": steady state from {win.detail}; --all for everything"
    if info.get("internal_hidden"):
        text += f"; {info['internal_hidden']} internal rows hidden"
    return text + ")"


if __name__ == "__main__":
    sys.exit(main())
