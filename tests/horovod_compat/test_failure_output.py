"""A failing job's output as Horovod users know it (issue 27, item 5).

`horovodrun` prints each rank line with Horovod's gloo-launcher prefix (``[1]<stdout>:line``,
``time.asctime()`` right before it with ``--prefix-output-with-timestamp``) and nothing else before
it (torch's ``[rank1]: `` comes off); a knock-on error of another rank is one line whose full
traceback is kept in a file; the root cause's traceback is shown in full, with the user's source
line and without horovod-compat's frames; a rank that died by a signal is said to be killed by it.

The file of full tracebacks (issue 43, point 5): one per job, in one directory of the user's
(0700), named by the last line of a failed job's summary, removed when the job succeeds, and only
the most recent `KEEP_FILES` left. The suite's jobs keep theirs in the run's own directory
(tests/conftest.py); the tests of the handler alone give it a directory of the test's own.
"""
from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from distributor import FunctionTarget, Job, LaunchRequest, RankFailedError
from distributor.engine import is_knock_on
from distributor.errors import fold_frames, last_traceback, parse_exception_line
from horovod_compat.launch import output as output_module
from horovod_compat.launch.output import (
    KEEP_FILES, KEPT_LINE, TRACEBACKS_DIR_VAR, RankOutput, new_tracebacks_file,
)

HOROVODRUN = [sys.executable, "-m", "horovod_compat.run"]
PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")
ASCTIME = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
#: horovod-compat's internal modules that must not show in a user's view of a failure
INTERNAL = ("negotiation.py", "_exchange.py", "_shm.py", "collectives.py", "run_rank.py")
FILE_NAME = r"tracebacks-\d{8}-\d{6}-\w+\.log"
KEPT_PREFIX = KEPT_LINE.split("{path}")[0]

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


@pytest.fixture
def kept_dir(tmp_path, monkeypatch):
    """The test's own directory of tracebacks files (not there yet: the first file makes it)."""
    path = tmp_path / "tracebacks"
    monkeypatch.setenv(TRACEBACKS_DIR_VAR, str(path))
    return path


def _failure() -> RankFailedError:
    return RankFailedError(1, 1, "ValueError", "bad", "\n".join(ROOT_TRACEBACK) + "\n")


