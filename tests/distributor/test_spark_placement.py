"""The Spark placement on a real `local-cluster[2,1,1024]`: two executor JVMs, one barrier stage.

One SparkSession for the whole module (a JVM start costs ~15-25 s here); every job is small.
Each executor also has two fake GPUs (a discovery script that lists addresses "0" and "1"), and
each task asks for two (spark.task.resource.gpu.amount=2): jobs with use_gpu=False ignore them,
use_gpu=True jobs go through the real resource path, two ranks per task, without CUDA.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distributor import (
    FunctionTarget,
    Job,
    JobTimeoutError,
    LaunchRequest,
    LaunchValidationError,
    RankFailedError,
    TorchDistributor,
    run_function,
)
from distributor.placement import SparkPlacement, SparkPlacementError

from spark_clusters import (
    SPARK_TEST_ENV,
    EnvPatch,
    alive,
    descendants,
    kill_tree,
    lose_the_executor_at_step_5,
    mirror_spark_home,
    no_active_jobs,
    start_session,
    stop_session,
)
from tiers import CI

SCRIPTS = Path(__file__).parent / "scripts"
MASTER = "local-cluster[2,1,1024]"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-cluster")
    env = EnvPatch({**SPARK_TEST_ENV, "SPARK_HOME": str(mirror_spark_home(root))})
    discovery = root / "fake_gpus.sh"
    discovery.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    discovery.chmod(0o755)
    session = start_session(MASTER, "test_spark_placement", executors=2, conf={
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(discovery),
        "spark.executor.resource.gpu.amount": "2",
        "spark.task.resource.gpu.amount": "2",
    })
    session.work_dir = root / "spark-home" / "work"
    try:
        yield session
    finally:
        stop_session(session)
        env.restore()


def _wait_dead(pids, timeout=60.0):
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _env_and_all_reduce(offset):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} says hello", flush=True)
    print(f"rank {dist.get_rank()} to stderr", file=sys.stderr, flush=True)
    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"]
    env = {k: os.environ.get(k) for k in keys}
    private = sorted(k for k in os.environ if k.startswith("DISTRIBUTOR_"))
    dist.destroy_process_group()
    return value.item() + offset, env, private, os.getcwd(), os.getppid()


def test_ranks_run_in_the_executors_with_the_torchrun_contract(spark):
    lines = []
    results = run_function(
        _env_and_all_reduce, 100, num_processes=2, return_all=True,
        placement=SparkPlacement(spark), output=lambda r, s, l: lines.append((r, s, l)),
    )
    assert [r[0] for r in results] == [103.0, 103.0]
    for rank, (_, env, private, cwd, parent) in enumerate(results):
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        # one torchrun node per barrier task, as PySpark does
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["NODE_RANK"] == env["GROUP_RANK"] == str(rank) and env["GROUP_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"].isdigit()
        assert private == [], "the hub address and secret must not reach user code"
        assert parent != os.getpid(), "ranks must run under the executors, not the driver"
        assert Path(cwd).is_relative_to(spark.work_dir), cwd
    assert results[0][1]["TORCHELASTIC_RUN_ID"] == results[1][1]["TORCHELASTIC_RUN_ID"]
    assert results[0][3] != results[1][3], "two executors, two work directories"
    assert (0, "stdout", "rank 0 says hello") in lines and (1, "stdout", "rank 1 says hello") in lines
    assert (1, "stderr", "rank 1 to stderr") in lines
    assert no_active_jobs(spark)


def test_torch_distributor_runs_a_torchrun_script_unchanged(spark, tmp_path, capsys):
    out = tmp_path / "out"
    result = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        str(SCRIPTS / "torchrun_style.py"), "--scale", 1.5, "--out", str(out)
    )
    assert result is None
    for rank in (0, 1):
        total, local_rank, name = (tmp_path / f"out.{rank}").read_text().split()
        assert float(total) == 4.5 and local_rank == "0" and name == "__main__"
    printed = capsys.readouterr().out
    assert "[rank 0] rank 0 sum 4.5" in printed and "[rank 1] rank 1 sum 4.5" in printed


#: Longer than any test may run (setup.cfg's timeout): a job that returns at all did not wait for a
#: rank that sleeps this long, so the bounds below can be wide, for a loaded machine's sake.
FOREVER = 3600.0
#: What a job that must end early (a rank failed, its timeout passed) may take on a loaded 2-core
#: machine, Spark task and rank start-up included; a job that waited for a FOREVER rank takes more.
EARLY = 150.0


def _fail_on_rank_1(delay):
    import time as t

    print(f"PID {os.getpid()}", flush=True)
    if os.environ["RANK"] == "1":
        t.sleep(delay)
        raise ValueError("rank one cannot go on")
    t.sleep(FOREVER)


def test_rank_failure_stops_every_rank_and_raises_the_rank_error(spark):
    pids = []

    def collect(rank, stream, line):
        if line.startswith("PID "):
            pids.append(int(line.split()[1]))

    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_function(_fail_on_rank_1, 1.0, num_processes=2, placement=SparkPlacement(spark), output=collect)
    elapsed = time.monotonic() - started
    error = info.value
    assert error.rank == 1 and error.exc_type == "ValueError" and error.exit_code == 1
    assert "rank one cannot go on" in error.traceback and "_fail_on_rank_1" in error.traceback
    assert "Py4J" not in str(error) and "org.apache" not in str(error)
    assert elapsed < EARLY, f"failure took {elapsed:.1f}s to surface: was rank 0 waited for?"
    assert len(pids) == 2
    assert _wait_dead(pids) == [], "rank processes left running on the executors"
    assert no_active_jobs(spark), "the barrier job was not cancelled"


def _fail_on_rank_1_first_time(marker):
    if os.environ["RANK"] == "1" and not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise RuntimeError("first attempt fails on purpose")
    return os.environ["TORCHELASTIC_RESTART_COUNT"], os.getppid()


def test_max_restarts_runs_every_rank_again_in_a_new_barrier_stage(spark, tmp_path):
    groups = []

    class Recording(SparkPlacement):
        def start(self, job):
            groups.append(job.run_id)  # the placement names its Spark job group after the job
            super().start(job)

    count, parent = run_function(_fail_on_rank_1_first_time, str(tmp_path / "marker"),
                                 num_processes=2, max_restarts=1, placement=Recording(spark),
                                 output=lambda *a: None)
    assert count == "1" and parent != os.getpid()
    tracker = spark.sparkContext.statusTracker()
    assert len(set(groups)) == 2 and all(tracker.getJobIdsForGroup(g) for g in groups), \
        "each attempt must run as its own Spark job"
    assert (tmp_path / "marker").exists() and no_active_jobs(spark)
    assert TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                            max_restarts=1).run(_fail_on_rank_1_first_time,
                                                str(tmp_path / "marker2"))[0] == "1"


def test_job_timeout_cancels_the_stage_and_kills_the_ranks(spark):
    pids = []
    started = time.monotonic()
    with pytest.raises(JobTimeoutError, match="timeout=12s"):
        run_function(
            _fail_on_rank_1, FOREVER, num_processes=2, timeout=12, placement=SparkPlacement(spark),
            output=lambda r, s, l: pids.append(int(l.split()[1])) if l.startswith("PID ") else None,
        )
    assert time.monotonic() - started < EARLY
    assert len(pids) == 2 and _wait_dead(pids) == []
    assert no_active_jobs(spark)


def test_losing_the_hub_connection_kills_the_ranks(spark):
    """What a killed driver does to the executors: the hub's connections drop without a STOP."""
    pids = []
    request = LaunchRequest(FunctionTarget(_fail_on_rank_1, (300.0,)), 2, start_timeout=60)
    placement = SparkPlacement(spark)
    job = Job(request, placement,
              output=lambda r, s, l: pids.append(int(l.split()[1])) if l.startswith("PID ") else None)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(_capture(job.run)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while len(pids) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == 2, "ranks did not start"
    placement.stop = lambda: None  # no Spark cancellation: only the dropped connection acts
    job._stopping = True  # and no STOP frame from the engine
    job.hub.close()
    assert _wait_dead(pids) == [], "ranks survived the loss of the driver hub"
    runner.join(60)
    assert not runner.is_alive()
    assert no_active_jobs(spark), "the barrier tasks did not end after their ranks"


def _capture(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001
        return exc


def _jobs_submitted(spark):
    return spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()


def test_more_processes_than_slots_fails_at_once_saying_what_to_change(spark):
    before = _jobs_submitted(spark)
    with pytest.raises(LaunchValidationError) as info:
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=False).run(lambda: 1)
    assert _jobs_submitted(spark) == before, "a slot shortage must fail before any Spark job"
    message = str(info.value)
    assert "num_processes=3 needs 3 Spark barrier tasks" in message
    assert ("only 2 task slot(s): 2 executor(s) registered, spark.task.cpus=1, "
            "spark.task.resource.gpu.amount=2") in message
    assert "Lower num_processes to at most 2" in message


def _gpu_env():
    return {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                           "WORLD_SIZE", "CUDA_VISIBLE_DEVICES")}


