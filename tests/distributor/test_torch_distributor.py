"""TorchDistributor(local_mode=True): PySpark's API with errors that say what went wrong."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distributor import LaunchValidationError, PayloadPicklingError, RankFailedError, TorchDistributor

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_processes": True}, "num_processes must be a positive int"),
        ({"num_processes": 2.0}, "num_processes must be a positive int"),
        ({"num_processes": "2"}, "num_processes must be a positive int"),
        ({"num_processes": 0}, "has to be a positive integer \\(at least 1\\)"),
        ({"local_mode": "yes"}, "local_mode must be True or False"),
        ({"use_gpu": None}, "use_gpu must be True or False"),  # 0 and 1 pass, as in PySpark
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(LaunchValidationError, match=match):
        TorchDistributor(**{"use_gpu": False, **kwargs})


def test_use_gpu_without_gpu_says_to_pass_use_gpu_false():
    with pytest.raises(LaunchValidationError, match="use_gpu=False"):
        TorchDistributor(num_processes=2, use_gpu=True).run(lambda: 1)


def test_main_must_be_callable_or_existing_file(tmp_path):
    with pytest.raises(LaunchValidationError, match="neither a callable nor an existing script"):
        TorchDistributor(num_processes=2, use_gpu=False).run(str(tmp_path / "missing.py"))
    with pytest.raises(LaunchValidationError, match="function or a path"):
        TorchDistributor(num_processes=2, use_gpu=False).run(42)


def test_unpicklable_function_suggests_moving_objects_inside():
    lock = threading.Lock()

    def train():
        with lock:
            return 1

    with pytest.raises(PayloadPicklingError, match="inside the training function"):
        TorchDistributor(num_processes=2, use_gpu=False).run(train)


def test_function_returns_rank0_value_without_spark_session():
    value = TorchDistributor(num_processes=2, use_gpu=False).run(lambda a, b: (os.environ["RANK"], a + b), 1, 2)
    assert value == ("0", 3)


def test_script_runs_with_argv_under_the_torchrun_contract(tmp_path):
    out = tmp_path / "out"
    result = TorchDistributor(num_processes=2, use_gpu=False).run(
        str(SCRIPTS / "torchrun_style.py"), "--scale", 1.5, "--out", str(out)
    )
    assert result is None
    for rank in (0, 1):
        total, local_rank, name = (out.parent / f"out.{rank}").read_text().split()
        assert float(total) == 4.5 and local_rank == str(rank) and name == "__main__"


def test_script_exit_status_is_an_error_not_none():
    with pytest.raises(RankFailedError) as info:
        TorchDistributor(num_processes=2, use_gpu=False).run(str(SCRIPTS / "exit7.py"))
    assert info.value.rank == 1 and info.value.exit_code == 7
    assert "exit status 7" in str(info.value)


def _run_driver(script: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=str(script.parent), **kwargs,
    )


def test_function_defined_in_main_of_a_script():
    driver = _run_driver(SCRIPTS / "main_module_driver.py")
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0, out
    assert "RESULT 42" in out  # 40 + rank 0 + world size 2
    assert "BOX 42" in out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_of_the_driver_leaves_no_rank_behind():
    driver = _run_driver(SCRIPTS / "killed_driver.py")
    pids = []
    deadline = time.monotonic() + 60
    try:
        while len(pids) < 2 and time.monotonic() < deadline:
            line = driver.stdout.readline()
            if "PID" in line:
                pids.append(int(line.rsplit(" ", 1)[1]))
        assert len(pids) == 2, "ranks did not start"
        assert all(_alive(pid) for pid in pids)
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), f"orphaned ranks: {pids}"
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stdout.close()
