"""Horovod's elastic launch arguments → the engine's ElasticPolicy, and the discovery script
wrapper. No rank is started here (the discovery scripts are real processes)."""
from __future__ import annotations

import sys

import pytest

from horovod_compat.launch.discovery import DiscoveryScript, HostDiscoveryError
from horovod_compat.launch.elastic import UNBOUNDED_WORKERS, FixedHosts, elastic_args
from horovod_compat.launch.job import HorovodJob
from horovod_compat.run import plan


def make_script(tmp_path, body, name="discover.sh"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_horovodrun_elastic_flags_build_the_policy(tmp_path, monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC_TIMEOUT", raising=False)
    script = make_script(tmp_path, "echo localhost:2\necho\necho 127.0.0.1\n")
    job, target, _ = plan(["-np", "2", "--min-np", "1", "--max-np", "3",
                           "--host-discovery-script", script, "--slots", "4", "--reset-limit", "5",
                           "--elastic-timeout", "30", "--blacklist-cooldown-range", "2", "20",
                           sys.executable, "train.py"])
    policy = job.elastic
    assert (policy.min_workers, policy.max_workers, policy.reset_limit) == (1, 3, 5)
    assert policy.elastic_timeout == 30 and policy.cooldown_range == (2, 20)
    assert isinstance(policy.discovery, DiscoveryScript)
    assert policy.discovery() == {"localhost": 2, "127.0.0.1": 4}  # --slots for a bare host name
    assert job.hosts == [("localhost", 2)] and not job.use_mpi
    assert job.env["HOROVOD_ELASTIC"] == "1"
    # the script runs inside each worker, whose Python is the command's
    assert target.path == "train.py" and target.argv == () and job.executable == sys.executable


def test_horovods_defaults_min_np_is_np_no_max_and_the_elastic_timeout_variable(monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC_TIMEOUT", raising=False)
    job, _, _ = plan(["-np", "2", "--min-np", "2", sys.executable, "x.py"])
    assert job.elastic.min_workers == 2 and job.elastic.max_workers == UNBOUNDED_WORKERS
    assert job.elastic.elastic_timeout == 600 and job.elastic.reset_limit is None
    assert isinstance(job.elastic.discovery, FixedHosts)
    assert job.elastic.discovery() == {"localhost": 2}
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "42")
    job, _, _ = plan(["-np", "1", "--min-np", "1", "-H", "localhost:1,127.0.0.1:2",
                      sys.executable, "x.py"])
    assert job.elastic.elastic_timeout == 42
    assert job.elastic.discovery() == {"localhost": 1, "127.0.0.1": 2}  # Horovod's FixedHosts
    plain, _, _ = plan(["-np", "2", "--max-np", "4", sys.executable, "x.py"])
    assert plain.elastic is None and "HOROVOD_ELASTIC" not in plain.env  # Horovod's rule


def test_horovod_run_arguments_map_the_same_way(tmp_path):
    script = make_script(tmp_path, "echo localhost:3\n")
    elastic = elastic_args(2, min_num_proc=1, max_num_proc=3, slots=None, reset_limit=2,
                           cooldown_range=None, host_discovery_script=script)
    job = HorovodJob.create(2, elastic=elastic)
    assert (job.elastic.min_workers, job.elastic.max_workers, job.elastic.reset_limit) == (1, 3, 2)
    assert job.hosts == [("localhost", 2)] and job.elastic.discovery() == {"localhost": 3}
    assert elastic_args(2, min_num_proc=None, max_num_proc=4) is None


@pytest.mark.parametrize("argv, message", [
    (["--min-np", "1", "--mpi"], "elastic training runs in Horovod's gloo mode"),
    (["--min-np", "0"], "min_num_proc must be an int >= 1"),
    (["--min-np", "3"], "smaller than min_num_proc"),
    (["--min-np", "1", "--reset-limit", "-1"], "reset_limit must be an int >= 0"),
    (["--min-np", "1", "--elastic-timeout", "0"], "elastic_timeout must be an int >= 1"),
    (["--min-np", "1", "--blacklist-cooldown-range", "9", "3"], "cooldown_range"),
    (["--host-discovery-script", "/no/such/script"], "does not exist"),
    (["--min-np", "1", "--", "true"], "an elastic job runs 'python script.py ARGS...' commands"),
])
def test_bad_elastic_command_lines_fail_before_anything_starts(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        plan(["-np", "2", *argv] + ([] if "--" in argv else [sys.executable, "x.py"]))
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_discovery_script_offering_too_few_slots_fails_after_the_elastic_timeout(tmp_path, capsys):
    script = make_script(tmp_path, "echo localhost:1\n")
    with pytest.raises(SystemExit):
        plan(["-np", "2", "--host-discovery-script", script, "--elastic-timeout", "1",
              sys.executable, "x.py"])
    err = capsys.readouterr().err
    assert "offered localhost:1 (1 slot(s)) for 1s, fewer than the 2 processes" in err


def test_discovery_errors_name_the_script_and_the_bad_line(tmp_path):
    bare = DiscoveryScript(make_script(tmp_path, "echo host-a:2\necho host-b\n"))
    with pytest.raises(HostDiscoveryError, match=r"discover.sh', output line 2: 'host-b' gives no "
                                                 r"slot count; print 'hostname:slots' or pass --slots"):
        bare()
    junk = DiscoveryScript(make_script(tmp_path, "echo 'host a:2'\n"))
    with pytest.raises(HostDiscoveryError, match=r"output line 1: 'host a:2' is not 'hostname:slots'"):
        junk()
    twice = DiscoveryScript(make_script(tmp_path, "echo h:2\necho h:3\n"))
    with pytest.raises(HostDiscoveryError, match="lists 'h' twice with different slot counts"):
        twice()
    failing = DiscoveryScript(make_script(tmp_path, "echo 'cloud API down' >&2\nexit 3\n"))
    with pytest.raises(HostDiscoveryError, match="exited with status 3:\n  cloud API down"):
        failing()
    slow = DiscoveryScript(make_script(tmp_path, "exec sleep 30\n"), timeout=0.5)
    with pytest.raises(HostDiscoveryError, match="did not finish within 0.5s"):
        slow()
    assert DiscoveryScript(make_script(tmp_path, "true\n"))() == {}, "no host available now"


def test_the_driver_listens_on_loopback_only_when_no_other_machine_can_take_part(tmp_path):
    from distributor import FunctionTarget, LaunchRequest
    from distributor.elastic.policy import ElasticPolicy
    from distributor.placement import HostsPlacement

    job, _, _ = plan(["-np", "2", "--min-np", "1", "-H", "localhost:2", sys.executable, "t.py"])
    placement = job._placement()
    assert placement.hub_bind_host == "127.0.0.1" and placement.store_host() == "127.0.0.1"
    # a discovery script may add another machine while the job runs: every interface
    script = make_script(tmp_path, "echo localhost:2\n")
    job, _, _ = plan(["-np", "2", "--min-np", "1", "--host-discovery-script", script,
                      sys.executable, "t.py"])
    assert job._placement().hub_bind_host == "0.0.0.0"
    # so may a host of -H that the first workers do not use
    job, _, _ = plan(["-np", "1", "--min-np", "1", "-H", "localhost:1,otherhost:1",
                      sys.executable, "t.py"])
    assert job.hosts == [("localhost", 1)] and job._placement().hub_bind_host == "0.0.0.0"
    assert HostsPlacement([("localhost", 1), ("otherhost", 1)], ["localhost"]).hub_bind_host == "0.0.0.0"
    # the engine's own default: an elastic job may be offered any host
    placement = HostsPlacement([("localhost", 2)], ["localhost"])
    placement.validate(LaunchRequest(FunctionTarget(print), 2, elastic=ElasticPolicy(min_workers=1, max_workers=2)))
    assert placement.hub_bind_host == "0.0.0.0"
    placement = HostsPlacement([("localhost", 2)], ["localhost"])
    placement.validate(LaunchRequest(FunctionTarget(print), 2))
    assert placement.hub_bind_host == "127.0.0.1"