def test_multi_gpu_tasks_run_one_rank_per_spark_gpu(spark):
    """spark.task.resource.gpu.amount=2: 4 ranks in 2 tasks; each task's ranks see its 2 GPUs."""
    envs = run_function(_gpu_env, num_processes=4, use_gpu=True, return_all=True,
                        placement=SparkPlacement(spark), output=lambda *a: None)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"} and {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0,1"}  # the addresses Spark assigned


def test_gpu_ranks_must_fill_whole_tasks(spark):
    with pytest.raises(LaunchValidationError, match="num_processes=3 is not a multiple of spark.task.resource.gpu.amount=2"):
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=True).run(_gpu_env)


def test_executor_python_without_a_required_module_is_reported(spark):
    started = time.monotonic()
    with pytest.raises(SparkPlacementError) as info:  # reported by the tasks, not timed out
        run_function(lambda: 1, num_processes=2, start_timeout=4 * EARLY,
                     placement=SparkPlacement(spark, required_modules=("torch", "no_such_module_xyz")))
    message = str(info.value)
    assert message.startswith("The executors' Python (")
    assert "has no 'no_such_module_xyz' module" in message and "PYSPARK_PYTHON" in message
    assert "org.apache" not in message
    assert time.monotonic() - started < EARLY
    assert no_active_jobs(spark)


