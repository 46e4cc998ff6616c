"""Elastic jobs on the engine: real worker processes, plain torch.distributed (gloo).

The target (`_train`) is what an elastic training loop does without Horovod: join the world,
init a process group on the job's c10d store under the round's prefix, sync the committed state
from rank 0, and train; a failed collective rolls back to the last commit, destroys the group
and joins the next round; a HOSTS_UPDATED notice makes every worker commit and re-join at the
same step. Each step adds step+1 (an allreduce of step+1 from every worker, divided by the world
size) to a total committed after the step, so the final total is exact only if every step was
counted exactly once, whatever the world size was.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from distributor import (
    DistributedRunError,
    ElasticJobFailedError,
    ElasticPolicy,
    ElasticTimeoutError,
    FunctionTarget,
    LaunchRequest,
    LaunchValidationError,
    run_function,
)
from distributor.elastic.job import ElasticJob
from distributor.elastic.rendezvous import Rounds, assign_ranks
from distributor.elastic.world import HostUpdate
from distributor.placement import LocalPlacement
from distributor.worker_state import IllegalTransition, WorkerState, check_transition
from spark_clusters import alive

STEPS = 12


def _expected(steps: int = STEPS) -> float:
    return steps * (steps + 1) / 2


def _train(steps=STEPS, kill=None, raise_at=None, pid_file=None, signal_file=None,
           signal_at=None, until_size=None, step_sleep=0.02):
    """kill: {worker id: step} SIGKILLs that worker at its first step >= that step.
    raise_at: (rank, step) raises ValueError there (in any round).
    signal_file/signal_at: worker 0 writes json `signal_file[1]` to `signal_file[0]` at that step.
    until_size: after `steps`, keep stepping (without changing the total) until the world has
    that many workers, then finish."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from distributor import worker

    me = worker.worker_id()
    if pid_file:
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    updates, heard = [], []
    worker.add_hosts_listener(lambda ts, update: (updates.append(int(update)), heard.append(int(update))))
    committed = {"step": 0, "total": 0.0}
    client = None
    sizes = []
    while True:
        world = worker.join_world(timeout=60)
        if client is None:
            client = dist.TCPStore(world.store_host, world.store_port, is_master=False,
                                   timeout=timedelta(seconds=30))
        dist.init_process_group("gloo", store=dist.PrefixStore(world.store_prefix, client),
                                rank=world.rank, world_size=world.size, timeout=timedelta(seconds=30))
        sizes.append(world.size)
        state = dict(committed)
        try:
            t = torch.tensor([state["step"], state["total"]], dtype=torch.float64)
            dist.broadcast(t, 0)  # sync: rank 0 holds the committed state
            state = committed = {"step": int(t[0]), "total": float(t[1])}
            while True:
                done = state["step"] >= steps
                if done and (until_size is None or world.size >= until_size):
                    dist.destroy_process_group()
                    return {"total": state["total"], "step": state["step"], "size": world.size,
                            "rank": world.rank, "round": world.round, "cross_size": world.cross_size,
                            "worker": me, "sizes": sizes, "heard": heard}
                if kill and me in kill and state["step"] >= kill[me]:
                    os.kill(os.getpid(), signal.SIGKILL)
                if raise_at and world.rank == raise_at[0] and state["step"] == raise_at[1]:
                    raise ValueError(f"bad batch at step {state['step']}")
                if signal_file and me == 0 and state["step"] == signal_at:
                    with open(signal_file[0], "w") as f:
                        json.dump(signal_file[1], f)
                x = torch.tensor([0.0 if done else state["step"] + 1.0, float(len(updates))],
                                 dtype=torch.float64)
                dist.all_reduce(x)
                if not done:
                    state = committed = {"step": state["step"] + 1,
                                         "total": state["total"] + float(x[0]) / world.size}
                time.sleep(step_sleep)
                if x[1] > 0:  # some worker heard of new hosts: all re-join at this same step
                    updates.clear()
                    dist.destroy_process_group()
                    break
        except RuntimeError:  # a peer is gone: roll back to the last commit and re-join
            dist.destroy_process_group()
            updates.clear()


