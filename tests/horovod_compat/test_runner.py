"""HorovodRunner in driver-only mode (np < 0): real mpirun, real ranks."""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from distributor import PayloadPicklingError, RankFailedError
from horovod_compat.runner import HorovodRunner, log_to_driver
from procs import processes_with


def train(learning_rate, scale=1):
    import os

    from sparkdl.horovod import log_to_driver

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    print(f"plain print from rank {rank}")
    log_to_driver(f"callback from rank {rank}")
    return {"rank": rank, "lr": learning_rate * scale, "timeline": os.environ.get("HOROVOD_TIMELINE")}


def test_np_negative_returns_rank0_value_and_shows_every_rank_line(capsys, monkeypatch, tmp_path):
    """Databricks sends a driver-only job's stdout and stderr to the notebook cell, whatever
    driver_log_verbosity says (it applies to np > 0)."""
    monkeypatch.setenv("HOROVOD_TIMELINE", str(tmp_path / "tl.json"))
    result = HorovodRunner(np=-2).run(train, learning_rate=0.1, scale=2)
    assert result == {"rank": 0, "lr": 0.2, "timeline": str(tmp_path / "tl.json")}
    out = capsys.readouterr().out
    assert "callback from rank 0" in out and "callback from rank 1" in out
    assert "[rank 0] plain print from rank 0" in out and "[rank 1] plain print from rank 1" in out
    assert "not shown" not in out


def test_bad_arguments_fail_before_any_process():
    with pytest.raises(ValueError, match="np=-N to run N ranks on the driver only"):
        HorovodRunner(np=0)
    with pytest.raises(TypeError, match="np must be an int"):
        HorovodRunner(np="2")
    with pytest.raises(ValueError, match="driver_log_verbosity"):
        HorovodRunner(np=-1, driver_log_verbosity="verbose")
    with pytest.raises(TypeError, match=r"do not fit train\(learning_rate, scale=1\)"):
        HorovodRunner(np=-2).run(train, lr=0.1)
    import threading

    lock = threading.Lock()
    with pytest.raises(PayloadPicklingError, match="argument 'lock'"):
        HorovodRunner(np=-2).run(lambda lock: None, lock=lock)


def test_large_payload_warns_and_names_the_argument():
    big = b"x" * (11 * 1024 * 1024)
    with pytest.warns(UserWarning, match=r"argument 'blob' \(11\.0 MB\)"):
        assert HorovodRunner(np=-1).run(lambda blob: len(blob), blob=big) == len(big)


def failing_train(marker):
    import os
    import time

    if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
        raise RuntimeError("rank one gave up")
    time.sleep(60)


def test_failing_rank_gives_clear_error_and_leaves_nothing_behind(monkeypatch):
    marker = f"HOROVOD_TEST_MARKER_{uuid.uuid4().hex}"
    monkeypatch.setenv("HOROVOD_TEST_MARKER", marker)
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2).run(failing_train, marker=marker)
    assert info.value.rank == 1 and "rank one gave up" in str(info.value)
    assert "failing_train" in info.value.traceback
    assert processes_with(marker) == []


def test_log_to_driver_outside_a_rank_prints(capsys):
    log_to_driver("on the driver")
    assert capsys.readouterr().out == "on the driver\n"


def test_horovodrun_runs_a_command_on_n_ranks(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], os.environ.get('HOROVOD_TIMELINE'))\n"
        "sys.exit(int(sys.argv[1]) if os.environ['RANK'] == '1' else 0)\n"
    )
    horovodrun = [sys.executable, "-m", "horovod_compat.run"]
    ok = subprocess.run(
        horovodrun + ["-np", "2", "-H", "localhost:2", "--timeline-filename", str(tmp_path / "t.json"),
                      sys.executable, str(script), "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert f"[1]<stdout>:rank 1 of 2 {tmp_path / 't.json'}" in ok.stdout
    failed = subprocess.run(
        horovodrun + ["-np", "2", "--mpi", sys.executable, str(script), "9"],
        capture_output=True, text=True, timeout=120,
    )
    assert failed.returncode == 9
    assert "Rank 1 failed (exit status 9)" in failed.stderr
    # Other hosts are reached over ssh; one that ssh cannot reach fails before anything starts.
    bad = subprocess.run(horovodrun + ["-np", "2", "-H", "otherhost:2", "true"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and "Could not reach these hosts with ssh" in bad.stderr
    assert "otherhost: " in bad.stderr
