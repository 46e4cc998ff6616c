"""Restart-all (`max_restarts`, torchrun's --max-restarts) with real rank processes on this host."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from distributor import (
    LaunchValidationError,
    PayloadPicklingError,
    RankFailedError,
    TorchDistributor,
    run_function,
    run_script,
)
from distributor.restarts import retried


def _fail_first_time(marker: str):
    """Rank 1 fails unless the marker exists (it creates it first): only the first attempt fails."""
    rank = os.environ["RANK"]
    counts = (os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["TORCHELASTIC_MAX_RESTARTS"])
    print(f"rank {rank} attempt {counts[0]} pid {os.getpid()}", flush=True)
    if rank == "1" and not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise RuntimeError("first attempt fails on purpose")
    return counts, os.getpid()


def test_a_failed_attempt_restarts_every_rank_and_the_second_succeeds(tmp_path):
    lines = []
    results = run_function(_fail_first_time, str(tmp_path / "marker"), num_processes=2,
                           max_restarts=2, return_all=True,
                           output=lambda rank, stream, line: lines.append((rank, line)))
    assert [counts for counts, _ in results] == [("1", "2"), ("1", "2")]
    first_pids = {int(line.split()[-1]) for rank, line in lines if " attempt 0 " in line}
    assert len(first_pids) == 2 and not first_pids & {pid for _, pid in results}, \
        "every rank, not only the failed one, must run again in a new process"
    notes = [line for rank, line in lines if rank is None]
    assert len(notes) == 1 and notes[0].startswith("attempt 1 of 3 failed: Rank 1 failed"), notes


def _always_fails():
    raise ValueError(f"broken on attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}")


def test_exhausted_restarts_raise_the_last_failure_listing_every_attempt():
    with pytest.raises(RankFailedError) as info:
        run_function(_always_fails, num_processes=1, max_restarts=2, output=lambda *a: None)
    error = info.value
    message = str(error)
    for number in (0, 1, 2):
        assert f"attempt {number + 1} of 3: Rank 0 failed (exit status 1): ValueError: " \
               f"broken on attempt {number}" in message
    assert "max_restarts=2" in message and "broken on attempt 2" in error.exc_message
    assert [a.number for a in error.attempts] == [1, 2, 3]
    assert "broken on attempt 0" in error.attempts[0].cause
    assert error.attempts[-1].action.startswith("gave up")


def _returns_unpicklable():
    import threading

    return threading.Lock()


def test_pickling_and_validation_errors_are_not_retried(tmp_path):
    runs = tmp_path / "runs"

    def count_and_return_lock():
        with open(runs, "a") as handle:
            handle.write("x")
        return _returns_unpicklable()

    with pytest.raises(RankFailedError, match="cannot be pickled") as info:
        run_function(count_and_return_lock, num_processes=1, max_restarts=3, output=lambda *a: None)
    assert runs.read_text() == "x", "a return value that cannot be pickled must not be retried"
    assert not hasattr(info.value, "attempts")
    lock = _returns_unpicklable()
    with pytest.raises(PayloadPicklingError):
        run_function(lambda: lock, num_processes=1, max_restarts=3)
    with pytest.raises(LaunchValidationError, match="max_restarts must be an int >= 0"):
        run_function(_always_fails, num_processes=1, max_restarts=-1)
    with pytest.raises(LaunchValidationError, match="max_restarts must be an int >= 0"):
        TorchDistributor(num_processes=1, max_restarts=True)
    assert not retried(LaunchValidationError("x")) and not retried(KeyboardInterrupt())


def test_run_script_and_torch_distributor_restart_torchrun_scripts(tmp_path):
    script = tmp_path / "train.py"
    marker = tmp_path / "marker"
    script.write_text(
        "import os, sys\n"
        "count = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "if os.environ['RANK'] == '0' and count == '0':\n"
        "    sys.exit(3)\n"
        f"open({str(marker)!r} + os.environ['RANK'], 'w').write(count)\n")
    run_script(str(script), num_processes=2, max_restarts=1, output=lambda *a: None)
    assert [(tmp_path / f"marker{r}").read_text() for r in (0, 1)] == ["1", "1"]
    with pytest.raises(RankFailedError, match=r"^Rank 0 failed \(exit status 3\)") as info:
        TorchDistributor(num_processes=2, use_gpu=False).run(str(script))
    assert not hasattr(info.value, "attempts"), "no restarts asked: the plain error"
    assert TorchDistributor(num_processes=2, use_gpu=False, max_restarts=1).run(str(script)) is None

