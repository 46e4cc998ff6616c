"""Where the suite's CPU goes: every process of a run, its CPU, and the test that started it.

The time table (``--time-table``, tests/timetable.py) counts, per test, the CPU of the worker and
of the children it waited for. It cannot see what outlives its parent: warm fork servers and the
ranks they fork, Spark's JVM and Python workers, processes of simulated hosts. Together those are
most of the run's CPU. This tool sees them all::

    sudo python tests/cpu_profile.py --out cpu.md -- -q -p no:cacheprovider  # after --: test.sh's
    python tests/cpu_profile.py --report --out cpu.md --acct FILE --seen FILE # the report again

It needs root (Linux BSD process accounting, the ``acct(2)`` call; no package): the kernel then
writes one record per exited process (its CPU, start and life time, pid and parent). Beside it a
sampler reads each new process's command line, parent and ``PYTEST_CURRENT_TEST`` (which pytest
sets in the worker, and every process started from it inherits) from ``/proc`` ten times a second.
A process is charged to the test in its own environment, else to its parent's (at birth), and
so on; Spark's Python workers carry the test that started the Spark session, so a shared
session's work is charged to that test's file. Processes shorter than a sample interval that
the sampler missed are charged through their parent's record.

The report: total CPU, CPU per file, per kind of process (a fork server's own imports apart from
the ranks it forks, JVMs, compilers, ...), per file and kind, and, per fork server kind, how many
ranks each server forked. Runs on an idle machine only: everything on the machine is counted.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

ROOT = Path(__file__).resolve().parents[1]
#: struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
#: etime (float, ticks), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16].
_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_TICKS = 100.0  # AHZ: the unit of comp_t times and etime


def _comp_t(value: int) -> float:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return float((value & 0x1FFF) << (3 * ((value >> 13) & 0x7)))


def read_acct(path: str) -> Iterator[dict]:
    """The version-3 records of an accounting file."""
    return read_acct_bytes(Path(path).read_bytes())


def read_acct_bytes(data: bytes) -> Iterator[dict]:
    """The version-3 records of an accounting file's contents."""
    for off in range(0, len(data) - _V3.size + 1, _V3.size):
        (_flag, version, _tty, _code, _uid, _gid, pid, ppid, btime, etime, utime, stime,
         *_rest, comm) = _V3.unpack_from(data, off)
        if version & 0x7F != 3:
            continue
        yield {"pid": pid, "ppid": ppid, "start": float(btime), "life": etime / _TICKS,
               "cpu": (_comp_t(utime) + _comp_t(stime)) / _TICKS,
               "comm": comm.split(b"\0", 1)[0].decode(errors="replace")}


