"""horovod.ray's RayExecutor on a real Ray (a local cluster started once for this module, 3 CPUs):
ranks as actors with Horovod's topology and this project's collectives, the values in rank order,
executables, a raising rank named with its source line and every actor stopped, settings the
cluster cannot meet refused before any actor starts, nothing left after shutdown(), Ray Train
V1's Horovod example, and elastic jobs (ElasticRayExecutor, RayExecutor(min_workers=...)) that
lose a worker's process or its actor and go on. (Without Ray, `import horovod.ray` names the pip
line: test_launch_api.py.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import ray
import ray.cloudpickle

import horovod.ray as hvd_ray
from tiers import CI
from horovod.ray import BaseHorovodWorker, ElasticRayExecutor, RayExecutor

# the functions below travel to the actors by value (this file is not importable there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPUS = 3


@pytest.fixture(scope="module")
def cluster():
    # address="local": a cluster of this module's own, whatever cluster the machine runs or a
    # stale /tmp/ray/ray_current_cluster names
    ray.init(address="local", num_cpus=CPUS, include_dashboard=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


@pytest.fixture
def executor(cluster):
    made = []

    def make(**kwargs):
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), **kwargs)
        made.append(ex)
        return ex
    yield make
    for ex in made:
        ex.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pids, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def topology_and_average():
    import torch
    import horovod.torch as hvd

    hvd.init()
    average = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)])).item()
    return (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
            hvd.cross_size(), average)


def scaled_rank(factor, offset=0):
    import horovod.torch as hvd

    hvd.init()  # (already initialised by the first function: the same group)
    return hvd.rank() * factor + offset


class Counter:
    def __init__(self, start, step=1):
        self.value, self.step = start, step

    def bump(self):
        self.value += self.step
        return self.value


def test_run_gives_every_rank_in_rank_order_on_one_runtime(executor):
    ex = executor(num_workers=2)
    ex.start()
    assert ex.run(topology_and_average) == [(0, 2, 0, 2, 0, 1, 1.5), (1, 2, 1, 2, 0, 1, 1.5)]
    # the actors keep their group: later functions reuse it, with args and kwargs
    assert ex.run(scaled_rank, args=[10], kwargs={"offset": 1}) == [1, 11]
    refs = ex.run_remote(scaled_rank, args=[3])
    assert all(isinstance(r, ray.ObjectRef) for r in refs) and ray.get(refs) == [0, 3]


def test_executables_live_in_their_actors(executor):
    ex = executor(num_workers=2)
    ex.start(executable_cls=Counter, executable_args=[10], executable_kwargs={"step": 5},
             extra_env_vars={"SWEEP_NAME": "wide"})
    assert ex.execute(lambda c: c.bump()) == [15, 15]
    assert ex.execute(lambda c: c.bump()) == [20, 20]
    assert ex.execute_single(lambda c: (c.value, os.environ["SWEEP_NAME"], os.environ["HOROVOD_RANK"])) \
        == (20, "wide", "0")


def fails_on_rank_1():
    import torch
    import horovod.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad batch on this rank")
    return hvd.allreduce(torch.ones(1)).item()  # rank 0 waits here for rank 1


def test_a_raising_rank_is_named_with_its_source_line_and_every_actor_stops(executor):
    ex = executor(num_workers=2)
    ex.start()
    pids = list(ex._pids)
    started = time.monotonic()
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ex.run(fails_on_rank_1)
    took = time.monotonic() - started
    text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
    assert "rank 1 of 2 (on " in text and "raised ValueError" in text, text
    assert 'raise ValueError("bad batch on this rank")' in text and "test_ray_executor.py" in text, text
    assert took < 60, took  # (not a wait for a collective's timeout: the waiting rank was stopped)
    assert _gone(pids), [p for p in pids if _alive(p)]
    with pytest.raises(RuntimeError, match="call start"):
        ex.run(scaled_rank, args=[1])
    ex.start()  # and it can start again
    assert ex.run(scaled_rank, args=[1]) == [0, 1]


def test_a_dead_actor_is_named_and_the_others_stop(executor):
    ex = executor(num_workers=2)
    ex.start()
    pids = list(ex._pids)

    def rank_1_dies():
        import horovod.torch as hvd
        import torch

        hvd.init()
        if hvd.rank() == 1:
            os._exit(3)
        return hvd.allreduce(torch.ones(1)).item()

    # rank 0 sees rank 1 go (HorovodInternalError) at about the time Ray sees the actor die:
    # whichever comes first, the dead rank is the one named, as the other launchers name it
    with pytest.raises(ray.exceptions.RayActorError) as info:
        ex.run(rank_1_dies)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "rank 1 of 2 (on " in note and "died (its actor process is gone)" in note, note
    assert _gone(pids)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(num_workers=64), ValueError, "needs 64 CPUs; the Ray cluster has 3"),
    (dict(num_workers=2, cpus_per_worker=2), ValueError, "needs 4 CPUs"),
    (dict(num_workers=1, use_gpu=True), ValueError, "use_gpu=False, or a cluster with GPUs"),
    (dict(num_hosts=2, num_workers_per_host=1), ValueError, "only 1 node(s)"),
    (dict(num_workers=0), ValueError, "num_workers=0"),
    (dict(min_workers=2, max_workers=1), ValueError, "min_num_proc=2 is larger than max_num_proc=1"),
    (dict(min_workers=4), ValueError, "RayExecutor(min_workers=4, cpus_per_worker=1) needs 4 CPUs"),
    (dict(num_workers=2, min_workers=1), ValueError, "not both"),
    (dict(num_workers=1, gpus_per_worker=1), ValueError, "needs use_gpu=True"),
])
def test_settings_the_cluster_cannot_meet_fail_before_any_actor_starts(executor, kwargs, error, words):
    free = ray.available_resources().get("CPU")
    with pytest.raises(error) as info:
        executor(**kwargs).start()
    assert words in str(info.value), str(info.value)
    assert ray.available_resources().get("CPU") == free == CPUS  # nothing placed, nothing held


def test_shutdown_leaves_no_actor_and_frees_the_cluster(executor):
    ex = executor(num_workers=3)
    ex.start()
    pids = list(ex._pids)
    assert ex.run(scaled_rank, args=[1]) == [0, 1, 2]
    assert ray.available_resources().get("CPU", 0) == 0
    ex.shutdown()
    assert _gone(pids), [p for p in pids if _alive(p)]
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU") != CPUS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == CPUS


def test_horovod_ray_is_this_projects_package():
    assert hvd_ray.RayExecutor is RayExecutor and issubclass(BaseHorovodWorker, object)
    assert hvd_ray.__name__ == "horovod_compat.ray"


#: Ray Train V1's own Horovod example (ray/train/examples/horovod/horovod_example.py, shipped with
#: Ray), run unchanged on this cluster with RAY_TRAIN_V2_ENABLED=0: its HorovodTrainer drives
#: horovod.ray.runner.Coordinator, horovod.ray.utils and horovod.runner.common.util.
RAY_TRAIN_EXAMPLE = """\
import json, sys
import ray
ray.init(address=sys.argv[1])
from ray.train.examples.horovod.horovod_example import main
main(num_workers=2, use_gpu=False, kwargs={"data_dir": sys.argv[2], "num_epochs": 2, "lr": 0.05,
                                           "batch_size": 32, "log_interval": 2})
