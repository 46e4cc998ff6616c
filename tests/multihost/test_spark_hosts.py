"""A Spark standalone cluster across the simulated hosts: the master on this machine (on the
cluster bridge), one worker started in each host over ssh, and the driver here. TorchDistributor
(local_mode=False), horovod.spark.run, HorovodRunner(np=4) and a TorchEstimator fit run across
both workers, with unchanged user code; each rank's host and local rank are checked (for the
Horovod entry points the ranks of one executor are one host's local ranks, as Horovod groups
them; TorchDistributor keeps PySpark's one node per task).

Losses, last: hc2's executor JVM SIGKILLed under horovod.spark.run, HorovodRunner(np=4) and
TorchDistributor (the job ends within 10 s naming a rank of hc2; CI runs HorovodRunner's), the
Spark Python worker of a rank on hc2 SIGKILLed under each of them (the job ends within 10 s naming
a rank that ran under it; the long round), a TorchEstimator fit losing a host's executor (fit()
raises within 10 s naming a rank of that host; the long round), an
elastic job (horovod.spark.run_elastic) losing a host's executor and going on exactly-once with its
replacements (the long round), and hc2 cut off the network (the job ends within the frozen bound +
40 s naming a rank of hc2; the long round).

The Spark processes stay on the hosts for the module; at its end the session is stopped and each
worker JVM gets SIGTERM (it stops its executors), and then nothing may be left on a host: a rank
that outlived its job would be."""
from __future__ import annotations

import io
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "distributor"))
import spark_clusters  # noqa: E402
from spark_clusters import (  # noqa: E402
    FAST_JVM_OPTS, EnvPatch, elastic_train, executor_jvm_of, join_the_job, mirror_spark_home,
    start_session, stop_session, wait_port,
)

import cloudpickle  # noqa: E402
import procs  # noqa: E402
from tiers import CI  # noqa: E402

# The executors cannot import this test module or spark_clusters: their functions and classes
# travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(spark_clusters)

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


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI runs horovod.spark.run, which the estimator's fit runs on, across the "
    "two workers (above), and the estimator on one machine (tests/horovod_compat/test_spark_estimator.py)"))
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


# ---- losses (the module's last tests: each leaves the cluster with one executor fewer for a
# while; `_both_executors` waits for the standalone worker's new one) ---------------------------
def _train_until_lost(folder, api="horovod", steps=3000):
    """An allreduce every 20 ms, on Horovod's API or (``api="torch"``) torch.distributed's; each
    rank writes its host and pid to `folder` once it trained 5 steps."""
    import os
    import socket
    import time

    import torch

    rank, allreduce = join_the_job(api)
    for step in range(steps):
        allreduce(torch.ones(1))
        if step == 5:
            with open(os.path.join(folder, f"rank-{rank}"), "w") as handle:
                handle.write(f"{socket.gethostname()} {os.getpid()}")
        time.sleep(0.02)
    return rank


def _both_executors(session, timeout=120.0):
    """Wait until an executor is registered on each host again (after a loss)."""
    tracker = session.sparkContext._jsc.sc()
    deadline = time.monotonic() + timeout
    while tracker.getExecutorMemoryStatus().size() - 1 < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tracker.getExecutorMemoryStatus().size() - 1 >= 2, "no executor came back on a host"


#: The Spark launchers whose jobs lose an executor: each runs `_train_until_lost` on 4 ranks.
LAUNCHERS = {
    "horovod.spark.run": lambda folder: __import__("horovod.spark").spark.run(
        _train_until_lost, args=(folder,), num_proc=4, env={"HOROVOD_COMPAT_FROZEN_SECONDS": "5"},
        stdout=io.StringIO(), stderr=io.StringIO()),
    "HorovodRunner": lambda folder: __import__("sparkdl").HorovodRunner(np=4).run(
        _train_until_lost, folder=folder),
    "TorchDistributor": lambda folder: __import__("distributor").TorchDistributor(
        num_processes=4, local_mode=False, use_gpu=False).run(_train_until_lost, folder, "torch"),
}