def _lightning_fit():
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    model = Tiny()
    devices = int(os.environ.get("FIT_DEVICES", "1"))
    nodes = int(os.environ.get("FIT_NODES", "1"))
    trainer = L.Trainer(
        accelerator="cpu", strategy="ddp", devices=devices, num_nodes=nodes, max_epochs=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    weights = model.layer.weight.detach().flatten()
    gathered = trainer.strategy.all_gather(weights)
    return trainer.global_rank, trainer.world_size, trainer.node_rank, gathered.tolist()


def test_lightning_ddp_fit_on_the_cluster(spark, monkeypatch):
    pytest.importorskip("lightning", reason="lightning is an optional test extra: pip install lightning")
    request = LaunchRequest(FunctionTarget(_lightning_fit), 2, env={"FIT_DEVICES": "1", "FIT_NODES": "2"})
    rank, world, node, gathered = Job(request, SparkPlacement(spark), output=lambda *a: None).run()
    assert (rank, world, node) == (0, 2, 0)
    assert len(gathered) == 2 and gathered[0] == gathered[1], "DDP replicas diverged"


def test_sigkill_of_the_driver_leaves_nothing_on_the_executors(tmp_path):
    """A driver process with its own local-cluster is SIGKILLed mid-job: ranks, executors and
    JVMs must all go away."""
    env = {**os.environ, **SPARK_TEST_ENV, "SPARK_HOME": str(mirror_spark_home(tmp_path))}
    driver = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "spark_killed_driver.py")], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(tmp_path),
    )
    pids, tree = [], []
    try:
        deadline = time.monotonic() + 150
        while len(pids) < 2 and time.monotonic() < deadline:
            line = driver.stdout.readline()
            if not line:
                break
            if "PID" in line:
                pids.append(int(line.rsplit(" ", 1)[1]))
        assert len(pids) == 2, "ranks did not start"
        tree = descendants(driver.pid)
        assert all(alive(pid) for pid in pids)
        assert all(pid in tree for pid in pids), "ranks should run under the executors' JVMs"
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        assert _wait_dead(pids) == [], f"orphaned ranks: {pids}"
        assert _wait_dead(tree, 120) == [], "Spark JVMs or Python workers outlived the driver"
    finally:
        kill_tree([p for p in pids + tree if alive(p)])
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stdout.close()


# ---- elastic jobs: workers in plain tasks, a failed worker replaced inside its task ----------
class _PlacementDriver:
    """The part of the engine an elastic placement talks to, without rounds: a real hub that
    hands each worker its payload and keeps results, and the sink of the tasks' events."""

    def __init__(self, fn):
        from distributor import payload, protocol
        from distributor.hub import DriverHub

        self.secret = protocol.new_secret()
        self._payload = protocol.payload_frame(protocol.PayloadFlag.SEND_RESULT,
                                               payload.dumps_target(FunctionTarget(fn)))
        self.results, self.exits, self.lines = {}, {}, []
        self.changed = threading.Condition()
        self.hub = DriverHub(self.secret, self._on_frame, lambda channel: None)

    def _on_frame(self, channel, kind, body):
        import pickle

        from distributor.protocol import Kind

        if kind == Kind.HELLO:
            channel.send(Kind.PAYLOAD, self._payload, raw=True)
        elif kind == Kind.RESULT:
            with self.changed:
                self.results[len(self.results)] = pickle.loads(body)
                self.changed.notify_all()

    def on_output(self, rank, stream, line):
        with self.changed:
            self.lines.append((rank, stream, line))
            self.changed.notify_all()

    def on_exit(self, rank, returncode):
        with self.changed:
            self.exits[rank] = returncode
            self.changed.notify_all()

    def wait(self, predicate, timeout=120.0):
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), (self.exits, self.lines)