"""


def test_ray_train_v1_horovod_example_runs_unchanged(cluster, tmp_path):
    from test_upstream_mnist import write_mnist

    done = subprocess.run([sys.executable, "-c", "import torchvision, filelock"], capture_output=True, text=True)
    if done.returncode:
        pytest.skip("Ray's Horovod example imports torchvision and filelock, which this environment "
                    f"cannot both import: {done.stderr.strip().splitlines()[-1]}")
    data = write_mnist(tmp_path / "data")
    # (HOME moves for the example's ~/.horovod_lock; the cluster's token stays where Ray put it)
    token = os.path.expanduser("~/.ray/auth_token")
    env = {**os.environ, "RAY_TRAIN_V2_ENABLED": "0", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "RAY_AIR_NEW_OUTPUT": "0", **({"RAY_AUTH_TOKEN_PATH": token} if os.path.exists(token) else {})}
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-c", RAY_TRAIN_EXAMPLE, address, str(data)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "Train Epoch: 1" in out and "'loss':" in out, out[-5000:]


# ----------------------------------------------------------------------------- elastic jobs

def elastic_train(mark, how, steps=20):
    """An elastic TorchState loop (a commit every 5 batches); with `how`, rank 1 of the first
    round SIGKILLs its own process ("process") or its actor ("actor") at batch 7. A worker alone
    goes slowly, so that the replacement joins before the end. Returns (rank, size, batch, pid,
    the parameters' sums)."""
    import signal

    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0)

    @hvd.elastic.run
    def loop(state):
        while state.batch < steps:
            opt.zero_grad()
            model(torch.ones(8, 4) * (hvd.rank() + 1)).sum().backward()
            opt.step()
            state.batch += 1
            if state.batch % 5 == 0:
                state.commit()
            if how and state.batch == 7 and hvd.rank() == 1 and not os.path.exists(mark):
                with open(mark, "w") as f:
                    f.write(str(os.getpid()))
                os.kill(os.getppid() if how == "actor" else os.getpid(), signal.SIGKILL)
                time.sleep(60)
            time.sleep(0.1 if hvd.size() > 1 else 1.0)
        return (hvd.rank(), hvd.size(), state.batch, os.getpid(),
                [round(p.detach().sum().item(), 6) for p in model.parameters()])

    return loop(state)


