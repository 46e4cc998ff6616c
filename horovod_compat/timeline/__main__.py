"""``python -m horovod_compat.timeline``: read Horovod timelines.

    summarize FILE [--top N] [--json] [--plot OUT.png]   per-op counts/times, negotiation wait per rank
    plot FILE -o OUT.png [--top N]                        per-tensor Gantt chart
    merge A B ... -o OUT                                  per-rank files onto one time axis

Works on Horovod 0.28.1's own files and on files cut short by a crash.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from .merge import merge_files
from .reader import format_summary, load_events, summarize


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m horovod_compat.timeline",
                                 description="Summarize, plot and merge Horovod timelines.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize", help="per-op times and negotiation wait per rank")
    s.add_argument("file")
    s.add_argument("--top", type=int, default=10, help="tensors to list (default 10)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.add_argument("--plot", metavar="OUT", help="also draw the Gantt chart into OUT (png/svg/pdf)")
    p = sub.add_parser("plot", help="per-tensor Gantt chart")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--top", type=int, default=30, help="tensor rows to draw (default 30)")
    m = sub.add_parser("merge", help="merge per-rank timelines onto one time axis")
    m.add_argument("files", nargs="+")
    m.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)

    try:
        if args.cmd == "merge":
            info = merge_files(args.files, args.output)
            print(f"merged {info['files']} files (ranks {info['ranks']}, {info['tensors']} tensors, "
                  f"{info['events']} events) into {args.output}; offsets (us): {info['offsets_us']}")
            return 0
        events = load_events(args.file)
        if not events:
            print(f"{args.file}: no timeline events", file=sys.stderr)
            return 1
        if args.cmd == "plot":
            from .plot import plot_gantt
            info = plot_gantt(events, args.output, top=args.top)
            print(f"wrote {args.output} ({len(info['rows'])} rows, {info['spans']} spans)")
            return 0
        summary = summarize(events)
        if args.json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            print(format_summary(summary, top=args.top, title=args.file))
        if args.plot:
            from .plot import plot_gantt
            info = plot_gantt(events, args.plot, top=max(args.top, 30))
            print(f"\nwrote {args.plot} ({len(info['rows'])} rows, {info['spans']} spans)")
        return 0
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
