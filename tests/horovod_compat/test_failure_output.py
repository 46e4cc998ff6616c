"""A failing job's output as Horovod users know it (issue 27, item 5).

`horovodrun` prints each rank line with Horovod's gloo-launcher prefix (``[1]<stdout>:line``,
``time.asctime()`` right before it with ``--prefix-output-with-timestamp``) and nothing else before
it (torch's ``[rank1]: `` comes off); a knock-on error of another rank is one line whose full
traceback is kept in a file; the root cause's traceback is shown in full, with the user's source
line and without horovod-compat's frames; a rank that died by a signal is said to be killed by it.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap

import pytest

from distributor import FunctionTarget, Job, LaunchRequest, RankFailedError
from distributor.engine import is_knock_on
from distributor.errors import fold_frames, last_traceback, parse_exception_line
from horovod_compat.launch.output import RankOutput

HOROVODRUN = [sys.executable, "-m", "horovod_compat.run"]
PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")
ASCTIME = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
#: horovod-compat's internal modules that must not show in a user's view of a failure
INTERNAL = ("negotiation.py", "_exchange.py", "_shm.py", "collectives.py", "run_rank.py")

HOROVOD_LINE = '  File "/site-packages/horovod_compat/{0}.py", line {1}, in {0}'
KNOCK_ON_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 10, in <module>',
    '    y = hvd.allreduce(torch.ones(2), name="b")',
    "        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    HOROVOD_LINE.format("torch/collectives", 68),
    "    out = _allreduce_nograd(t, name)",
    HOROVOD_LINE.format("common/negotiation", 195),
    "    self.st._drive_until(self)",
    HOROVOD_LINE.format("common/_exchange", 158),
    "    raise HorovodInternalError(",
    "horovod_compat.common.exceptions.HorovodInternalError: rank 1 of this process set left the "
    "job (its process is exiting, e.g. after an error, or it called hvd.shutdown()) while this "
    "rank waited for it in a collective",
]
ROOT_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 12, in <module>',
    "    hvd.allreduce(x)",
    HOROVOD_LINE.format("torch/collectives", 68),
    "    out = _allreduce_nograd(t, name)",
    HOROVOD_LINE.format("common/negotiation", 195),
    "    self.st._drive_until(self)",
    "horovod_compat.common.exceptions.HorovodInternalError: Mismatched allreduce tensor shapes",
]


# ---- the output handler and the engine, without processes -------------------------------------
def _printed(output: RankOutput, lines) -> tuple:
    out, err = output._streams["stdout"], output._streams["stderr"]
    for rank, stream, line in lines:
        output(rank, stream, line)
    output.close()
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def test_lines_carry_horovods_prefix_exactly():
    out, err = _printed(RankOutput(io.StringIO(), io.StringIO(), size=2), [
        (0, "stdout", "hello"), (1, "stderr", "warn: x"), (1, "stdout", " indented"),
        (0, "stdout", ""), (None, "stderr", "mpirun says"),
    ])
    assert out == ["[0]<stdout>:hello", "[1]<stdout>: indented", "[0]<stdout>:"]
    assert err == ["[1]<stderr>:warn: x", "[launcher]<stderr>:mpirun says"]


def test_timestamps_go_right_before_the_prefix_as_time_asctime_writes_them():
    out, err = _printed(RankOutput(io.StringIO(), io.StringIO(), timestamps=True, size=2),
                        [(1, "stdout", "hello"), (0, "stderr", "oops")])
    assert re.fullmatch(ASCTIME + r"\[1\]<stdout>:hello", out[0]), out
    assert re.fullmatch(ASCTIME + r"\[0\]<stderr>:oops", err[0]), err


def test_the_engine_takes_off_torchs_rank_prefix_once():
    seen = []
    job = Job(LaunchRequest(FunctionTarget(print), 2), output=lambda *a: seen.append(a))
    job.on_output(1, "stderr", "[rank1]: Traceback (most recent call last):")
    job.on_output(1, "stderr", "[rank1]:   File \"x.py\", line 1, in <module>")
    job.on_output(0, "stdout", "[rank0]: printed by the user on stdout")
    job.on_output(None, "stderr", "[rank1]: a launcher line")
    assert seen == [
        (1, "stderr", "Traceback (most recent call last):"),
        (1, "stderr", '  File "x.py", line 1, in <module>'),
        (0, "stdout", "[rank0]: printed by the user on stdout"),
        (None, "stderr", "[rank1]: a launcher line"),
    ]
    assert list(job._states[1].stderr_tail)[0] == "Traceback (most recent call last):"


def test_a_knock_on_traceback_is_one_line_and_kept_in_full_in_a_file():
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _, err = _printed(output, [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK]
                      + [(0, "stderr", "after")])
    path = output.tracebacks_path
    try:
        assert err == [f"[0]<stderr>:{KNOCK_ON_TRACEBACK[-1]} [full traceback: {path}]",
                       "[0]<stderr>:after"]
        with open(path) as kept:
            assert kept.read().splitlines() == [f"[0]<stderr>:{line}" for line in KNOCK_ON_TRACEBACK]
    finally:
        os.unlink(path)


def test_chained_knock_on_errors_stay_one_line_each_without_the_chaining_lines():
    cause = ["Traceback (most recent call last):", '  File "/x/horovod_compat/common/_exchange.py", '
             'line 1, in gather', "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:5"]
    chain = ["", "The above exception was the direct cause of the following exception:", ""]
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _, err = _printed(output, [(0, "stderr", l) for l in cause + chain + KNOCK_ON_TRACEBACK])
    os.unlink(output.tracebacks_path)
    assert len(err) == 2 and "Connection closed by peer" in err[0] and "left the job" in err[1], err


def test_the_root_cause_traceback_shows_the_users_frames_and_folds_horovod_compats():
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _, err = _printed(output, [(1, "stderr", line) for line in ROOT_TRACEBACK])
    os.unlink(output.tracebacks_path)
    assert err == ["[1]<stderr>:" + line for line in [
        "Traceback (most recent call last):",
        '  File "/home/me/train.py", line 12, in <module>',
        "    hvd.allreduce(x)",
        "  ... (2 frames in horovod_compat)",
        ROOT_TRACEBACK[-1],
    ]]


def test_verbose_shows_every_traceback_as_printed_and_the_files_keep_every_line(tmp_path):
    output = RankOutput(io.StringIO(), io.StringIO(), size=1, verbose=True)
    _, err = _printed(output, [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK])
    assert err == ["[0]<stderr>:" + line for line in KNOCK_ON_TRACEBACK]
    assert output.tracebacks_path is None
    output = RankOutput(io.StringIO(), io.StringIO(), size=1, directory=str(tmp_path))
    _, err = _printed(output, [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK])
    kept = tmp_path / "rank.0" / "stderr"
    assert err == [f"[0]<stderr>:{KNOCK_ON_TRACEBACK[-1]} [full traceback: {kept}]"]
    assert kept.read_text().splitlines() == KNOCK_ON_TRACEBACK and output.tracebacks_path is None


def test_a_traceback_cut_short_by_the_end_of_the_job_is_shown_as_it_is():
    _, err = _printed(RankOutput(io.StringIO(), io.StringIO(), size=1),
                      [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK[:4]])
    assert err == ["[0]<stderr>:" + line for line in KNOCK_ON_TRACEBACK[:4]]


def test_traceback_helpers():
    lines = ["noise", *ROOT_TRACEBACK[:1], '  File "a.py", line 1, in f', "KeyError: 'k'", "",
             "During handling of the above exception, another exception occurred:", "",
             *ROOT_TRACEBACK, "atexit noise"]
    block = last_traceback(lines)
    assert block == lines[1:-1]
    assert last_traceback(ROOT_TRACEBACK[:3]) is None
    assert parse_exception_line(ROOT_TRACEBACK[-1]) == ("HorovodInternalError",
                                                        "Mismatched allreduce tensor shapes")
    assert parse_exception_line("KeyboardInterrupt") == ("KeyboardInterrupt", "")
    assert parse_exception_line("  not one") == (None, None)
    assert fold_frames(ROOT_TRACEBACK, {}) == ROOT_TRACEBACK
    assert fold_frames(ROOT_TRACEBACK[:5], {"horovod_compat": "hc"})[-1] == "  ... (1 frame in hc)"
    assert is_knock_on(KNOCK_ON_TRACEBACK[-1]) and not is_knock_on("Mismatched allreduce shapes")
    assert not is_knock_on(None)


def test_the_error_shows_the_root_cause_traceback_folded_and_keeps_it_whole():
    error = RankFailedError(1, 1, "HorovodInternalError", "Mismatched allreduce tensor shapes",
                            "\n".join(ROOT_TRACEBACK) + "\n", other_failures=[(0, "x: y (exit status 1)")])
    text = str(error)
    assert "  ... (2 frames in horovod_compat)" in text and "negotiation" not in text
    assert '    hvd.allreduce(x)' in text and "  rank 0: x: y (exit status 1)" in text
    assert "negotiation" in error.traceback


# ---- real jobs ----------------------------------------------------------------------------------
TRAIN = textwrap.dedent("""\
    import os, sys
    import torch
    import horovod.torch as hvd

    hvd.init()
    print("hello from", hvd.rank(), flush=True)
    print("a warning from", hvd.rank(), file=sys.stderr, flush=True)
    x = hvd.allreduce(torch.ones(2), name="a")
    if hvd.rank() == 1:
        {fail}
    hvd.allreduce(torch.ones(2), name="b")
    """)


def _horovodrun(tmp_path, fail: str, *options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(fail=fail))
    return subprocess.run(HOROVODRUN + ["-np", "2", *options, sys.executable, str(script)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)


def _split(done: subprocess.CompletedProcess):
    """(rank lines of stdout and stderr, horovodrun's own lines at the end of stderr)."""
    err = done.stderr.splitlines()
    at = next((i for i, line in enumerate(err) if line.startswith("horovodrun: ")), len(err))
    return done.stdout.splitlines(), err[:at], err[at:]


def _kept_file(lines) -> str:
    paths = {m.group(1) for line in lines for m in [re.search(r"\[full traceback: (\S+)\]$", line)] if m}
    assert len(paths) <= 1, paths
    return paths.pop() if paths else ""


def test_a_rank_that_raises(tmp_path):
    done = _horovodrun(tmp_path, 'raise ValueError("bad batch in rank 1")')
    out, err, summary = _split(done)
    kept = _kept_file(err)
    try:
        assert done.returncode == 1, done.stderr
        # every line of the ranks carries Horovod's prefix, once, and the stream it came from
        for stream, lines in (("stdout", out), ("stderr", err)):
            for line in lines:
                match = PREFIX.match(line)
                assert match and match.group(2) == stream, line
                rest = line[match.end():]
                assert not PREFIX.match(rest) and not re.match(r"\[rank ?\d+\]", rest), line
        assert "[0]<stdout>:hello from 0" in out and "[1]<stdout>:hello from 1" in out
        assert "[1]<stderr>:a warning from 1" in err
        # the root cause, live: the traceback as the rank printed it, with the user's line
        assert [line for line in err if line.startswith("[1]<stderr>:")] == [
            "[1]<stderr>:a warning from 1",
            "[1]<stderr>:Traceback (most recent call last):",
            f'[1]<stderr>:  File "{tmp_path / "train.py"}", line 10, in <module>',
            '[1]<stderr>:    raise ValueError("bad batch in rank 1")',
            "[1]<stderr>:ValueError: bad batch in rank 1",
        ]
        # the knock-on error of rank 0: one line (unless the driver stopped it first)
        knock_on = [line for line in err if line.startswith("[0]<stderr>:")
                    and line != "[0]<stderr>:a warning from 0"]
        assert len(knock_on) <= 1, knock_on
        for line in knock_on:
            assert line.startswith("[0]<stderr>:horovod_compat.common.exceptions.HorovodInternalError: "
                                   "rank 1 of this process set left the job (its process is exiting")
            assert line.endswith(f"[full traceback: {kept}]")
            assert "called hvd.shutdown() (or left the job)" not in line
            with open(kept) as handle:
                full = handle.read()
            assert "negotiation.py" in full and full.count("Traceback (most recent call last):") == 1
        # the summary: the root cause with its traceback in full, the others one line each
        text = "\n".join(summary)
        assert summary[0] == "horovodrun: Rank 1 failed (exit status 1): ValueError: bad batch in rank 1"
        assert summary[1:7] == [
            "",
            "Traceback from rank 1:",
            "Traceback (most recent call last):",
            f'  File "{tmp_path / "train.py"}", line 10, in <module>',
            '    raise ValueError("bad batch in rank 1")',
            "ValueError: bad batch in rank 1",
        ], text
        others = summary[summary.index("Other ranks stopped afterwards:") + 1:]
        assert len(others) == 1 and others[0].startswith("  rank 0: "), text
        assert ("left the job" in others[0] and others[0].endswith("(exit status 1)")
                or others[0].startswith("  rank 0: stopped by the driver")), text
        for name in INTERNAL:
            assert name not in done.stdout + done.stderr, name
    finally:
        if kept:
            os.unlink(kept)


def test_timestamps_and_output_files_in_a_real_job(tmp_path):
    done = _horovodrun(tmp_path, 'raise ValueError("bad batch in rank 1")',
                       "--prefix-output-with-timestamp", "--output-filename", str(tmp_path / "logs"))
    out, err, summary = _split(done)
    assert done.returncode == 1, done.stderr
    for stream, lines in (("stdout", out), ("stderr", err)):
        assert lines
        for line in lines:
            assert re.match(ASCTIME + r"\[[01]\]<" + stream + ">:", line), line
    kept = _kept_file(err)
    assert kept in ("", str(tmp_path / "logs" / "rank.0" / "stderr"))
    rank1 = (tmp_path / "logs" / "rank.1" / "stderr").read_text()
    assert "ValueError: bad batch in rank 1" in rank1 and "[rank1]" not in rank1
    assert summary[0] == "horovodrun: Rank 1 failed (exit status 1): ValueError: bad batch in rank 1"


def _kill_rank_1():
    import torch

    import horovod.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(2), name="a")
    if hvd.rank() == 1:
        os.kill(os.getpid(), 9)
    hvd.allreduce(torch.ones(2), name="b")


