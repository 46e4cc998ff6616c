"""Hosts other than this one: mpirun over ssh, as Horovod does, with this machine under another
name.

There is no ssh server here, so the tests put a stand-in `ssh` first on PATH: it records its
arguments and runs the command on this machine, as ssh to the host "otherhost" would there.
Everything else is real: mpirun decides that "otherhost" is remote and starts its daemon through
that `ssh` (with the -p/-i arguments), the ranks run under it and reach the driver over TCP.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import horovod
from distributor import LaunchValidationError

FAKE_SSH = textwrap.dedent("""\
    #!/bin/sh
    # Stand-in for ssh (tests only): record the arguments, run the command on this machine.
    echo "$@" >> "$FAKE_SSH_LOG"
    while [ $# -gt 0 ]; do
      case "$1" in
        -p|-i|-o|-l|-F|-E|-J|-b|-c|-m) shift 2 ;;
        -*) shift ;;
        *) break ;;
      esac
    done
    if [ "$1" = "unreachable-host" ]; then
      echo "ssh: Could not resolve hostname unreachable-host: Name or service not known" >&2
      exit 255
    fi
    shift
    exec /bin/sh -c "$*"
""")


@pytest.fixture()
def fake_ssh(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    log = tmp_path / "ssh.log"
    log.touch()
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return log, key


def placed():
    import os

    import horovod.torch as hvd

    hvd.init()
    return (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
            os.environ.get("OMPI_COMM_WORLD_RANK"))


def test_horovod_run_across_this_host_and_another_over_ssh(fake_ssh):
    log, key = fake_ssh
    results = horovod.run(placed, num_proc=3, hosts="localhost:1,otherhost:2", ssh_port=2222,
                          ssh_identity_file=str(key))
    # Ranks fill the hosts in order; local ranks count per host.
    assert results == [(0, 3, 0, 1, 0, "0"), (1, 3, 0, 2, 1, "1"), (2, 3, 1, 2, 1, "2")]
    calls = log.read_text().splitlines()
    probes = [c for c in calls if c.startswith("-o BatchMode=yes") and " - 2222 " in c]
    # the reachability check: one ssh that runs the network probe on stdin, toward ssh's port
    assert len(probes) == 1 and f"-p 2222 -i {key} otherhost P=" in probes[0], calls
    daemon = [c for c in calls if "prted" in c]
    assert len(daemon) == 1 and f"-p 2222 -i {key} otherhost " in daemon[0], calls
    assert not any(" localhost " in c for c in calls), "this host was reached over ssh"


def test_horovodrun_with_a_remote_host(fake_ssh, tmp_path):
    log, key = fake_ssh
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('local', os.environ['OMPI_COMM_WORLD_LOCAL_RANK'], "
                      "os.environ['OMPI_COMM_WORLD_LOCAL_SIZE'])\n")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("otherhost slots=2\n")
    done = subprocess.run([sys.executable, "-m", "horovod_compat.run", "-np", "2", "--hostfile",
                           str(hostfile), "-p", "2200", "-i", str(key), sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[0]<stdout>:local 0 2" in done.stdout and "[1]<stdout>:local 1 2" in done.stdout
    assert any(f"-p 2200 -i {key} otherhost" in c and "prted" in c
               for c in log.read_text().splitlines())


def test_an_unreachable_host_fails_before_anything_starts(fake_ssh):
    log, _key = fake_ssh
    with pytest.raises(LaunchValidationError) as info:
        horovod.run(placed, num_proc=2, hosts="localhost:1,unreachable-host:1")
    message = str(info.value)
    assert "unreachable-host: ssh: Could not resolve hostname" in message
    assert "-p" in message and "-i" in message  # says what to check
    assert not any("prted" in c for c in log.read_text().splitlines()), "mpirun was started"


def where_am_i():
    import os

    return os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["JOB_FLAG"], os.getcwd()


def test_one_process_per_worker_local_or_over_ssh(fake_ssh, tmp_path, monkeypatch):
    """Horovod's gloo mode across hosts (what elastic jobs use): this host's worker is a local
    process, the other host's is started by `ssh -o BatchMode=yes host 'cd ... && env ... python
    -m distributor.rank_entry'`."""
    from distributor import run_function
    from distributor.launchers import PythonLauncher
    from distributor.placement import HostsPlacement

    log, key = fake_ssh
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.1 5000 10.0.0.2 22")  # this shell's, not the job's
    placement = HostsPlacement([("localhost", 1), ("otherhost", 1)], ["localhost"], ssh_port=2222,
                               ssh_identity_file=str(key))
    assert placement.worker_hosts(type("R", (), {"num_processes": 2})()) == ["localhost", "otherhost"]
    results = run_function(where_am_i, num_processes=2, return_all=True, env={"JOB_FLAG": "on"},
                           placement=placement, launcher=PythonLauncher(), output=lambda *a: None)
    assert results == [("0", "0", "on", str(tmp_path)), ("1", "0", "on", str(tmp_path))]
    started = [c for c in log.read_text().splitlines() if "distributor.rank_entry" in c]
    assert len(started) == 1, "only the other host's worker goes through ssh"
    assert started[0].startswith(f"-o BatchMode=yes -p 2222 -i {key} otherhost cd ")
    assert "JOB_FLAG=on" in started[0] and "DISTRIBUTOR_RANK=1" in started[0]
    assert " SSH_CONNECTION=" not in started[0]


def grow_to_two():
    import time

    import torch

    import horovod.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(steps=0, at_two=0)

    @hvd.elastic.run
    def train(state):
        while state.at_two < 3:
            size = int(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
            state.at_two += size == 2
            state.steps += 1
            if state.steps > 3000:
                raise RuntimeError("the worker on otherhost never joined")
            time.sleep(0.05)
            state.commit()
        return hvd.rank(), hvd.size()

    return train(state)


def test_elastic_job_adds_a_worker_on_another_host_over_ssh(fake_ssh):
    """horovod.run elastic over -H localhost:1,otherhost:1 with one worker to start: the engine
    fills the other host's slot while the job runs (HostsPlacement.add_worker over ssh)."""
    log, _key = fake_ssh
    results = horovod.run(grow_to_two, num_proc=1, min_num_proc=1, max_num_proc=2,
                          hosts="localhost:1,otherhost:1")
    assert sorted(results) == [(0, 2), (1, 2)]
    started = [c for c in log.read_text().splitlines() if "distributor.rank_entry" in c]
    assert len(started) == 1 and " otherhost cd " in started[0], started
    assert "DISTRIBUTOR_RANK=1" in started[0] and "HOROVOD_ELASTIC=1" in started[0]