def _lose_while_training(cluster, session, tmp_path, strike, launcher="horovod.spark.run"):
    """`launcher`'s job of `_train_until_lost` in a thread; once every rank trained,
    `strike(host name)` loses hc2 (or what runs there). Returns (the error, seconds from the
    strike to the error, the ranks that were on hc2, every rank's pid)."""
    _both_executors(session)
    folder = tmp_path / "ranks"
    folder.mkdir()
    outcome = []

    def call():
        try:
            outcome.append(LAUNCHERS[launcher](str(folder)))
        except BaseException as exc:  # noqa: BLE001 - judged by the test
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 120
    while len(list(folder.iterdir())) < 4 and caller.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(folder.iterdir())) == 4, f"the ranks did not all train: {outcome}"
    ranks = {int(p.name.split("-")[1]): p.read_text().split() for p in folder.iterdir()}
    lost_host = cluster.hosts[1][0]
    on_lost = sorted(rank for rank, (host, _) in ranks.items() if host == lost_host)
    assert on_lost, "no rank on the host to lose"
    struck = time.time()
    strike(lost_host)
    caller.join(120)
    assert not caller.is_alive(), f"{launcher} still running 120 s after the loss"
    return outcome[0], time.time() - struck, on_lost, [int(pid) for _, pid in ranks.values()]