def _cpus_back(seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU") != CPUS and time.monotonic() < deadline:
        time.sleep(0.1)
    return ray.available_resources().get("CPU") == CPUS


@pytest.mark.parametrize("how", [
    pytest.param("process", marks=pytest.mark.skipif(CI, reason=(
        "the long round's: CI loses the rank's actor (its Ray worker process, the rank inside it "
        "with it), the same replacement path"))),
    "actor"])
def test_an_elastic_job_replaces_a_lost_worker_and_goes_on(cluster, tmp_path, capfd, caplog, how):
    """Rank 1's process (or its actor: the node's Ray worker process) is SIGKILLed at batch 7:
    rank 0 restores the commit of batch 5 and goes on, a replacement starts on the node and
    joins, and both end at batch 20 with the same weights; nothing of the job is left."""
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=2, elastic_timeout=60,
                                                  timeout_s=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    mark = str(tmp_path / "killed")
    results = executor.run(lambda: elastic_train(mark, how))
    err = capfd.readouterr().err + caplog.text  # the ranks' lines, the driver's log
    assert [r[:3] for r in results] == [(0, 2, 20), (1, 2, 20)], err[-4000:]
    assert results[0][4] == results[1][4], results  # the same weights on both
    assert re.search(r"elastic job: worker 1 \(rank 1 of round 0, host \S+\) killed by SIGKILL -> "
                     r"replacement worker 2", err), err[-4000:]
    assert "restoring the last commit" in err, err[-4000:]
    if how == "actor":
        assert "the Ray actor that ran this worker on node" in err, err[-4000:]
    killed = int(open(mark).read())
    assert _gone([killed, *[r[3] for r in results]])
    assert _cpus_back(), ray.available_resources()  # every worker's actor is gone


def test_ray_executor_with_min_workers_runs_elastically(executor, capfd):
    ex = executor(min_workers=1, max_workers=2)
    with pytest.raises(RuntimeError, match="call start"):
        ex.run(lambda: None)
    ex.start(extra_env_vars={"SWEEP_NAME": "elastic"})
    assert ex.run(elastic_train, args=["", None], kwargs={"steps": 3})[0][:3] == (0, 2, 3)
    assert ex.run(lambda: os.environ["SWEEP_NAME"]) == ["elastic", "elastic"]
    with pytest.raises(RuntimeError, match="an elastic job runs functions with run"):
        ex.execute(lambda _: 1)
    with pytest.raises(ValueError, match="not an executable_cls"):
        executor(min_workers=1).start(executable_cls=Counter)
    assert _cpus_back()


def test_elastic_settings_the_cluster_cannot_meet_fail_before_any_actor_starts(cluster, capfd):
    with pytest.raises(ValueError, match=r"use_gpu=True\): the Ray cluster has no GPUs"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(), use_gpu=True).start()
    with pytest.raises(ValueError, match="min_num_proc=3 is larger than max_num_proc=2"):
        ElasticRayExecutor.create_settings(min_num_proc=3, max_num_proc=2)
    # a cluster may grow: too few slots is a wait (said at once), then an error naming the numbers
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=4, elastic_timeout=2))
    executor.start()
    with pytest.raises(ValueError, match=r"offers 3 worker slot\(s\).*fewer than the minimum of 4"):
        executor.run(lambda: None)
    assert "waiting up to 2 s for the Ray cluster to offer 4 worker slot(s)" in capfd.readouterr().err
    assert ray.available_resources().get("CPU") == CPUS


def test_an_elastic_job_whose_function_fails_stops_with_its_error(cluster):
    def broken():
        import horovod.torch as hvd

        hvd.init()
        raise ValueError(f"bad setting on rank {hvd.rank()}")

    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2))
    executor.start()
    with pytest.raises(Exception) as info:
        executor.run(broken)
    assert "ValueError: bad setting on rank" in str(info.value), str(info.value)
    assert _cpus_back()