def _set_accounting(path: Optional[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    arg = None if path is None else os.fsencode(path)
    if libc.acct(arg) != 0:
        err = ctypes.get_errno()
        raise SystemExit(f"cpu_profile: acct({path!r}) failed: {os.strerror(err)} (it needs root, "
                         "and a kernel with BSD process accounting)")


def _sample(out: Path, stop: threading.Event) -> None:
    """One JSON line per new process: [pid, ppid, seen_at, cmdline, PYTEST_CURRENT_TEST]."""
    seen: set = set()
    with out.open("w") as sink:
        while not stop.is_set():
            now = time.time()
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    with open(f"/proc/{name}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    key = (name, fields[19])  # pid and start time: pids are reused
                    if key in seen:
                        continue
                    with open(f"/proc/{name}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
                    try:
                        with open(f"/proc/{name}/environ", "rb") as f:
                            env = f.read().split(b"\0")
                    except OSError:
                        env = []
                    test = next((e[20:].decode(errors="replace") for e in env
                                 if e.startswith(b"PYTEST_CURRENT_TEST=")), "")
                except (OSError, IndexError):
                    continue
                seen.add(key)
                sink.write(json.dumps([int(name), int(fields[1]), now, cmd, test]) + "\n")
            sink.flush()
            stop.wait(0.1)


def kind_of(cmd: str, comm: str, parent_cmd: str) -> str:
    """A short name for what a process was."""
    if not cmd:
        return comm
    for server in ("distributor.forkserver_daemon", "distributor.forkserver"):
        if server in cmd:  # a forked rank keeps its server's command line
            return f"{server.split('.')[1]} {'rank' if server in parent_cmd else 'server'}"
    for word, name in (("rank_entry", "rank (new process)"), ("pyspark.daemon", "pyspark worker"),
                       ("horovod_compat.run_rank", "rank (new process, a script's runner)"),
                       ("horovod_compat.run", "horovodrun"),
                       ("exec(eval(sys.stdin", "pytest worker (xdist)"),
                       ("-m pytest", "pytest (in a rank or a job)"), ("java", "java")):
        if word in cmd:
            return name
    return comm if comm != "python" else "python " + (cmd.split()[1:2] or ["?"])[0][-40:]


def report(acct: str, seen: str) -> str:
    records = list(read_acct(acct))
    births: Dict[int, List[list]] = collections.defaultdict(list)
    for line in Path(seen).read_text().splitlines():
        try:
            pid, ppid, at, cmd, test = json.loads(line)
        except ValueError:
            continue
        births[pid].append([ppid, at, cmd, test])
    for r in records:  # the sampler's view of the same process: same pid, seen while it lived
        for ppid, at, cmd, test in births.get(r["pid"], ()):
            if r["start"] - 2 <= at <= r["start"] + r["life"] + 2:
                r.update(ppid=ppid, cmd=cmd, test=test)
                break
    by_pid: Dict[int, List[dict]] = collections.defaultdict(list)
    for r in records:
        by_pid[r["pid"]].append(r)

    def parent(r: dict) -> Optional[dict]:
        return next((p for p in by_pid.get(r["ppid"], ()) if p is not r and
                     p["start"] <= r["start"] + 1 <= p["start"] + p["life"] + 2), None)

    def test_of(r: dict) -> str:
        """The first test of this suite (``tests/...``) up the process's ancestry: a rank that
        runs Horovod's own test files under pytest sets a test of theirs for its children."""
        other = ""
        for _ in range(40):
            test = r.get("test", "")
            if test.startswith("tests/"):
                return test.split("::")[0]
            other = other or test.split("::")[0]
            r = parent(r)
            if r is None:
                break
        return other or "(no test: the runner, or a process it missed)"

    by_file: Dict[str, float] = collections.Counter()
    by_kind: Dict[str, float] = collections.Counter()
    by_both: Dict[tuple, float] = collections.Counter()
    count: Dict[tuple, int] = collections.Counter()
    forked: Dict[int, int] = collections.Counter()
    kinds = {}
    for r in records:
        p = parent(r)
        k = kinds[id(r)] = kind_of(r.get("cmd", ""), r["comm"], (p or {}).get("cmd", ""))
        f = test_of(r)
        by_file[f] += r["cpu"]
        by_kind[k] += r["cpu"]
        by_both[(f, k)] += r["cpu"]
        count[(f, k)] += 1
        if k.endswith(" rank") and p is not None:
            forked[id(p)] += 1
    servers: Dict[tuple, List[float]] = collections.defaultdict(list)
    for r in records:
        if kinds[id(r)].endswith(" server"):
            servers[(kinds[id(r)], forked.get(id(r), 0))].append(r["cpu"])
    total = sum(r["cpu"] for r in records)
    out = [f"# Where the CPU went\n\n{len(records)} processes, {total:.0f} CPU-s in all "
           f"(tests/cpu_profile.py).\n", "## Per file\n\n| CPU-s | % | file |\n| --- | --- | --- |"]
    out += [f"| {v:.1f} | {100 * v / total:.1f} | {k} |" for k, v in by_file.most_common()]
    out += ["\n## Per kind of process\n\n| CPU-s | % | kind |\n| --- | --- | --- |"]
    out += [f"| {v:.1f} | {100 * v / total:.1f} | {k} |" for k, v in by_kind.most_common()]
    out += ["\n## Per file and kind (the 80 costliest)\n\n| CPU-s | processes | file | kind |\n"
            "| --- | --- | --- | --- |"]
    out += [f"| {v:.1f} | {count[k]} | {k[0]} | {k[1]} |" for k, v in by_both.most_common(80)]
    out += ["\n## Fork servers: ranks forked per server (sampled; a rank shorter than 0.1 s may "
            "be missed)\n\n| kind | ranks forked | servers | CPU-s of the servers |\n"
            "| --- | --- | --- | --- |"]
    out += [f"| {k} | {n} | {len(v)} | {sum(v):.1f} |" for (k, n), v in sorted(servers.items())]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="cpu-profile.md", help="where the report goes")
    parser.add_argument("--report", action="store_true",
                        help="only write the report from --acct and --seen of an earlier run")
    parser.add_argument("--acct", help="the accounting file (kept: default a temporary one)")
    parser.add_argument("--seen", help="the sampler's file (kept: default a temporary one)")
    parser.add_argument("test_args", nargs="*", help="after --: arguments for scripts/test.sh")
    args = parser.parse_args()
    if args.report:
        if not (args.acct and args.seen):
            parser.error("--report needs --acct and --seen")
        Path(args.out).write_text(report(args.acct, args.seen))
        return 0
    work = Path(tempfile.mkdtemp(prefix="cpu-profile-"))
    acct = Path(args.acct or work / "pacct")
    seen = Path(args.seen or work / "seen.jsonl")
    acct.write_bytes(b"")
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(seen, stop), daemon=True)
    sampler.start()
    _set_accounting(str(acct))
    try:
        status = subprocess.call(["bash", str(ROOT / "scripts" / "test.sh"), *args.test_args],
                                 cwd=ROOT)
    finally:
        _set_accounting(None)
        stop.set()
        sampler.join()
    Path(args.out).write_text(report(str(acct), str(seen)))
    print(f"cpu_profile: tests exited {status}; report in {args.out} (records: {acct}, {seen})",
          file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
