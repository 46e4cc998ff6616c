"""Ranks started by a real `mpirun` (Open MPI from PyPI), demultiplexed per rank."""
from __future__ import annotations

import os
import subprocess
import tempfile
import time

import pytest

from distributor import FunctionTarget, Job, LaunchRequest, RankFailedError, run_function
from distributor.launchers import MpirunLauncher
from distributor.launchers.mpirun import (
    MpirunOutput, demux_tagged, find_mpirun, mpirun_command,
)
from distributor.rank_env import from_mpi_environment


def _allreduce_and_env():
    import torch
    import torch.distributed as dist
    from distributor.worker import send_to_driver

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    send_to_driver({"rank": dist.get_rank(), "note": "hello"})
    print(f"line from rank {dist.get_rank()}")
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "OMPI_COMM_WORLD_RANK")
    return t.item(), {k: os.environ.get(k) for k in keys}


def test_mpirun_ranks_get_the_torchrun_contract_and_stream_per_rank():
    lines, messages = [], []
    job = Job(
        LaunchRequest(FunctionTarget(_allreduce_and_env), 2, return_all=True),
        launcher=MpirunLauncher(),
        output=lambda r, s, l: lines.append((r, s, l)),
        on_message=lambda r, m: messages.append((r, m)),
    )
    values = job.run()
    assert [v[0] for v in values] == [2.0, 2.0]
    for rank, (_, env) in enumerate(values):
        assert env["RANK"] == env["LOCAL_RANK"] == env["OMPI_COMM_WORLD_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0"
    assert (0, "stdout", "line from rank 0") in lines and (1, "stdout", "line from rank 1") in lines
    assert sorted(messages, key=lambda m: m[0]) == [
        (0, {"rank": 0, "note": "hello"}), (1, {"rank": 1, "note": "hello"})
    ]


def _die_in_rank1():
    if os.environ["RANK"] == "1":
        print("rank 1 going down", flush=True)
        os._exit(4)
    time.sleep(120)  # rank 0 ends only when it is stopped after rank 1's failure


def test_mpirun_failure_names_the_rank_that_died_first():
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_function(_die_in_rank1, num_processes=2, launcher=MpirunLauncher(), output=lambda *a: None)
    assert info.value.rank == 1 and info.value.exit_code == 4
    assert "rank 1 going down" in info.value.output_tail
    # the surviving rank 0 was stopped because of rank 1 (mpirun's status is every rank's)
    assert [r for r, _ in info.value.other_failures] == [0], info.value.other_failures
    assert "Other ranks stopped afterwards:\n  rank 0: " in str(info.value), str(info.value)
    # stopped, not left to finish its 120 s sleep: 45 s is far above what stopping it takes on a
    # loaded machine (well under a second unloaded) and far below the sleep
    assert time.monotonic() - started < 45


def _sigkill_in_rank1():
    import signal

    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def test_a_function_rank_killed_by_a_signal_is_named_so_not_with_mpiruns_status():
    # a rank that runs a function is mpirun's own child: mpirun exits 137 for all of them, and
    # only its report says which rank the signal killed
    with pytest.raises(RankFailedError) as info:
        run_function(_sigkill_in_rank1, num_processes=2, launcher=MpirunLauncher(),
                     output=lambda *a: None)
    assert info.value.rank == 1 and info.value.exit_code == -9, str(info.value)
    assert str(info.value).startswith("Rank 1 failed (killed by SIGKILL)"), str(info.value)


def test_mpirun_output_reads_its_report_of_a_signalled_rank():
    output = MpirunOutput()
    assert output.demux("stdout", "[1,2]<stdout>: step 3") == (2, "stdout", "step 3")
    for line in ("-----------", "prterun noticed that process rank 2 with PID 20597 on node vm "
                 "exited on", "signal 9 (Killed).", "-----------"):
        assert output.demux("stderr", line) == (None, "stderr", line)
    output.demux("stderr", "mpirun noticed that process rank 0 with PID 7 on node h1 exited on "
                           "signal 15 (Terminated).")
    assert output.exit_status(2, 137) == -9 and output.exit_status(0, 137) == -15
    assert output.exit_status(1, 137) == 137  # not reported: mpirun's status
    assert output.exit_status(2, 0) == 0


def test_demux_and_command_shape():
    assert demux_tagged("stdout", "[1,3]<stderr>: boom") == (3, "stderr", "boom")
    assert demux_tagged("stderr", "prterun detected a problem") == (None, "stderr", "prterun detected a problem")
    argv = mpirun_command(4, ["python", "x.py"], hosts=[("h1", 2), ("h2", 2)], export=["HOROVOD_TIMELINE"], mpirun="mpirun")
    assert argv[-2:] == ["python", "x.py"]
    assert argv[argv.index("-np") + 1] == "4" and "h1:2,h2:2" in argv
    assert argv[argv.index("-x") + 1] == "HOROVOD_TIMELINE"


def test_mpi_environment_mapping():
    env = from_mpi_environment({
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "DISTRIBUTOR_GPU_IDS": "5,7",
    })
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1"
    assert env["GROUP_WORLD_SIZE"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "5,7"
    assert from_mpi_environment({"PMI_RANK": "0", "PMI_SIZE": "1"})["WORLD_SIZE"] == "1"
    assert from_mpi_environment({}) == {}


def test_an_uneven_host_layout_gives_each_rank_its_hosts_local_rank_and_size():
    from distributor.rank_env import LAYOUT_VAR, hosts_layout

    layout = hosts_layout([("a", 1), ("b", 2)])
    # Open MPI 5 reports the largest host's local size to every rank; the layout wins.
    mpi = {"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", LAYOUT_VAR: layout}
    places = [from_mpi_environment({**mpi, "OMPI_COMM_WORLD_RANK": str(r)}) for r in range(3)]
    assert [(p["RANK"], p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"], p["GROUP_RANK"], p["GROUP_WORLD_SIZE"])
            for p in places] == [("0", "0", "1", "0", "2"), ("1", "0", "2", "1", "2"),
                                 ("2", "1", "2", "1", "2")]


def test_task_hosts_merge_the_tasks_of_one_node():
    from distributor.placement.hosts import host_plan
    from distributor.spec import RankSpec

    def spec(rank, node):
        return RankSpec(rank, 3, 0, 1, node, 2)

    # Tasks 0 and 2 on one host (node 0), task 1 on another: node 0's daemon runs in task 0.
    assert MpirunLauncher.task_hosts([[spec(0, 0)], [spec(1, 1)], [spec(2, 0)]]) == [
        ("task0", 2), ("task1", 1)]
    assert [(s.rank, s.local_rank, s.local_world_size, s.node_rank)
            for s in host_plan([("a", 2), ("b", 4)], 3)] == [(0, 0, 2, 0), (1, 1, 2, 0), (2, 0, 1, 1)]


def test_an_mpirun_over_other_hosts_exports_the_drivers_whole_environment(monkeypatch):
    """mpirun's daemons on other hosts start from their ssh session's environment: a variable
    the driver's environment has (HOROVOD_COMPAT_FROZEN_SECONDS=5 set before horovodrun) must
    be exported too, not only those the job changed; the shell's own variables stay behind."""
    from distributor.rank_env import rank_environment
    from distributor.spec import RankSpec

    monkeypatch.setenv("HOROVOD_COMPAT_FROZEN_SECONDS", "5")
    monkeypatch.setenv("OLDPWD", "/somewhere")
    started = {}

    class Capture:
        def start_group(self, ranks, argv, env, demux, on_exit=None, exit_status=None):
            started.update(argv=argv, env=env)

    specs = [RankSpec(0, 2, 0, 1, 0, 2), RankSpec(1, 2, 0, 1, 1, 2)]
    MpirunLauncher().start_on_hosts(
        specs, [("h1", 1), ("h2", 1)], [],
        lambda spec: rank_environment(spec, "h1", 29500, "run", {"HOROVOD_JOB_VAR": "1"}),
        Capture())
    argv = started["argv"]
    exported = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"}
    assert {"HOROVOD_COMPAT_FROZEN_SECONDS", "HOROVOD_JOB_VAR", "PATH", "MASTER_ADDR"} <= exported
    assert "OLDPWD" not in exported and "RANK" not in exported
    assert started["env"]["HOROVOD_COMPAT_FROZEN_SECONDS"] == "5"


def _rank() -> int:
    return int(os.environ["RANK"])


def test_a_session_directory_left_by_a_killed_mpirun_does_not_stop_a_later_one(tmp_path, monkeypatch):
    """mpirun keeps its session in ``$TMPDIR/ompi.<pid>``; a killed one leaves it there, and a
    later mpirun with the same pid (ids wrap at 32768 on CI's machines) used to stop at once with
    "The PMIx server's listener thread failed to start" (a flaky CI failure). The launcher gives
    each mpirun a session directory of its own, and removes it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
    real = find_mpirun()
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # what a killed mpirun leaves: a copy of a running one's session directory
    subprocess.run([real, *root, "-np", "1", "sh", "-c", 'cp -a "$PMIX_SERVER_TMPDIR" "$TMPDIR/left"'],
                   check=True, timeout=120, capture_output=True)
    assert (tmp_path / "left").is_dir()
    # an mpirun whose pid is the killed one's: the wrapper puts it there, then becomes mpirun
    wrapper = tmp_path / "mpirun"
    wrapper.write_text(f'#!/bin/sh\ncp -a "$TMPDIR/left" "$TMPDIR/ompi.$$"\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    launcher = MpirunLauncher()
    launcher.mpirun = str(wrapper)
    job = Job(LaunchRequest(FunctionTarget(_rank), 2, return_all=True), launcher=launcher,
              output=lambda *a: None)
    assert job.run() == [0, 1]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ompi.")], "the wrapper did not run"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("horovod-compat-mpirun-")]


def test_an_mpirun_that_does_not_start_leaves_no_session_directory(tmp_path, monkeypatch):
    from distributor.spec import RankSpec

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)

    class CannotStart:
        def start_group(self, ranks, argv, env, demux, on_exit=None, exit_status=None):
            assert any(p.name.startswith("horovod-compat-mpirun-") for p in tmp_path.iterdir())
            raise OSError("exec failed")

    with pytest.raises(OSError, match="exec failed"):
        MpirunLauncher().start([RankSpec(0, 1, 0, 1, 0, 1)], lambda spec: {}, CannotStart())
    assert list(tmp_path.iterdir()) == []
