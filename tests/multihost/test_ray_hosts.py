"""horovod.ray across the simulated hosts: a Ray head on this machine (the driver's, no CPUs) and a
Ray node on each host (2 CPUs), joined with `ray start --block` over ssh, as on a real cluster.

- RayExecutor(num_hosts=2, num_workers_per_host=2): one STRICT_SPREAD bundle per node, the ranks
  numbered node by node (local and cross ranks), each rank on its host (its own host name), and an
  allreduce across the hosts.
- ElasticRayExecutor, one worker per host: the second host is lost mid-training (every process on
  it SIGKILLed, its Ray node with it); the worker on the first host goes on from its last commit
  and finishes alone.

Nothing is left on the hosts at the end (the module stops its Ray nodes by PID, then checks).

A long-round module (three Ray nodes start about 300 processes and a minute of CPU): CI's round
skips it, saying so; ``pytest tests/multihost/test_ray_hosts.py`` without ``CI=true`` runs it
(docs/testing.md). The single-node Ray tests (tests/horovod_compat/test_ray_executor.py) run in CI.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tiers import CI  # noqa: E402

if CI:
    pytest.skip("the long round's (three Ray nodes on the simulated hosts): run without CI=true; "
                "CI runs horovod.ray on one node (test_ray_executor.py)", allow_module_level=True)
ray = pytest.importorskip("ray", reason="horovod.ray needs Ray: pip install 'horovod-compat[ray]'")
import ray.cloudpickle  # noqa: E402

from horovod.ray import ElasticRayExecutor, RayExecutor  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
from ray_nodes import ray_on_hosts  # noqa: E402  (shared with benchmarks/ray_allreduce.py)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPUS = 2


@pytest.fixture(scope="module")
def ray_hosts(cluster, tmp_path_factory):
    cluster.services_running = True
    try:
        with ray_on_hosts(cluster.hosts, CPUS, tmp_path_factory.mktemp("ray-nodes"), cluster.kill_all):
            yield cluster
    finally:
        cluster.services_running = False
    left = {name: cluster.commands(name) for name, _ in cluster.hosts}
    assert not any(left.values()), f"left on the hosts: {left}"


def where_and_average():
    import torch
    import horovod.torch as hvd

    hvd.init()
    average = hvd.allreduce(torch.tensor([float(hvd.rank())])).item()
    return (hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
            socket.gethostname(), average)


def test_ray_executor_spreads_the_ranks_over_the_hosts_by_node(ray_hosts):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=2)
    executor.start()
    try:
        got = executor.run(where_and_average)
    finally:
        executor.shutdown()
    hosts = [row[5] for row in got]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], got
    assert set(hosts) == {name for name, _ in ray_hosts.hosts}, got
    assert [row[:5] for row in got] == [(0, 0, 2, 0, 2), (1, 1, 2, 0, 2), (2, 0, 2, 1, 2), (3, 1, 2, 1, 2)], got
    assert {row[6] for row in got} == {1.5}, got


def train_across_hosts(progress, steps=25):
    import torch
    import horovod.torch as hvd

    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0, most=0)

    @hvd.elastic.run
    def loop(state):
        while state.batch < steps:
            opt.zero_grad()
            model(torch.ones(8, 4)).sum().backward()
            opt.step()
            state.batch += 1
            state.most = max(state.most, hvd.size())
            state.commit()
            if hvd.rank() == 0:
                with open(progress, "a") as f:
                    f.write(f"{state.batch} {hvd.size()}\n")
            time.sleep(0.3)
        return hvd.rank(), hvd.size(), state.batch, state.most, socket.gethostname()

    return loop(state)


def test_an_elastic_job_loses_a_host_and_goes_on(ray_hosts, tmp_path):
    (first, _), (second, _) = ray_hosts.hosts
    progress = tmp_path / "progress"
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=2, elastic_timeout=60,
                                                  timeout_s=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=CPUS)  # one worker per host
    executor.start()
    outcome = {}

    def run():
        try:
            outcome["value"] = executor.run(lambda: train_across_hosts(str(progress)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    def on_both_hosts_at_batch_5() -> bool:
        lines = progress.read_text().split("\n") if progress.exists() else []
        return any(int(b) >= 5 and n == "2" for b, n in (line.split() for line in lines if line))

    deadline = time.monotonic() + 120
    while not on_both_hosts_at_batch_5():
        assert runner.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.2)
    ray_hosts.kill_all(second)  # the host is gone: its Ray node and the worker on it
    runner.join(timeout=240)
    assert not runner.is_alive(), "the job did not end after the host was lost"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["value"] == [(0, 1, 25, 2, first)], outcome["value"]
