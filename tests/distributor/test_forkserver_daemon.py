"""The fork server shared by launches (`distributor.forkserver_daemon`): reuse across launches,
learning, staleness, whom it serves, idleness, and a closed launch's ranks. Each test has its own
private directory and stops the daemons it started, by the PIDs of their pid files. Learning is
checked with a cheap stand-in for torch/TensorFlow (`fractions`, or a module of the test's own)."""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest

import procs

from distributor import forkserver_daemon, protocol, run_function
from distributor.errors import LaunchValidationError
from distributor.forkserver_daemon import DaemonSettings
from distributor.launchers import PythonLauncher
from distributor.rank_env import HUB_ADDRESS_VAR, RANK_VAR, SECRET_VAR


_daemon_pids = forkserver_daemon.server_pids
_alive = procs.alive


def _wait_gone(pid: int, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.fixture
def warm_dir(tmp_path, monkeypatch):
    directory = tmp_path / "warm"
    directory.mkdir(mode=0o700)
    monkeypatch.setattr(forkserver_daemon, "LEARNED", ("fractions", "warm_probe"))
    (tmp_path / "warm_probe.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    yield directory
    pids = _daemon_pids(directory)
    procs.stop_warm_servers_in(str(directory))
    assert not any(_alive(pid) for pid in pids), "a daemon did not stop on SIGTERM"
    assert _daemon_pids(directory) == [], "and it removed its pid file"


def _launch(directory, fn, *args, env=None, n=2, **settings):
    launcher = PythonLauncher(across_launches=DaemonSettings(directory=str(directory), **settings))
    return run_function(fn, *args, num_processes=n, return_all=True, env=env or {},
                        launcher=launcher, output=lambda *a: None)


def _facts(imports=()):
    import importlib

    facts = {"parent": os.getppid(), "pid": os.getpid(), "cwd": os.getcwd(), "path0": sys.path[0],
             "had": sorted(n for n in ("fractions", "warm_probe") if n in sys.modules),
             "session": os.getsid(0), "rank": os.environ["RANK"]}
    for name in imports:
        importlib.import_module(name)
    return facts


def test_launches_share_one_daemon_that_learns_what_their_ranks_imported(warm_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = _launch(warm_dir, _facts, ("fractions",))
    (daemon,) = _daemon_pids(warm_dir)
    second = _launch(warm_dir, _facts)
    assert {f["parent"] for f in first + second} == {daemon}, "both launches fork from one daemon"
    assert [f["rank"] for f in second] == ["0", "1"]
    assert all(f["had"] == [] for f in first), "the daemon starts with nothing learned"
    assert all(f["had"] == ["fractions"] for f in second), "a module a rank imported is learned"
    for facts in first + second:
        assert facts["session"] == facts["pid"] and facts["cwd"] == str(tmp_path)
        assert facts["path0"] == str(tmp_path), "the launch's directory first, as python -m puts it"
    assert _alive(daemon), "the daemon stays after its launches"


def test_a_daemon_started_for_a_launch_imports_what_it_expects_before_forking(warm_dir, tmp_path,
                                                                            monkeypatch):
    """`expect`: the first launch's ranks fork with the expected learned module imported; a name
    outside `LEARNED` is not imported; the expectation is no part of the daemon's key."""
    monkeypatch.chdir(tmp_path)
    first = _launch(warm_dir, _facts, expect=("warm_probe", "json.tool"))
    (daemon,) = _daemon_pids(warm_dir)
    assert all(f["had"] == ["warm_probe"] for f in first), first
    assert all(f["parent"] == daemon for f in first)
    second = _launch(warm_dir, _facts, expect=("fractions",))  # an existing daemon: its key's
    assert {f["parent"] for f in second} == {daemon} and all(f["had"] == ["warm_probe"] for f in second)
    with pytest.raises(LaunchValidationError, match="expect"):
        DaemonSettings(expect=["torch"])


@pytest.mark.parametrize("source, modules", [
    ("import a.b, c\nfrom d import e, f as g\nfrom . import h\nfrom .i import j\n",
     {"a.b", "c", "d", "d.e", "d.f"}),
    ("def late():\n    import torch\n    from horovod import torch as hvd\n",
     {"torch", "horovod", "horovod.torch"}),
    ("from m import *\n", {"m"}),
    ("def broken(:\n", set()),
])
def test_the_modules_a_script_imports_are_read_off_it(tmp_path, source, modules):
    script = tmp_path / "script.py"
    script.write_text(source)
    assert forkserver_daemon.imported_modules(str(script)) == modules
    assert forkserver_daemon.imported_modules(str(tmp_path / "missing.py")) == frozenset()


def test_each_launch_runs_in_its_own_working_directory(warm_dir, tmp_path, monkeypatch):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        facts = _launch(warm_dir, _facts, n=1)
        assert facts[0]["cwd"] == facts[0]["path0"] == str(tmp_path / name)
    assert len(_daemon_pids(warm_dir)) == 1


def test_another_environment_gets_another_daemon_but_volatile_variables_do_not(warm_dir):
    one = _launch(warm_dir, _facts, env={"OMP_NUM_THREADS": "1", "PWD": "/x"}, n=1)
    same = _launch(warm_dir, _facts, env={"OMP_NUM_THREADS": "1", "PWD": "/y"}, n=1)
    other = _launch(warm_dir, _facts, env={"OMP_NUM_THREADS": "2"}, n=1)
    assert one[0]["parent"] == same[0]["parent"] != other[0]["parent"]
    assert len(_daemon_pids(warm_dir)) == 2


def test_a_changed_module_file_makes_the_daemon_stale_and_the_next_launch_starts_a_fresh_one(
        warm_dir, tmp_path):
    first = _launch(warm_dir, _facts, ("warm_probe",), n=1)
    second = _launch(warm_dir, _facts, n=1)
    assert second[0]["had"] == ["warm_probe"] and second[0]["parent"] == first[0]["parent"]
    old = first[0]["parent"]
    probe = tmp_path / "warm_probe.py"
    probe.write_text("VALUE = 2\n")
    os.utime(probe, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new mtime, however coarse
    third = _launch(warm_dir, _facts, n=1)
    assert third[0]["parent"] != old and third[0]["had"] == [], "a fresh daemon, nothing learned"
    assert _wait_gone(old), "the stale daemon ends once its launches have"
    assert _daemon_pids(warm_dir) == [third[0]["parent"]]


def test_an_idle_daemon_exits_and_the_next_launch_starts_another(warm_dir):
    first = _launch(warm_dir, _facts, n=1, idle_seconds=0.5)
    assert _wait_gone(first[0]["parent"]), "the daemon exits after its idle seconds"
    assert _daemon_pids(warm_dir) == [], "and removes its pid file"
    second = _launch(warm_dir, _facts, n=1, idle_seconds=0.5)
    assert second[0]["parent"] != first[0]["parent"]


def _connect_raw(directory):
    (path,) = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".sock")]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(30)
    sock.connect(path)
    return sock


def test_a_connection_without_the_secret_is_closed_and_forks_nothing(warm_dir):
    _launch(warm_dir, _facts, n=1)
    (daemon,) = _daemon_pids(warm_dir)
    for first in (b"x" * protocol.REPLY_BYTES, json.dumps({"env": {}}).encode()):
        sock = _connect_raw(warm_dir)
        assert len(sock.recv(4096)) == 32, "the daemon's challenge"
        sock.send(first)
        assert sock.recv(4096) == b"", "closed without an answer"
        sock.close()
    assert _alive(daemon)
    children = [p for p in os.listdir("/proc") if p.isdigit() and procs.parent(int(p)) == daemon]
    assert children == [], "nothing was forked"


def test_a_directory_others_can_open_is_not_used(tmp_path):
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o755)
    facts = _launch(directory, _facts, n=1)
    assert facts[0]["parent"] == os.getpid(), "the rank was a plain process of this launch"
    assert forkserver_daemon.connect(sys.executable, dict(os.environ),
                                     DaemonSettings(directory=str(directory))) is None
    assert not any(n.endswith(".sock") for n in os.listdir(directory)), "no daemon started there"


def test_the_ranks_of_a_closed_connection_are_killed(warm_dir):
    hub = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: the rank waits
    try:
        server = forkserver_daemon.connect(sys.executable, dict(os.environ),
                                           DaemonSettings(directory=str(warm_dir)))
        assert server is not None and server.usable
        env = {**os.environ, HUB_ADDRESS_VAR: f"127.0.0.1:{hub.getsockname()[1]}",
               SECRET_VAR: "00" * 32, RANK_VAR: "0"}
        rank = server.spawn(env, os.getcwd())
        conn, _ = hub.accept()  # the rank is up and waiting for the hub's answer
        assert _alive(rank.pid)
        server.close()
        assert _wait_gone(rank.pid), "the daemon killed the closed launch's rank"
        (daemon,) = _daemon_pids(warm_dir)
        assert _alive(daemon)
        conn.close()
    finally:
        hub.close()


def test_settings_are_checked():
    for bad in (0, -1, float("inf"), True, "5"):
        with pytest.raises(LaunchValidationError, match="idle_seconds"):
            DaemonSettings(bad)


@pytest.mark.parametrize("source, sets", [
    ("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n", True),
    ("import os\nos.environ.update(A='1')\n", True),
    ("from os import environ\nenviron.setdefault('A', '1')\n", True),
    ("import os\nos.putenv('A', '1')\n", True),
    ("import os\ndel os.environ['A']\n", True),
    ("def broken(:\n", True),
    ("import os\nrank = int(os.environ['RANK'])\nhome = os.environ.get('HOME')\n", False),
    ("import os\nenv = dict(os.environ)\nenv['A'] = '1'\n", False),
])
def test_scripts_that_set_environment_variables_are_recognised(tmp_path, source, sets):
    script = tmp_path / "script.py"
    script.write_text(source)
    assert forkserver_daemon.sets_environment(str(script)) is sets


def test_the_file_of_python_dash_m_is_found_without_importing(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "pkg" / "__main__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text("")
    find = forkserver_daemon.module_file
    assert find("pkg", str(tmp_path)) == str(tmp_path / "pkg" / "__main__.py")
    assert find("pkg.tool", str(tmp_path)) == str(tmp_path / "pkg" / "tool.py")
    assert find("pkg.missing", str(tmp_path)) is None and find("nothing_here", str(tmp_path)) is None
    assert "pkg" not in sys.modules


def _sets_threads():
    os.environ["OMP_NUM_THREADS"] = "1"


def _reads_rank():
    return int(os.environ["RANK"])


def test_functions_that_set_environment_variables_are_recognised():
    assert forkserver_daemon.function_sets_environment(_sets_threads)
    assert not forkserver_daemon.function_sets_environment(_reads_rank)
    assert forkserver_daemon.function_sets_environment(len), "no source: taken to set them"