def _worker_that_dies_once():
    rank = int(os.environ["RANK"])
    print(f"worker {rank} pid {os.getpid()} in {os.getppid()} "
          f"elastic={os.environ.get('DISTRIBUTOR_ELASTIC')}", flush=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 4:
        time.sleep(120)  # until the driver stops it
    return rank, os.getppid(), sorted(k for k in os.environ if k.startswith("DISTRIBUTOR_") and k != "DISTRIBUTOR_ELASTIC")


def test_elastic_placement_replaces_a_killed_worker_inside_its_task(spark):
    from distributor.elastic.policy import ElasticPolicy
    from distributor.launchers import PythonLauncher
    from distributor.placement import JobContext
    from distributor.placement.spark_elastic import SparkElasticPlacement

    driver = _PlacementDriver(_worker_that_dies_once)
    request = LaunchRequest(FunctionTarget(_worker_that_dies_once), 2,
                            elastic=ElasticPolicy(min_workers=1, max_workers=2))
    placement = SparkElasticPlacement(spark)
    placement.start(JobContext(request, "elastic-test", driver.hub.address, driver.secret, driver,
                               PythonLauncher()))
    try:
        driver.wait(lambda: 1 in driver.exits and 0 in driver.exits)
        assert driver.exits == {0: 0, 1: -signal.SIGKILL}
        hosts = placement.discover()
        assert hosts == {"task0": 1, "task1": 1}, hosts  # each task is a host, one slot each
        assert placement.worker_hosts(request) == ["task0", "task1"]
        placement.add_worker(2, "task1")  # what the engine does with a failed worker's host
        driver.wait(lambda: 2 in driver.exits)
        assert driver.exits[2] == 0
        started = {r: line.split() for r, _, line in driver.lines if line.startswith("worker")}
        parents = {r: int(words[5]) for r, words in started.items()}
        assert parents[2] == parents[1] != parents[0], "the replacement must run in worker 1's task"
        assert {words[6] for words in started.values()} == {"elastic=1"}
        assert sorted((r[0], r[2]) for r in driver.results.values()) == [(0, []), (2, [])]
        placement.add_worker(3, "task9")  # no such task: fails at once, not silently
        driver.wait(lambda: 3 in driver.exits)
        assert driver.exits[3] == 127
        placement.add_worker(4, "task0")
        driver.wait(lambda: any(r == 4 for r, _, line in driver.lines))
        placement.stop_worker(4)
        driver.wait(lambda: 4 in driver.exits)
        assert driver.exits[4] == -signal.SIGTERM
        started = {r: line.split() for r, _, line in driver.lines if line.startswith("worker")}
    except BaseException:
        placement.stop()
        raise
    finally:
        placement.close()  # the tasks see their connection close and return
        driver.hub.close()
    assert placement.failure() is None and placement.finished()
    assert sorted(report["ranks"] for report in placement.task_reports) == [[0, 4], [1, 2]]
    assert no_active_jobs(spark)
    assert _wait_dead([int(words[3]) for words in started.values()]) == []


@pytest.mark.skipif(CI, reason=(
    "kills one of the module's two executor JVMs: the next Spark job waits ~60 s for the "
    "standalone worker's new one; CI covers a lost Python worker (tests/chaos)"))
def test_a_lost_executor_ends_a_torch_distributor_job_naming_its_rank(spark, tmp_path):
    """Runs last in this module. Rank 1's executor JVM is SIGKILLed: its rank goes with it, rank 0
    gets gloo's transport error (a knock-on naming no peer); the job names rank 1 as lost."""
    lost = str(tmp_path / "lost")
    with pytest.raises(RankFailedError) as info:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
            lose_the_executor_at_step_5, lost, "torch")
    seconds = time.time() - float(Path(lost).read_text())
    first = str(info.value).splitlines()[0]
    assert info.value.rank == 1 and "was lost" in first, str(info.value)[-3000:]
    assert seconds < 10, (seconds, first)
    assert "ExecutorLostFailure" in first, first  # Spark's word for it, not a guess from timing
    print(f"lost executor: the job ended {seconds:.2f} s after the kill: {first}")