def test_a_knock_on_traceback_is_one_line_and_kept_in_full_in_a_file(kept_dir):
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _, err = _printed(output, [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK]
                      + [(0, "stderr", "after")])
    path = output.tracebacks_path
    assert os.path.dirname(path) == str(kept_dir)
    assert re.fullmatch(FILE_NAME, os.path.basename(path)), path
    assert err == [f"[0]<stderr>:{KNOCK_ON_TRACEBACK[-1]} [full traceback: {path}]",
                   "[0]<stderr>:after"]
    with open(path) as kept:
        assert kept.read().splitlines() == [f"[0]<stderr>:{line}" for line in KNOCK_ON_TRACEBACK]
    assert stat.S_IMODE(os.stat(kept_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_chained_knock_on_errors_stay_one_line_each_without_the_chaining_lines(kept_dir):
    cause = ["Traceback (most recent call last):", '  File "/x/horovod_compat/common/_exchange.py", '
             'line 1, in gather', "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:5"]
    chain = ["", "The above exception was the direct cause of the following exception:", ""]
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _, err = _printed(output, [(0, "stderr", l) for l in cause + chain + KNOCK_ON_TRACEBACK])
    assert len(err) == 2 and "Connection closed by peer" in err[0] and "left the job" in err[1], err


def test_the_root_cause_traceback_shows_the_users_frames_and_folds_horovod_compats(kept_dir):
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _, err = _printed(output, [(1, "stderr", line) for line in ROOT_TRACEBACK])
    assert err == ["[1]<stderr>:" + line for line in [
        "Traceback (most recent call last):",
        '  File "/home/me/train.py", line 12, in <module>',
        "    hvd.allreduce(x)",
        "  ... (2 frames in horovod_compat)",
        ROOT_TRACEBACK[-1],
    ]]
    with open(output.tracebacks_path) as kept:
        assert kept.read().splitlines() == ["[1]<stderr>:" + line for line in ROOT_TRACEBACK]


CPP_WARNING = [
    "[W1130 13:14:39.759687424 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on "
    "SocketImpl(fd=4): Failed to recv, got 0 bytes. Connection was likely closed.",
    "Exception raised from recvBytes at /__w/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 "
    "(most recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f04 in libc10.so)",
    "frame #1: <unknown function> + 0x674888d (0x7f04a694888d in libtorch_cpu.so)",
    "<omitting python frames>",
    "frame #21: <unknown function> + 0x3d07bb (0x7f04b51d07bb in libtorch_python.so)",
    "frame #50: _start + 0x21 (0x55d8cec02081 in python)",
    "",
]


def test_the_cpp_stack_of_a_torch_warning_is_one_line_and_kept_in_full(kept_dir):
    """torch's TCPStore client warns with its C++ stack (about 40 frames) when the rank that hosts
    the store dies: the warning stays, the frames become one line naming where they are kept."""
    output = RankOutput(io.StringIO(), io.StringIO(), size=3)
    _, err = _printed(output, [(2, "stderr", line) for line in CPP_WARNING + ROOT_TRACEBACK])
    path = output.tracebacks_path
    assert err[:3] == [
        f"[2]<stderr>:{CPP_WARNING[0]}",
        "[2]<stderr>:Exception raised from recvBytes at /__w/pytorch/torch/csrc/distributed/c10d/"
        f"Utils.hpp:787 [C++ stack of 5 lines: {path}]",
        "[2]<stderr>:",
    ]
    assert err[3:] == ["[2]<stderr>:" + line for line in fold_frames(ROOT_TRACEBACK)], err
    with open(path) as kept:
        assert kept.read().splitlines()[:6] == [f"[2]<stderr>:{line}" for line in CPP_WARNING[1:7]]


def test_a_cpp_stack_cut_short_by_the_end_of_the_job_or_shown_verbose_is_shown_as_it_is(tmp_path):
    _, err = _printed(RankOutput(io.StringIO(), io.StringIO(), size=1),
                      [(0, "stderr", line) for line in CPP_WARNING[:4]])
    assert err == [f"[0]<stderr>:{line}" for line in CPP_WARNING[:4]]
    _, err = _printed(RankOutput(io.StringIO(), io.StringIO(), size=1, verbose=True),
                      [(0, "stderr", line) for line in CPP_WARNING])
    assert err == [f"[0]<stderr>:{line}" for line in CPP_WARNING]


def test_a_launch_that_succeeds_removes_its_file_one_that_fails_names_it_last(kept_dir):
    lines = [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK]
    with RankOutput(io.StringIO(), io.StringIO(), size=2) as output:  # the launch succeeds
        _printed(output, lines)
        assert os.path.isfile(output.tracebacks_path)
    assert not os.path.exists(output.tracebacks_path) and os.listdir(kept_dir) == []

    with pytest.raises(RankFailedError) as info:
        with RankOutput(io.StringIO(), io.StringIO(), size=2) as output:
            _printed(output, lines)
            raise _failure()
    path = output.tracebacks_path
    text = str(info.value)
    assert text.split("\n")[-2:] == [
        "", f"Full tracebacks of the ranks (shown shortened above): {path}"]
    assert text.count(path) == 1 and text.startswith(str(_failure()))
    with open(path) as kept:
        assert kept.read().splitlines() == [f"[0]<stderr>:{line}" for line in KNOCK_ON_TRACEBACK]

    # any other exception (Ctrl-C in the driver) keeps the file and leaves the error as it is
    with pytest.raises(KeyboardInterrupt) as info:
        with RankOutput(io.StringIO(), io.StringIO(), size=2) as output:
            _printed(output, lines)
            raise KeyboardInterrupt()
    assert os.path.isfile(output.tracebacks_path) and str(info.value) == ""
    # a failed launch that shortened no traceback made no file, and its error says nothing of one
    with pytest.raises(RankFailedError) as info:
        with RankOutput(io.StringIO(), io.StringIO(), size=2) as output:
            _printed(output, [(0, "stderr", "a plain line")])
            raise _failure()
    assert output.tracebacks_path is None and str(info.value) == str(_failure())
    assert len(os.listdir(kept_dir)) == 2


def test_only_the_most_recent_files_stay_and_nothing_else_is_removed(kept_dir, tmp_path):
    kept_dir.mkdir(mode=0o700)
    other = tmp_path / "someone_elses.log"
    other.write_text("not ours")
    foreign = {"notes.txt": "file", "tracebacks-mine.log": "file",
               "tracebacks-20240101-000000-abcdefgh.log.bak": "file",
               "tracebacks-20240101-000000-folder01.log": "dir",
               "tracebacks-20240101-000000-symlink1.log": "link"}
    for name, kind in foreign.items():
        if kind == "dir":
            (kept_dir / name).mkdir()
        elif kind == "link":
            (kept_dir / name).symlink_to(other)
        else:
            (kept_dir / name).write_text("keep me")
        os.utime(kept_dir / name, (0, 0), follow_symlinks=False)  # older than any file made
    made = []
    for number in range(KEEP_FILES + 3):
        handle, path = new_tracebacks_file()
        handle.write(f"job {number}\n")
        handle.close()
        os.utime(path, (1000 + number, 1000 + number))  # made one after the other, in order
        made.append(os.path.basename(path))
        assert len([n for n in os.listdir(kept_dir) if n in made]) == min(number + 1, KEEP_FILES)
    assert sorted(os.listdir(kept_dir)) == sorted(made[3:] + list(foreign))
    assert (kept_dir / made[-1]).read_text() == f"job {KEEP_FILES + 2}\n"
    assert other.read_text() == "not ours"


def test_a_directory_open_to_others_is_not_used_and_tracebacks_are_shown_in_full(kept_dir):
    kept_dir.mkdir(mode=0o755)
    os.chmod(kept_dir, 0o755)
    with pytest.raises(RankFailedError) as info:
        with RankOutput(io.StringIO(), io.StringIO(), size=2) as output:
            _, err = _printed(output, [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK]
                              + [(1, "stderr", line) for line in ROOT_TRACEBACK])
            raise _failure()
    assert err == [
        "horovod-compat: tracebacks are shown in full, none can be kept in a file: "
        f"{kept_dir} must be a directory of this user that no one else can open (mode 0700); "
        f"fix or remove it, or set {TRACEBACKS_DIR_VAR} to another directory",
        *[f"[0]<stderr>:{line}" for line in KNOCK_ON_TRACEBACK],
        *[f"[1]<stderr>:{line}" for line in ROOT_TRACEBACK],
    ]
    assert output.tracebacks_path is None and os.listdir(kept_dir) == []
    assert str(info.value) == str(_failure())


def test_the_default_directory_is_this_users_in_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(TRACEBACKS_DIR_VAR, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    expected = tmp_path / f"horovod-compat-tracebacks-{os.getuid()}"
    assert output_module.tracebacks_dir() == str(expected)
    output = RankOutput(io.StringIO(), io.StringIO(), size=2)
    _printed(output, [(0, "stderr", line) for line in KNOCK_ON_TRACEBACK])
    assert os.path.dirname(output.tracebacks_path) == str(expected)
    assert stat.S_IMODE(os.stat(expected).st_mode) == 0o700


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


def _without_kept_line(summary, kept: str) -> list:
    """`summary` without its last two lines, a blank one and the one naming the file `kept` of
    the full tracebacks, after checking that they are there if and only if the job made one."""
    if not kept:
        assert not any(KEPT_PREFIX in line for line in summary), summary
        return summary
    assert summary[-2:] == ["", KEPT_LINE.format(path=kept)], summary
    assert os.path.dirname(kept) == os.environ[TRACEBACKS_DIR_VAR], kept
    assert "\n".join(summary).count(kept) == 1
    return summary[:-2]


def test_a_rank_that_raises(tmp_path):
    done = _horovodrun(tmp_path, 'raise ValueError("bad batch in rank 1")')
    out, err, summary = _split(done)
    kept = _kept_file(err)
    summary = _without_kept_line(summary, kept)
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
    assert summary[0] == ("horovodrun: Rank 1 failed (exit status 1): "
                          "ValueError: bad batch in rank 1")
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
    assert not any(KEPT_PREFIX in line for line in summary), summary  # DIR/rank.N/stderr keep them


#: A rank error raised inside horovod-compat: its traceback is shown folded, and kept whole.
RAISED_INSIDE = "hvd.broadcast(torch.ones(2), root_rank=7)"
RAISED_INSIDE_ERROR = ("ValueError: broadcast root rank 7 is not part of process set with "
                       "ranks [0, 1]")


def _check_kept(path: str, rank: int, error_line: str) -> None:
    """The tracebacks file `path` is in the run's directory and holds `rank`'s traceback whole,
    horovod-compat's frames and all, ending with `error_line`."""
    assert os.path.dirname(path) == os.environ[TRACEBACKS_DIR_VAR]
    assert re.fullmatch(FILE_NAME, os.path.basename(path)), path
    with open(path) as handle:
        lines = [line for line in handle.read().splitlines()
                 if line.startswith(f"[{rank}]<stderr>:")]
    assert lines[0] == f"[{rank}]<stderr>:Traceback (most recent call last):", lines
    assert lines[-1] == f"[{rank}]<stderr>:{error_line}", lines
    assert any("horovod_compat/torch/collectives.py" in line and "in broadcast" in line
               for line in lines), lines


def test_a_failed_jobs_summary_ends_naming_the_file_of_full_tracebacks(tmp_path):
    done = _horovodrun(tmp_path, RAISED_INSIDE)
    _, err, summary = _split(done)
    assert done.returncode == 1, done.stderr
    assert "[1]<stderr>:  ... (2 frames in horovod_compat)" in err  # shortened, so kept
    assert summary[0] == f"horovodrun: Rank 1 failed (exit status 1): {RAISED_INSIDE_ERROR}"
    assert summary[-1].startswith(KEPT_PREFIX), done.stderr
    path = summary[-1][len(KEPT_PREFIX):]
    _without_kept_line(summary, path)  # named once, at the end, after a blank line
    assert _kept_file(err) in ("", path)  # a knock-on line of rank 0 names the same file
    _check_kept(path, 1, RAISED_INSIDE_ERROR)


def _raise_inside_on_rank_1():
    import torch

    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        hvd.broadcast(torch.ones(2), root_rank=7)
    hvd.allreduce(torch.ones(2), name="b")


def test_the_error_of_horovod_run_ends_naming_the_file_of_full_tracebacks():
    import horovod

    with pytest.raises(RankFailedError) as info:
        horovod.run(_raise_inside_on_rank_1, num_proc=2)
    lines = str(info.value).split("\n")
    assert lines[0] == f"Rank 1 failed (exit status 1): {RAISED_INSIDE_ERROR}"
    assert lines[-1].startswith(KEPT_PREFIX), lines
    path = lines[-1][len(KEPT_PREFIX):]
    _without_kept_line(lines, path)
    _check_kept(path, 1, RAISED_INSIDE_ERROR)


SUCCEEDS = textwrap.dedent("""\
    import sys, traceback
    import torch
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        try:
            {raised_inside}
        except ValueError:
            traceback.print_exc()
        print({knock_on!r}, file=sys.stderr, flush=True)
    hvd.allreduce(torch.ones(2), name="a")
    """)


def test_a_job_that_succeeds_leaves_no_file_of_tracebacks(tmp_path):
    """A job that prints tracebacks it shortens (a caught error's, one that reads as a knock-on)
    and then succeeds removes the file it kept them in."""
    script = tmp_path / "train.py"
    script.write_text(SUCCEEDS.format(raised_inside=RAISED_INSIDE,
                                      knock_on="\n".join(KNOCK_ON_TRACEBACK)))
    done = subprocess.run(HOROVODRUN + ["-np", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert "[1]<stderr>:  ... (2 frames in horovod_compat)" in err, done.stderr
    path = _kept_file(err)  # the knock-on's line named the file while the job ran
    assert path and os.path.dirname(path) == os.environ[TRACEBACKS_DIR_VAR], done.stderr
    assert not os.path.exists(path)
    assert KEPT_PREFIX not in done.stderr


def _kill_rank_1():
    import torch

    import horovod.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(2), name="a")
    if hvd.rank() == 1:
        os.kill(os.getpid(), 9)
    hvd.allreduce(torch.ones(2), name="b")


def _check_killed(text: str, err_lines) -> None:
    text = "\n".join(_without_kept_line(text.split("\n"), _kept_file(err_lines)))
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


def test_a_rank_killed_by_sigkill_under_horovodrun(tmp_path):
    done = _horovodrun(tmp_path, "os.kill(os.getpid(), 9)")
    _, err, summary = _split(done)
    assert done.returncode == 137, done.stderr
    assert summary[0] == "horovodrun: Rank 1 failed (killed by SIGKILL)", done.stderr
    _check_killed("\n".join(summary), err)


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