def _left(pids, timeout=30.0):
    """Those of `pids` still running after up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while [p for p in pids if procs.alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if procs.alive(p)]


@pytest.mark.parametrize("launcher", [
    pytest.param(name, marks=() if name == "HorovodRunner" else pytest.mark.skipif(CI, reason=(
        "the long round's: CI loses an executor on a host under HorovodRunner (one mpirun over "
        "both hosts' tasks), and a Python worker under every Spark launcher (tests/chaos)")))
    for name in LAUNCHERS])
def test_a_lost_executor_on_a_host_ends_the_job_naming_one_of_its_ranks(spark_on_hosts, launcher,
                                                                        tmp_path):
    """hc2's executor JVM is SIGKILLed mid-training (its Python workers, fork servers and ranks
    go with it): the launcher raises within 10 s, naming a rank of hc2 as lost, and no rank is
    left on either host."""
    from distributor import RankFailedError

    cluster, session = spark_on_hosts

    def kill_the_executor(host):
        jvms = [pid for pid, command in cluster.commands(host).items()
                if "CoarseGrainedExecutorBackend" in command]
        assert jvms, cluster.commands(host)
        os.kill(jvms[0], signal.SIGKILL)

    error, seconds, on_lost, pids = _lose_while_training(cluster, session, tmp_path,
                                                         kill_the_executor, launcher)
    assert isinstance(error, RankFailedError), error
    first = str(error).splitlines()[0]
    assert error.rank in on_lost and "lost" in first, (on_lost, str(error)[-3000:])
    assert seconds < 10, (seconds, first)
    print(f"\n{launcher}, lost executor on {cluster.hosts[1][0]}: the job ended {seconds:.2f} s "
          f"after the kill: {first}")
    assert _left(pids) == [], "a rank outlived the job"


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI loses a Python worker in a TorchEstimator fit on one machine "
    "(tests/horovod_compat/test_spark_estimator.py) and an executor on a host under HorovodRunner "
    "(above), which the fit's horovod.spark.run shares"))
def test_a_lost_executor_on_a_host_ends_a_torch_estimator_fit_naming_one_of_its_ranks(spark_on_hosts,
                                                                                      tmp_path):
    """A TorchEstimator fit on 4 ranks across both hosts: rank 3's 20th forward SIGKILLs its
    executor JVM (its host's ranks go with it). fit() raises within 10 s, naming a rank of that
    host as lost, and no rank is left on either host."""
    import torch
    from pyspark.ml.linalg import Vectors

    import horovod.spark.torch as hvd_torch
    from distributor import RankFailedError
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store

    _, spark = spark_on_hosts
    _both_executors(spark)
    folder, tag = tmp_path / "ranks", f"HOROVOD_TEST_MARKER_{uuid.uuid4().hex}"
    folder.mkdir()

    class LosesItsExecutor(torch.nn.Linear):
        """Each rank notes its host at its first forward; rank 3's 20th forward SIGKILLs the
        executor JVM its task runs in (noting the time)."""

        def __init__(self, folder):
            super().__init__(2, 1)
            self.folder, self.calls = folder, 0

        def forward(self, x):
            import os
            import signal
            import socket
            import time

            self.calls += 1
            rank = os.environ.get("RANK")  # (set in the ranks only)
            if rank is not None and self.calls == 1:
                with open(os.path.join(self.folder, f"rank-{rank}"), "w") as handle:
                    handle.write(socket.gethostname())
            if rank == "3" and self.calls == 20:
                with open(os.path.join(self.folder, "killed"), "w") as handle:
                    handle.write(str(time.time()))
                os.kill(executor_jvm_of(os.getpid()), signal.SIGKILL)
                time.sleep(60)  # (goes with it)
            return super().forward(x)

    rows = [(Vectors.dense([(i % 7) / 7, (i % 5) / 5]), 2 * (i % 7) / 7 - (i % 5) / 5)
            for i in range(400)]
    torch.manual_seed(0)
    model = LosesItsExecutor(str(folder))
    estimator = hvd_torch.TorchEstimator(
        backend=SparkBackend(num_proc=4, env={"HOROVOD_TEST_MARKER": tag}),
        store=Store.create(str(tmp_path / "store")), model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss=torch.nn.MSELoss(),
        feature_cols=["x"], label_cols=["y"], label_shapes=[[-1, 1]], batch_size=16, epochs=30,
        verbose=0, random_seed=1)
    with pytest.raises(RankFailedError) as info:
        estimator.fit(spark.createDataFrame(rows, ["x", "y"]))
    seconds = time.time() - float((folder / "killed").read_text())
    hosts = {int(p.name.split("-")[1]): p.read_text() for p in folder.glob("rank-*")}
    on_lost = sorted(rank for rank, host in hosts.items() if host == hosts[3])
    first = str(info.value).splitlines()[0]
    assert info.value.rank in on_lost and "lost" in first, (hosts, str(info.value)[-3000:])
    assert seconds < 10, (seconds, first)
    print(f"\nTorchEstimator fit, lost executor on {hosts[3]} (ranks {on_lost}): fit() raised "
          f"{seconds:.2f} s after the kill: {first}")
    assert procs.ranks_left_after(tag) == [], "a rank outlived the fit"


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI loses a Python worker under every Spark launcher on one machine "
    "(tests/chaos: the 'worker' fault) and an executor on a host under HorovodRunner (above)"))
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_lost_python_worker_on_a_host_ends_the_job_naming_a_rank_it_ran(spark_on_hosts, launcher,
                                                                          tmp_path):
    """The Spark Python worker of a rank on hc2 is SIGKILLed mid-training (its executor JVM lives
    on): the launcher raises within 10 s naming a rank that ran under that worker as lost (under
    HorovodRunner the host's first task's worker runs the daemon of all the host's ranks), and no
    rank is left on either host."""
    from distributor import RankFailedError

    cluster, session = spark_on_hosts
    lost_with = []

    def kill_a_python_worker(host):
        ranks = {int(p.name.split("-")[1]): int(p.read_text().split()[1])
                 for p in (tmp_path / "ranks").iterdir() if p.read_text().split()[0] == host}
        worker = spark_clusters.python_worker_of(ranks[min(ranks)])
        lost_with.extend(sorted(rank for rank, pid in ranks.items() if worker in procs.ancestors(pid)))
        os.kill(worker, signal.SIGKILL)

    error, seconds, on_lost, pids = _lose_while_training(cluster, session, tmp_path,
                                                         kill_a_python_worker, launcher)
    assert isinstance(error, RankFailedError), error
    first = str(error).splitlines()[0]
    assert lost_with and set(lost_with) <= set(on_lost), (lost_with, on_lost)
    assert error.rank in lost_with, (lost_with, str(error)[-3000:])
    assert seconds < 10, (seconds, first)
    print(f"\n{launcher}, lost Python worker on {cluster.hosts[1][0]} (ranks {lost_with}): the job "
          f"ended {seconds:.2f} s after the kill: {first}")
    assert _left(pids) == [], "a rank outlived the job"


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI loses an executor of an elastic job on one machine "
    "(tests/horovod_compat/test_spark_run.py) and an executor on a host under HorovodRunner (above)"))
def test_an_elastic_job_goes_on_exactly_once_when_a_hosts_executor_is_lost(spark_on_hosts,
                                                                           tmp_path, monkeypatch):
    """horovod.spark.run_elastic on 4 workers, 2 per host: at step 5, rank 3 SIGKILLs its
    executor's JVM, so that host loses both of its workers at once. The survivors go on from the
    last commit; Spark's next attempts of the two lost tasks start on the host's new executor and
    join (the job is back to 4 ranks on both hosts); every committed step counts exactly once (the
    weight's closed form), and nothing of the job is left on either host."""
    import horovod.spark

    cluster, session = spark_on_hosts
    _both_executors(session)
    tag = f"HOROVOD_TEST_MARKER_{uuid.uuid4().hex}"
    monkeypatch.setenv("HOROVOD_TEST_MARKER", tag)  # the driver's HOROVOD_* reach every worker
    out = io.StringIO()
    marker = str(tmp_path / "killed")
    started = time.monotonic()
    results = horovod.spark.run_elastic(
        elastic_train, args=(marker, 60, executor_jvm_of, 3, 4), num_proc=4, min_num_proc=2,
        stdout=out, stderr=out)
    text = out.getvalue()
    assert Path(marker).exists(), "rank 3 must have lost its executor"
    assert [r["rank"] for r in results] == [0, 1, 2, 3], text[-3000:]
    assert {r["size"] for r in results} == {4}, (results, text[-3000:])
    assert sorted({r["host"] for r in results}) == sorted(_names(cluster)), results
    steps = {r["step"] for r in results}
    assert len(steps) == 1 and steps.pop() >= 60, results
    for r in results:  # every committed step counted exactly once, none lost, none repeated
        assert abs(r["weight"] - (1 - 0.8 ** r["step"])) < 1e-5, r
    assert any(r["resets"] for r in results), "the survivors must have been reset"
    lost = re.findall(r"Spark task (\d) \(attempt 0\) on executor host (\S+) was lost", text)
    assert len(lost) == 2 and len({host for _, host in lost}) == 1, text[-3000:]
    # both replacements (workers 4 and 5, in the lost tasks' next attempts) joined the job
    joined = re.findall(r"^\[(\d+)\]<stdout>:joined as rank \d of \d$", text, re.M)
    assert {int(worker) for worker in joined} == {0, 1, 2, 3, 4, 5}, text[-3000:]
    killed = float(Path(marker).read_text())
    first = min(when for r in results for size, when in r["resets"] if when > killed)
    back = min(when for r in results for size, when in r["resets"] if size == 4 and when > killed)
    print(f"\nelastic job, lost executor on {lost[0][1]}: the first reset {first - killed:.2f} s "
          f"after the kill, back to 4 ranks after {back - killed:.2f} s; the job took "
          f"{time.monotonic() - started:.1f} s")
    assert procs.ranks_left_after(tag) == [], "a worker outlived the job"


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI loses a host under horovodrun (tests/multihost/test_chaos_hosts.py) and "
    "an executor on a host (above); this one waits out the frozen bound and hc2's return"))
def test_a_lost_host_ends_a_spark_job_naming_one_of_its_ranks(spark_on_hosts, tmp_path):
    """hc2 loses its network mid-training (the bridge side of its link goes down: nothing is
    closed, it stops answering): horovod.spark.run raises within the frozen bound + 40 s, naming
    a rank of hc2; hc2's ranks end by themselves while it is cut off, and nothing of the job is
    left on hc1."""
    from distributor import RankFailedError

    cluster, session = spark_on_hosts
    down = []

    def cut(host):
        subprocess.run(["ip", "link", "set", f"hcv{len(cluster.hosts)}", "down"], check=True,
                       timeout=30)
        down.append(host)

    try:
        error, seconds, on_lost, pids = _lose_while_training(cluster, session, tmp_path, cut)
        assert isinstance(error, RankFailedError), error
        first = str(error).splitlines()[0]
        assert error.rank in on_lost, (on_lost, str(error)[-3000:])
        assert seconds < 5 + 40, (seconds, first)
        print(f"\nlost host {down[0]}: the job ended {seconds:.2f} s after the loss: {first}")
        assert _left(pids, timeout=20) == [], "a rank outlived the job (on either host)"
    finally:
        if down:
            subprocess.run(["ip", "link", "set", f"hcv{len(cluster.hosts)}", "up"], check=True,
                           timeout=30)
