"""A Spark standalone cluster across the simulated hosts: the master on this machine (on the
cluster bridge), one worker started in each host over ssh, and the driver here. TorchDistributor
(local_mode=False), horovod.spark.run, HorovodRunner(np=4) and a TorchEstimator fit run across
both workers, with unchanged user code; each rank's host and local rank are checked (for the
Horovod entry points the ranks of one executor are one host's local ranks, as Horovod groups
them; TorchDistributor keeps PySpark's one node per task).

The Spark processes stay on the hosts for the module; at its end the session is stopped and each
worker JVM gets SIGTERM (it stops its executors), and then nothing may be left on a host: a rank
that outlived its job would be."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
from spark_clusters import (  # noqa: E402
    FAST_JVM_OPTS, EnvPatch, mirror_spark_home, start_session, stop_session, wait_port,
)

import cloudpickle  # noqa: E402

# The executors cannot import this test module: its functions and classes travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DRIVER = "10.78.0.254"  # this machine on the cluster bridge (scripts/cluster.sh)
CORES = 2


@pytest.fixture(scope="module")
def spark_on_hosts(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("spark-hosts")
    home = mirror_spark_home(root)
    spark_class = str(home / "bin" / "spark-class")
    port = 7177
    daemon_env = {"SPARK_HOME": str(home), "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_MEMORY": "512m",
                  "SPARK_DAEMON_JAVA_OPTS": FAST_JVM_OPTS, "PYSPARK_PYTHON": sys.executable}
    logs = []
    master_log = open(root / "master.log", "wb")
    logs.append(master_log)
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", DRIVER, "--port", str(port),
         "--webui-port", "0"],
        env={**os.environ, **daemon_env, "SPARK_LOG_DIR": str(root / "logs"),
             "SPARK_LOCAL_IP": DRIVER}, stdout=master_log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL)
    workers = []
    session = None
    env = EnvPatch({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": DRIVER, "SPARK_LOCAL_HOSTNAME": DRIVER, "SPARK_HOME": str(home)})
    try:
        wait_port(DRIVER, port, 60, [master], root / "master.log")
        for name, address in cluster.hosts:
            worker_env = {**daemon_env, "SPARK_LOG_DIR": str(root / f"logs-{name}"),
                          "SPARK_LOCAL_IP": address, "SPARK_LOCAL_HOSTNAME": address,
                          "PATH": os.environ["PATH"]}
            command = " ".join([
                "exec env", *(f"{k}={shlex.quote(v)}" for k, v in worker_env.items()),
                shlex.quote(spark_class), "org.apache.spark.deploy.worker.Worker",
                "--host", address, "--port", "0", "--webui-port", "0", "--cores", str(CORES),
                "--memory", "2g", "--work-dir", shlex.quote(str(root / f"work-{name}")),
                f"spark://{DRIVER}:{port}"])
            log = open(root / f"worker-{name}.log", "wb")
            logs.append(log)
            workers.append(subprocess.Popen(["ssh", "-o", "BatchMode=yes", address, command],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL))
        session = start_session(
            f"spark://{DRIVER}:{port}", "test_spark_hosts", executors=len(cluster.hosts),
            conf={"spark.driver.host": DRIVER, "spark.driver.bindAddress": DRIVER,
                  "spark.cores.max": str(CORES * len(cluster.hosts)),
                  "spark.executor.cores": str(CORES)})
        cluster.services_running = True
        yield cluster, session
    finally:
        if session is not None:
            stop_session(session)
        left = cluster.stop_spark_workers()
        for name, _ in cluster.hosts:  # whatever did not go: by PID, so the next module starts clean
            cluster.kill_all(name)
        for proc in [*workers, master]:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        env.restore()
        cluster.services_running = False
    assert not any(left.values()), f"left on the hosts after Spark stopped: {left}"


def _names(cluster):
    return [name for name, _ in cluster.hosts]


def _where():
    import os
    import socket

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    placed = [None] * dist.get_world_size()
    dist.all_gather_object(placed, (dist.get_rank(), int(os.environ["LOCAL_RANK"]),
                                    socket.gethostname()))
    dist.destroy_process_group()
    return placed, total.item()


def test_torch_distributor_across_two_workers(spark_on_hosts):
    from distributor import TorchDistributor

    cluster, _ = spark_on_hosts
    placed, total = TorchDistributor(num_processes=4, local_mode=False, use_gpu=False).run(_where)
    assert total == 10.0 and [rank for rank, _, _ in placed] == [0, 1, 2, 3]
    hosts = {}
    for rank, local, host in placed:
        hosts.setdefault(host, []).append(local)
    # PySpark's rule, kept by TorchDistributor: each barrier task is a torchrun node of its own
    assert sorted(hosts) == sorted(_names(cluster)), placed
    assert all(locals_ == [0, 0] for locals_ in hosts.values()), placed


def _hvd_where():
    import socket

    import torch
    import horovod.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    gathered = hvd.allgather_object(socket.gethostname())
    return hvd.rank(), hvd.local_rank(), hvd.local_size(), socket.gethostname(), total.item(), gathered


def _check_grouped(results, cluster):
    """Ranks of one host are its local ranks 0..1; both hosts take part."""
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert all(r[4] == 10.0 for r in results)
    by_host = {}
    for rank, local, local_size, host, _, gathered in results:
        assert local_size == 2 and gathered == [r[3] for r in results]
        by_host.setdefault(host, []).append((rank, local))
    assert sorted(by_host) == sorted(_names(cluster)), by_host
    for ranks in by_host.values():
        assert sorted(local for _, local in ranks) == [0, 1], by_host
        assert [r for r, _ in sorted(ranks)] == [r for r, _ in sorted(ranks, key=lambda x: x[1])]


def test_horovod_spark_run_across_two_workers(spark_on_hosts):
    import horovod.spark

    cluster, _ = spark_on_hosts
    _check_grouped(horovod.spark.run(_hvd_where, num_proc=4), cluster)


def test_horovod_runner_np4_across_two_workers(spark_on_hosts):
    from sparkdl import HorovodRunner

    cluster, _ = spark_on_hosts
    rank, local, local_size, host, total, gathered = HorovodRunner(np=4).run(_hvd_where)
    assert (rank, local, local_size, total) == (0, 0, 2, 10.0)
    assert sorted(set(gathered)) == sorted(_names(cluster)) and gathered.count(host) == 2


def test_torch_estimator_fit_across_two_workers(spark_on_hosts, tmp_path):
    import torch
    from pyspark.ml.linalg import Vectors

    import horovod.spark.torch as hvd_torch
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store

    _, spark = spark_on_hosts
    rows = [(Vectors.dense([(i % 7) / 7, (i % 5) / 5]), 2 * (i % 7) / 7 - (i % 5) / 5)
            for i in range(400)]
    df = spark.createDataFrame(rows, ["x", "y"])
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    estimator = hvd_torch.TorchEstimator(
        backend=SparkBackend(num_proc=4), store=Store.create(str(tmp_path / "store")), model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.3), loss=torch.nn.MSELoss(),
        feature_cols=["x"], label_cols=["y"], label_shapes=[[-1, 1]], batch_size=16, epochs=8,
        verbose=0, random_seed=1)
    fitted = estimator.fit(df)
    history = fitted.getHistory()
    assert len(history) == 8 and history[-1]["train"]["loss"] < 0.5 * history[0]["train"]["loss"]
    predicted = fitted.setOutputCols(["y_hat"]).transform(df).collect()
    assert len(predicted) == 400
    assert sum((r["y_hat"] - r["y"]) ** 2 for r in predicted) / 400 < 0.05