@pytest.fixture
def no_leftovers(tmp_path):
    """Yields a file every worker writes its PID to; afterwards no worker may still run (the
    suite's conftest checks the test's own children: the fork server, plain workers)."""
    pid_file = str(tmp_path / "pids")
    yield pid_file
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pids = [int(p) for p in open(pid_file).read().split()] if os.path.exists(pid_file) else []
        left = [p for p in pids if alive(p)]  # forked workers are the fork server's children
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"processes left running: {left}"
    assert pids, "the workers did not record their PIDs"


def _job(n, policy, placement=None, **target):
    request = LaunchRequest(FunctionTarget(_train, (), target), n, elastic=policy, start_timeout=120,
                            timeout=240)  # a hang fails the test instead of blocking the suite
    return ElasticJob(request, placement or LocalPlacement())


# ---- with processes ---------------------------------------------------------------------------
def test_killed_worker_shrinks_then_replacement_joins(no_leftovers):
    # worker 1 dies at step 4: the 2 others go on at once (min 2); its replacement joins the
    # round they form if it is quick enough, else the next one (HOSTS_UPDATED)
    job = _job(3, ElasticPolicy(2, 3), kill={1: 4}, pid_file=no_leftovers, until_size=3)
    result = job.run()
    assert result["total"] == _expected() and result["step"] == STEPS
    assert result["size"] == 3 and result["worker"] == 0, result
    assert len(job.attempts) == 1
    assert "worker 1" in job.attempts[0].cause and "SIGKILL" in job.attempts[0].cause
    assert "replacement worker 3" in job.attempts[0].action
    assert "2 other worker(s) go on without waiting" in job.attempts[0].action


def _no_rounds(value, pid_file):
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    return value * 10 + int(os.environ["RANK"])


def test_workers_that_never_join_a_round_end_the_job_with_their_values(no_leftovers):
    """A function that never joins a round (no hvd.init() in it) ran forever before: the job
    waited for a round that no worker would form. Every worker ended: that is the job's end."""
    request = LaunchRequest(FunctionTarget(_no_rounds, (7, no_leftovers), {}), 2, elastic=ElasticPolicy(1, 2),
                            start_timeout=120, timeout=60, return_all=True)
    assert ElasticJob(request, LocalPlacement()).run() == [70, 71]


def test_min_equals_n_waits_for_the_replacement(no_leftovers):
    result = run_function(_train, num_processes=2, elastic=ElasticPolicy(2, 2), kill={0: 3},
                          pid_file=no_leftovers, return_all=True)
    assert [r["total"] for r in result] == [_expected()] * 2
    assert sorted(r["worker"] for r in result) == [1, 2]  # worker 2 replaced worker 0
    assert all(r["sizes"][-1] == 2 and 1 not in r["sizes"] for r in result)
    assert result[0]["worker"] == 1 and result[0]["rank"] == 0  # the survivor keeps rank 0


def test_shrink_without_replacement_while_the_host_cools_down(no_leftovers):
    job = _job(3, ElasticPolicy(2, 3, cooldown_range=(120, 120)), kill={2: 3}, pid_file=no_leftovers)
    result = job.run()
    assert result["total"] == _expected() and result["size"] == 2
    assert "cools down" in job.attempts[0].action


def test_same_exception_at_same_place_is_not_retried(no_leftovers):
    job = _job(2, ElasticPolicy(2, 2), raise_at=(1, 5), pid_file=no_leftovers)
    with pytest.raises(ElasticJobFailedError) as info:
        job.run()
    message = str(info.value)
    assert "ValueError was raised again" in message
    assert "bad batch at step 5" in message
    assert "Traceback" in message and "raise ValueError" in message  # the worker's own traceback
    assert info.value.root_cause is not None and info.value.root_cause.exc_type == "ValueError"
    assert len(info.value.attempts) == 2


def test_reset_limit_exhausted_lists_every_attempt(no_leftovers):
    # worker 1 dies (reset 1, shrink); its replacement, worker 2, dies at its first step
    job = _job(2, ElasticPolicy(1, 2, reset_limit=1), kill={1: 2, 2: 0}, pid_file=no_leftovers,
               steps=200)
    with pytest.raises(ElasticJobFailedError) as info:
        job.run()
    message = str(info.value)
    assert "reset_limit=1" in message and "raise reset_limit" in message
    assert "reset 1: worker 1" in message and "reset 2: worker 2" in message
    assert message.count("killed by SIGKILL") >= 2
    assert [a.number for a in info.value.attempts] == [1, 2]


