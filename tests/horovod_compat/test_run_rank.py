"""horovodrun (gloo mode) gives every rank Horovod's HOROVOD_* slot variables; --mpi does not."""
from __future__ import annotations

import subprocess
import sys

from horovod_compat.run_rank import horovod_slot_env

HOROVODRUN = [sys.executable, "-m", "horovod_compat.run"]
SLOT_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
             "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


def test_slot_env_from_torchrun_variables():
    env = horovod_slot_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                            "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "HOROVOD_HOSTNAME": "h1"})
    assert env == {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
                   "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
                   "HOROVOD_HOSTNAME": "h1"}
    assert horovod_slot_env({}) == {}


def test_gloo_ranks_see_horovod_slot_variables_and_init_agrees(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os\n"
        "names = " + repr(SLOT_VARS) + "\n"
        "before = [os.environ.get(n) for n in names]\n"
        "import horovod.torch as hvd\n"
        "hvd.init()\n"
        "after = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]\n"
        "print('slots', os.environ['RANK'], before, [str(v) for v in after], bool(os.environ.get('HOROVOD_HOSTNAME')))\n"
    )
    done = subprocess.run(HOROVODRUN + ["-np", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        values = [str(rank), "2", str(rank), "2", "0", "1"]
        assert f"[{rank}]<stdout>:slots {rank} {values} {values} True" in done.stdout, done.stdout


def test_mpi_ranks_do_not_get_horovod_slot_variables(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os\n"
        "print('slots', os.environ['RANK'], [os.environ.get(n) for n in " + repr(SLOT_VARS) + "])\n"
    )
    done = subprocess.run(HOROVODRUN + ["-np", "2", "--mpi", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"[1]<stdout>:slots 1 {[None] * len(SLOT_VARS)}" in done.stdout, done.stdout
