"""Ranks forked from a warm fork server (what a reused Spark Python worker keeps): on this host,
with the launcher told it runs in a reused worker, so each test sees the same code path as a
Spark task without a cluster. The servers preload `json` (cheap) unless a test needs torch."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from distributor import JobTimeoutError, RankFailedError, forkserver, run_function
from distributor.launchers import PythonLauncher
from spark_clusters import alive as _alive


@pytest.fixture(autouse=True)
def no_server_outlives_the_test():
    yield
    for key, server in list(forkserver._servers.items()):
        server.close()
        del forkserver._servers[key]


def warm_launcher(*preload: str) -> PythonLauncher:
    launcher = PythonLauncher(preload=preload or ("json",))
    launcher.in_reused_worker()
    return launcher


def _server_pids():
    return [server._proc.pid for server in forkserver._servers.values()]


def _rank_facts():
    import random

    print(f"out of rank {os.environ['RANK']}")
    os.write(2, f"raw fd 2 of rank {os.environ['RANK']}\n".encode())  # below Python's sys.stderr
    return {
        "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"], "user": os.environ.get("USER_VAR"),
        "private": sorted(k for k in os.environ if k.startswith("DISTRIBUTOR_")),
        "parent": os.getppid(), "pid": os.getpid(), "session": os.getsid(0), "cwd": os.getcwd(),
        "json_loaded": "json" in sys.modules, "random": random.random(), "argv0": sys.argv[0],
        "stdin": os.read(0, 10),
    }


def test_warm_ranks_get_the_rank_contract_output_and_fresh_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = []
    launcher = warm_launcher()
    first = run_function(_rank_facts, num_processes=2, return_all=True, env={"USER_VAR": "u"},
                         launcher=launcher, output=lambda r, s, l: lines.append((r, s, l)))
    second = run_function(_rank_facts, num_processes=2, return_all=True, env={"USER_VAR": "u"},
                          launcher=launcher, output=lambda *a: None)
    (server,) = _server_pids()
    for facts in first + second:
        assert facts["parent"] == server, "ranks are forked by the one warm server, job after job"
        assert facts["session"] == facts["pid"], "each rank leads its own session"
        assert facts["json_loaded"] and facts["private"] == [] and facts["user"] == "u"
        assert facts["cwd"] == str(tmp_path) and facts["argv0"].endswith("rank_entry.py")
        assert facts["stdin"] == b""
    assert [f["rank"] for f in first] == ["0", "1"] and {f["world"] for f in first} == {"2"}
    assert len({f["random"] for f in first + second}) == 4, "forked ranks share a random state"
    for rank in (0, 1):
        assert (rank, "stdout", f"out of rank {rank}") in lines
        assert (rank, "stderr", f"raw fd 2 of rank {rank}") in lines


def test_each_environment_gets_its_own_server_and_the_least_recently_used_goes():
    launcher = warm_launcher()

    def parent(user_var):
        return run_function(_rank_facts, num_processes=1, env={"USER_VAR": user_var},
                            launcher=launcher, output=lambda *a: None)["parent"]

    first, second = parent("a"), parent("b")
    assert first != second and _server_pids() == [first, second]
    assert parent("a") == first, "a worker keeps two servers"
    third = parent("c")  # "b" is now the least recently used
    assert _server_pids() == [first, third] and parent("a") == first
    old = second
    deadline = time.monotonic() + 10
    while _alive(old) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(old)


def _import_time_env():
    import json  # noqa: F401 - preloaded by the server

    return os.environ.get("READ_AT_IMPORT")


def test_the_server_starts_with_the_jobs_environment_for_what_modules_read_at_import():
    facts = run_function(_rank_facts, num_processes=1, env={"USER_VAR": "seen-at-import"},
                         launcher=warm_launcher(), output=lambda *a: None)
    (server,) = _server_pids()
    with open(f"/proc/{server}/environ", "rb") as environ:
        startup = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
    assert startup[b"USER_VAR"] == b"seen-at-import" and startup[b"PYTHONUNBUFFERED"] == b"1"
    assert b"RANK" not in startup and b"MASTER_PORT" not in startup, "per-job variables stay out"
    assert not any(name.startswith(b"DISTRIBUTOR_") for name in startup), "no secret in the server"
    assert facts["parent"] == server


def test_a_preload_that_fails_falls_back_to_plain_processes():
    facts = run_function(_rank_facts, num_processes=1, launcher=warm_launcher("no_such_module_xyz"),
                         output=lambda *a: None)
    assert facts["parent"] == os.getpid(), "started by the supervisor itself"


def _fail(how):
    if how == "raise" and os.environ["RANK"] == "1":
        print("last words", flush=True)
        raise KeyError("rank one is missing a key")
    if how == "exit":
        sys.exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)


def test_a_failing_warm_rank_reports_its_traceback_and_output():
    lines = []
    with pytest.raises(RankFailedError) as info:
        run_function(_fail, "raise", num_processes=2, launcher=warm_launcher(),
                     output=lambda r, s, l: lines.append((r, l)))
    assert info.value.rank == 1 and info.value.exc_type == "KeyError"
    assert "rank one is missing a key" in info.value.traceback and "_fail" in info.value.traceback
    assert (1, "last words") in lines


@pytest.mark.parametrize("how,code", [("exit", 3), ("kill", -signal.SIGKILL)])
def test_exit_statuses_of_warm_ranks_are_reported(how, code):
    with pytest.raises(RankFailedError) as info:
        run_function(_fail, how, num_processes=1, launcher=warm_launcher(), output=lambda *a: None)
    assert info.value.exit_code == code


def _pid_then_hang():
    print(f"PID {os.getpid()}", flush=True)
    time.sleep(300)


def test_a_timed_out_job_stops_its_warm_ranks():
    pids = []
    with pytest.raises(JobTimeoutError):
        run_function(_pid_then_hang, num_processes=2, timeout=3, launcher=warm_launcher(),
                     output=lambda r, s, l: pids.append(int(l.split()[1])) if l.startswith("PID") else None)
    assert len(pids) == 2 and not [p for p in pids if _alive(p)]


def test_ranks_die_with_their_server_and_are_reported_killed():
    launcher = warm_launcher()
    pids = []

    def close_server_once_started(rank, stream, line):
        if line.startswith("PID"):
            pids.append(int(line.split()[1]))
            if len(pids) == 1:
                next(iter(forkserver._servers.values())).close()  # what the worker's death does

    with pytest.raises(RankFailedError) as info:
        run_function(_pid_then_hang, num_processes=1, launcher=launcher, start_timeout=60,
                     output=close_server_once_started)
    assert info.value.exit_code == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids[0])


def _torch_state():
    import gc
    import weakref

    already = "torch" in sys.modules
    import torch.library

    mine = torch.library.Library("forkserver_test", "DEF")  # noqa: F841 - a rank's own library
    teardowns = [obj.atexit for obj in gc.get_objects() if type(obj) is weakref.finalize
                 and (obj.peek() or (None, None))[1] is torch.library._del_library]
    return already, len(teardowns), sum(teardowns)


def test_torch_is_imported_once_per_server_not_per_rank():
    pytest.importorskip("torch")
    already, teardowns, at_exit = run_function(_torch_state, num_processes=1,
                                               launcher=warm_launcher("torch"), output=lambda *a: None)
    assert already and teardowns > 1
    assert at_exit == 1, "only the rank's own library deregisters at exit, not the preloaded ones"
    already, teardowns, at_exit = run_function(_torch_state, num_processes=1, output=lambda *a: None)
    assert not already and at_exit == teardowns, "a plain rank is left as it is"


def test_the_servers_environment_drops_exactly_what_torchrun_sets_per_job():
    from distributor.rank_env import TORCHRUN_VARS, torchrun_env
    from distributor.spec import RankSpec

    spec = RankSpec(rank=1, world_size=2, local_rank=0, local_world_size=1, node_rank=1,
                    num_nodes=2, gpu_ids=("0",))
    assert set(torchrun_env(spec, "127.0.0.1", 1234, "run")) - {"PYTHONUNBUFFERED"} == set(TORCHRUN_VARS)


def _import_colorsys():
    already = "colorsys" in sys.modules
    import colorsys  # noqa: F401 - what the server learns

    return already, os.getppid()


def test_a_worker_server_learns_what_its_ranks_imported_for_the_next_job(monkeypatch):
    """`forkserver.LEARNED` (TensorFlow in production; a cheap module here): the first job's
    ranks import it themselves, the server imports it when the next job's first spawn request
    comes, and that job's ranks are forked with it. Deterministic: a rank reports before it
    exits, and the server reads the reports and imports before it forks."""
    monkeypatch.setattr(forkserver, "LEARNED", ("colorsys",))
    launcher = warm_launcher()
    first = run_function(_import_colorsys, num_processes=2, return_all=True, launcher=launcher,
                         output=lambda *a: None)
    second = run_function(_import_colorsys, num_processes=2, return_all=True, launcher=launcher,
                          output=lambda *a: None)
    (server,) = _server_pids()
    assert {parent for _, parent in first + second} == {server}
    assert [already for already, _ in first] == [False, False], "not preloaded before a rank needs it"
    assert [already for already, _ in second] == [True, True], "learned from the first job"


def test_a_server_learns_only_what_a_rank_imported_and_a_jobs_own_server_nothing(monkeypatch):
    monkeypatch.setattr(forkserver, "LEARNED", ("colorsys",))
    launcher = warm_launcher()
    run_function(_rank_facts, num_processes=1, launcher=launcher, output=lambda *a: None)
    already, _ = run_function(_import_colorsys, num_processes=1, launcher=launcher,
                              output=lambda *a: None)
    assert not already, "no rank of the first job imported it: nothing to learn"
    job_server = forkserver.ForkServer(sys.executable, ("json",), dict(os.environ), os.getcwd())
    try:
        assert not [arg for arg in job_server._proc.args if arg.startswith(forkserver.LEARN_MARK)], \
            "a job's own server (PythonLauncher.keep_warm) has no later job to learn for"
    finally:
        job_server.close()


def _train_one_step():
    already = "torch._dynamo" in sys.modules
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # torch imports torch._dynamo here
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    return already, "torch._dynamo" in sys.modules


def test_a_torch_server_learns_the_dynamo_that_a_ranks_first_optimizer_imports():
    """The production `LEARNED`: torch imports torch._dynamo lazily, at a rank's first optimizer
    (about 1 s of CPU per rank); the worker's server learns it from the first job."""
    pytest.importorskip("torch")
    launcher = warm_launcher("torch")
    first = run_function(_train_one_step, num_processes=1, launcher=launcher, output=lambda *a: None)
    second = run_function(_train_one_step, num_processes=1, launcher=launcher, output=lambda *a: None)
    assert first == (False, True), "the first job's rank imports it itself, at its optimizer"
    assert second == (True, True), "the next job's rank is forked with it"