def test_elastic_timeout_when_no_replacement_can_come(no_leftovers):
    job = _job(2, ElasticPolicy(2, 2, elastic_timeout=2, cooldown_range=(300, 300)), kill={1: 2},
               pid_file=no_leftovers, steps=200)
    with pytest.raises(ElasticTimeoutError) as info:
        job.run()
    message = str(info.value)
    assert "elastic_timeout" in message and "min_workers=2" in message
    assert "worker 1" in message and "cools down" in message


def test_discovery_adds_a_host_and_its_worker_joins(no_leftovers, tmp_path):
    hosts_file = tmp_path / "hosts.json"
    hosts_file.write_text(json.dumps({"host-a": 2}))

    def discover():
        return json.loads(hosts_file.read_text())

    policy = ElasticPolicy(2, 3, discovery=discover, discovery_interval=0.2)
    job = _job(2, policy, LocalPlacement({"host-a": 2}), pid_file=no_leftovers, until_size=3,
               signal_file=(str(hosts_file), {"host-a": 2, "host-b": 1}), signal_at=3)
    result = job.run()
    assert result["total"] == _expected() and result["size"] == 3 and result["cross_size"] == 2
    assert result["heard"] == [int(HostUpdate.ADDED)]  # rank 0 was told, and re-joined
    assert job.attempts == []  # a host change is no failure
    assert job._states[2].host == "host-b"


class _NoReplacements(LocalPlacement):
    """Starts the first workers; adding any later one fails (a host that refuses a new worker)."""

    def add_worker(self, worker_id, host):
        if worker_id >= 2:
            raise OSError("this host refuses new workers")
        return super().add_worker(worker_id, host)


@pytest.mark.timeout(120)
def test_a_placement_that_fails_to_add_a_worker_fails_the_job_instead_of_hanging(no_leftovers):
    job = _job(2, ElasticPolicy(2, 2), _NoReplacements(), kill={1: 2}, pid_file=no_leftovers,
               steps=200)
    t0 = time.monotonic()
    with pytest.raises(DistributedRunError, match="could not start worker 2 on host .*: this host "
                                                   "refuses new workers"):
        job.run()
    assert time.monotonic() - t0 < 60  # the job's own timeout (240 s) did not end it


def test_placement_that_cannot_add_workers_is_refused_before_anything_starts():
    from distributor.launchers import MpirunLauncher

    request = LaunchRequest(FunctionTarget(_train, (), {}), 2, elastic=ElasticPolicy(1, 2))
    with pytest.raises(LaunchValidationError, match="adds workers while the job runs"):
        ElasticJob(request, LocalPlacement(), MpirunLauncher()).run()


# ---- pure -------------------------------------------------------------------------------------
def test_rank_assignment_survivors_first_then_newcomers_by_id():
    worlds = assign_ranks([(4, "b"), (1, "a"), (0, "b")], [(7, "a"), (5, "c")], 3, "h", 99)
    assert [worlds[w].rank for w in (4, 1, 0, 5, 7)] == [0, 1, 2, 3, 4]
    assert {w: (worlds[w].local_rank, worlds[w].local_size) for w in worlds} == {
        4: (0, 2), 1: (0, 2), 0: (1, 2), 5: (0, 1), 7: (1, 2)}
    assert {w: worlds[w].cross_rank for w in worlds} == {4: 0, 0: 0, 1: 1, 7: 1, 5: 2}
    assert all(w.size == 5 and w.cross_size == 3 and w.round == 3 for w in worlds.values())
    assert worlds[4].store_prefix == "elastic/round3/" and worlds[4].store_port == 99


def test_rounds_wait_for_every_live_member_and_min_workers():
    rounds = Rounds([(0, "a"), (1, "a"), (2, "b")])
    assert rounds.join(1, "a") and rounds.join(0, "a")
    assert rounds.try_form(1, 3, "h", 1) is None and rounds.blocked_by() == [2]
    rounds.leave(2)  # worker 2 died before joining
    first = rounds.try_form(1, 3, "h", 1)
    assert {w: x.rank for w, x in first.items()} == {0: 0, 1: 1} and rounds.round == 0
    assert not rounds.open
    assert not rounds.join(5, "b")  # a newcomer does not open a round by itself
    assert not rounds.open and rounds.newcomers_waiting() == [5]
    assert rounds.join(1, "a") and rounds.open  # a member left its world
    assert rounds.try_form(1, 3, "h", 1) is None  # worker 0 is still out
    rounds.leave(0)
    second = rounds.try_form(3, 3, "h", 1)
    assert second is None  # 2 ready, min_workers 3
    second = rounds.try_form(2, 3, "h", 1, formed_at=7.5)
    assert {x.formed_at for x in second.values()} == {7.5}  # the driver's stamp, on every world
    assert {w: x.rank for w, x in second.items()} == {1: 0, 5: 1} and second[1].round == 1


