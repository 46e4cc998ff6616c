"""tests/cpu_profile.py reads the kernel's accounting records and charges each process to a test."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_profile  # noqa: E402


def _record(pid: int, ppid: int, start: int, life_s: float, cpu_ticks: int, comm: bytes) -> bytes:
    # acct_v3: version 3; utime as comp_t (exponent 1: mantissa * 8), stime 0
    utime = (1 << 13) | (cpu_ticks // 8)
    return struct.pack("<BBHIIIIIIf8H16s", 0, 3, 0, 0, 0, 0, pid, ppid, start, life_s * 100,
                       utime, 0, 0, 0, 0, 0, 0, 0, comm)


def test_records_are_decoded_with_comp_t_times():
    (rec,) = cpu_profile.read_acct_bytes(_record(42, 7, 1000, 2.5, 800, b"python"))
    assert rec == {"pid": 42, "ppid": 7, "start": 1000.0, "life": 2.5, "cpu": 8.0, "comm": "python"}


def test_a_process_is_charged_to_the_suites_test_up_its_ancestry(tmp_path):
    acct = tmp_path / "pacct"
    acct.write_bytes(
        _record(10, 1, 1000, 60, 80, b"python")      # the xdist worker, in a test of ours
        + _record(11, 10, 1001, 50, 160, b"python")  # a warm fork server it started
        + _record(12, 11, 1002, 40, 400, b"python")  # a rank the server forked
        + _record(13, 12, 1003, 10, 240, b"cc1plus")  # a compiler the rank ran (missed by /proc)
        + _record(14, 1, 1005, 5, 16, b"java"))      # nobody's: seen without a test
    ours = "tests/x/test_a.py::test_one (call)"
    seen = tmp_path / "seen.jsonl"
    seen.write_text("".join(json.dumps(row) + "\n" for row in [
        [10, 1, 1000.5, "python -u -c import sys;exec(eval(sys.stdin.readline()))", ours],
        [11, 10, 1001.5, "python -m distributor.forkserver_daemon x", ours],
        [12, 11, 1002.5, "python -m distributor.forkserver_daemon x", "test_torch.py::T::t (call)"],
        [14, 1, 1005.5, "java -cp spark", ""],
    ]))
    text = cpu_profile.report(str(acct), str(seen))
    assert "| 8.8 | 98.2 | tests/x/test_a.py |" in text  # 0.8 + 1.6 + 4.0 + 2.4
    assert "| 0.2 | 1.8 | (no test" in text
    assert "| 4.0 | 44.6 | forkserver_daemon rank |" in text
    assert "| 1.6 | 17.9 | forkserver_daemon server |" in text
    assert "| 2.4 | 26.8 | cc1plus |" in text
    assert "| forkserver_daemon server | 1 | 1 | 1.6 |" in text