def _check_killed(text: str, err_lines) -> None:
    assert "Rank 1 failed (killed by SIGKILL)" in text, text
    assert "called hvd.shutdown() (or left the job)" not in text
    others = text.split("Other ranks stopped afterwards:\n", 1)[1].splitlines()
    assert len(others) == 1 and others[0].startswith("  rank 0: "), text
    for line in err_lines:
        if line.startswith("[0]<stderr>:") and "HorovodInternalError" in line:
            assert "exited while rank 0 waited" in line or "left the job" in line, line


def test_a_rank_killed_by_sigkill_through_horovod_run(capsys):
    import horovod

    with pytest.raises(RankFailedError) as info:
        horovod.run(_kill_rank_1, num_proc=2)
    err = capsys.readouterr().err.splitlines()
    _check_killed(str(info.value), err)
    assert info.value.exit_code == -9
    kept = _kept_file(err)
    if kept:
        os.unlink(kept)


def test_a_rank_killed_by_sigkill_under_horovodrun(tmp_path):
    done = _horovodrun(tmp_path, "os.kill(os.getpid(), 9)")
    _, err, summary = _split(done)
    assert done.returncode == 137, done.stderr
    assert summary[0] == "horovodrun: Rank 1 failed (killed by SIGKILL)", done.stderr
    _check_killed("\n".join(summary), err)
    kept = _kept_file(err)
    if kept:
        os.unlink(kept)


def test_only_the_package_itself_is_folded_not_a_folder_of_the_same_name():
    """A project's own `tests/horovod_compat/train.py` is user code: its frame stays."""
    import horovod_compat
    from distributor.errors import fold_frames

    package = os.path.dirname(horovod_compat.__file__)
    lines = ["Traceback (most recent call last):",
             '  File "/home/me/project/tests/horovod_compat/train.py", line 3, in <module>',
             "    hvd.allreduce(x)",
             f'  File "{package}/torch/collectives.py", line 10, in allreduce',
             "    return _run(x)",
             '  File "/opt/venv/lib/python3.11/site-packages/horovod_compat/common/negotiation.py", '
             'line 5, in _run',
             "    raise error",
             "ValueError: bad"]
    assert fold_frames(lines, {"horovod_compat": "horovod_compat"}) == [
        lines[0], lines[1], lines[2], "  ... (2 frames in horovod_compat)", lines[-1]]