def test_rounds_admit_at_most_max_workers():
    rounds = Rounds([(0, "a")])
    rounds.join(0, "a")
    rounds.join(3, "a")
    rounds.join(2, "a")
    worlds = rounds.try_form(1, 2, "h", 1)
    assert sorted(worlds) == [0, 2] and rounds.waiting == {3: "a"}


def test_worker_state_transitions():
    assert check_transition(WorkerState.STARTING, WorkerState.RUNNING) is WorkerState.RUNNING
    assert check_transition(WorkerState.RUNNING, WorkerState.WAITING) is WorkerState.WAITING
    assert check_transition(WorkerState.WAITING, WorkerState.RUNNING) is WorkerState.RUNNING
    for final in (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED):
        assert final.final
        with pytest.raises(IllegalTransition):
            check_transition(final, WorkerState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(WorkerState.STARTING, WorkerState.WAITING)
    with pytest.raises(IllegalTransition):
        check_transition(WorkerState.WAITING, WorkerState.SUCCEEDED)


def test_a_worker_that_ended_after_the_steps_look_keeps_its_slot_until_handled():
    """A worker that fails between the control step's look at the ended workers and its `_fill`
    still holds its slot: the slot is refilled as that failure's replacement (named in its
    attempt), not earlier as if discovery had added one (a seeded chaos run met this: a second
    kill during a recovery was reported as "no free slot for a replacement")."""
    from distributor.engine import WorkerRecord

    job = _job(3, ElasticPolicy(2, 3))
    job._hosts = {"localhost": 3}
    for wid in range(3):
        job._states[wid] = WorkerRecord(wid, "localhost", state=WorkerState.RUNNING)
    job._states[1].state = WorkerState.FAILED  # ended after this step's look: not handled yet
    assert job._live_by_host() == {"localhost": 3}
    assert job._fill(time.monotonic()) == []  # starts nothing: no placement is called
    job._handled.add(1)  # the next step handles it ...
    job._failures[1] = (True, time.monotonic() + 5)
    assert job._live_by_host() == {"localhost": 3}  # ... and it keeps its slot until its replacement
    del job._failures[1]
    assert job._live_by_host() == {"localhost": 2}


def test_a_frozen_report_stops_the_member_unless_it_already_left_the_round():
    """A peer's FROZEN report fails and stops a member of the round at once (the next round
    would wait for it until its heartbeat times out) -- but not a member that has sent JOIN
    since: it stopped beating in the old round because it left it, and it may hold the state."""
    from distributor.engine import WorkerRecord

    stopped = []

    class Recording(LocalPlacement):
        def stop_worker(self, worker_id):
            stopped.append(worker_id)

    job = _job(3, ElasticPolicy(2, 3), Recording())
    job._rounds = Rounds([(wid, "localhost") for wid in range(3)])
    for wid in range(3):
        job._states[wid] = WorkerRecord(wid, "localhost", state=WorkerState.RUNNING)
        job._rounds.join(wid, "localhost")
    job._worlds = job._rounds.try_form(2, 3, "127.0.0.1", 1)
    job._rounds.join(0, "localhost")  # worker 0 left round 0 (its collective failed) ...
    job._states[0].state = WorkerState.WAITING
    job._frozen = [(1, 0, 0, "rank 0 stopped making progress"),  # ... before this report came
                   (1, 0, 2, "rank 2 is stopped (SIGSTOP or a debugger)"),
                   (1, 7, 2, "a report about another round")]
    with job._lock:
        job._check_frozen()
    assert stopped == [2] and job._states[2].state is WorkerState.FAILED
    assert job._causes[2] == ("stopped responding (worker 1 found: rank 2 is stopped (SIGSTOP or "
                              "a debugger))")
    assert job._states[0].state is WorkerState.WAITING and job._frozen == []
