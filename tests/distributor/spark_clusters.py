"""Spark sessions and clusters for the Spark placement tests, stopped by PID so that no JVM
outlives the tests.

A JVM start costs ~15-30 s of a 2-core machine (a local-cluster's three JVMs more), so the test
modules that need the same plain session share one per test process (`shared_session`): the
`local[2]` modules (the DataFrame, drop-in, estimator and local-master tests) one `local[2]`, the
modules on a plain `local-cluster[2,1,1024]` (horovod.spark.run, HorovodRunner) one of those, the
standalone modules one master and worker (`shared_standalone_session`). Each such module says so
with ``pytest.mark.shares``, so that one worker runs the modules of a kind one after another
(tests/scheduling.py).
Between two such modules the session is parked: hidden from pyspark (no active SparkContext or
SparkSession, so a later module that checks the "no Spark" paths sees none), its JVMs kept. The
next module that wants the same kind takes it back after a health check (context not stopped,
every executor registered, else a fresh one); a module that wants another session, or any
`start_session` call, stops the parked one first; the test session's end stops it (by PID).
Modules whose cluster differs (fake GPUs, a killed driver, several hosts) start their own.

Only one SparkContext can exist per process, so a module-scoped session and a shared one never
coexist. Everything listens on 127.0.0.1, and the executors' work directories go to a temporary
folder rather than into pyspark's site-packages folder (a local-cluster's workers put them under
SPARK_HOME, so SPARK_HOME points at a temporary mirror of the pip pyspark folder).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pyspark

from distributor import procfs
from distributor.rank_env import free_port

PYSPARK_DIR = Path(pyspark.__file__).parent

#: Two executor JVMs of one core and 1 GiB each, started by the driver JVM's own standalone worker.
LOCAL_CLUSTER = "local-cluster[2,1,1024]"

#: JVM options for every test JVM: C1 only and the serial collector start a JVM about twice as
#: fast on 2 cores, and short test jobs never profit from C2 or parallel GC.
FAST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: PYSPARK_SUBMIT_ARGS for a script that starts its own SparkSession (Horovod's examples, run
#: unchanged): the settings `start_session` gives the tests' own sessions, FAST_JVM_OPTS included.
SUBMIT_ARGS = (
    "--conf spark.ui.enabled=false --conf spark.driver.host=127.0.0.1 "
    "--conf spark.executor.memory=512m "
    f"--driver-java-options '{FAST_JVM_OPTS}' --conf 'spark.executor.extraJavaOptions={FAST_JVM_OPTS}' "
    "pyspark-shell"
)

#: Environment every Spark JVM and Python worker of the tests gets.
SPARK_TEST_ENV = {
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "SPARK_LOCAL_IP": "127.0.0.1",
    "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
}


def mirror_spark_home(root: Path) -> Path:
    """A SPARK_HOME made of symlinks to the pip pyspark folder, with its own `work` folder."""
    home = root / "spark-home"
    home.mkdir(parents=True, exist_ok=True)
    for entry in PYSPARK_DIR.iterdir():
        if entry.name in ("work", "__pycache__"):
            continue
        link = home / entry.name
        if not link.exists():
            link.symlink_to(entry)
    (home / "work").mkdir(exist_ok=True)
    return home


class EnvPatch:
    """Set environment variables now; `restore()` puts the previous values back."""

    def __init__(self, values: Dict[str, str]) -> None:
        self._saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)

    def restore(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_session(master: str, app_name: str, conf: Optional[Dict[str, str]] = None,
                  executors: int = 0, timeout: float = 120.0):
    """A SparkSession on `master`; waits until `executors` executors have registered."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    stop_shared()  # a parked shared session is hidden, but its JVM would refuse a second context
    if SparkContext._active_spark_context is not None:  # getOrCreate would hand back that one
        raise RuntimeError(
            f"a SparkContext on {SparkContext._active_spark_context.master} is already active in "
            f"this process; stop it before starting one on {master}"
        )
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", FAST_JVM_OPTS)
        .config("spark.executor.extraJavaOptions", FAST_JVM_OPTS)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + timeout
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) - 1 < executors:
        if time.monotonic() > deadline:
            stop_session(spark)
            raise RuntimeError(f"{executors} executors did not register with {master} in {timeout}s")
        time.sleep(0.2)
    return spark


@contextlib.contextmanager
def local_spark(app_name: str, master: str = "local[2]"):
    """A SparkSession on `master` with the tests' environment, stopped (JVM too) afterwards."""
    env = EnvPatch(SPARK_TEST_ENV)
    session = start_session(master, app_name)
    try:
        yield session
    finally:
        stop_session(session)
        env.restore()


def stop_session(spark) -> None:
    """Stop the session and its JVM (by PID), so that the next module can start another."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    try:
        spark.stop()
    finally:
        if gateway is not None:
            try:
                gateway.shutdown()
            except Exception:  # noqa: BLE001
                pass
        if proc is not None:
            try:
                proc.stdin.close()  # the gateway JVM exits when its stdin closes
            except Exception:  # noqa: BLE001
                pass
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        SparkContext._gateway = None
        SparkContext._jvm = None


def _ancestor_with(pid: int, word: bytes) -> int:
    """The nearest process above `pid` whose command line holds `word`."""
    while pid > 1:
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if word in cmdline.read():
                return pid
    raise RuntimeError(f"no process above with {word.decode()!r} in its command line")


def executor_jvm_of(pid: int) -> int:
    """The executor JVM (CoarseGrainedExecutorBackend) that process `pid` runs under (called in
    a rank, which SIGKILLs it to lose its executor)."""
    return _ancestor_with(pid, b"CoarseGrainedExecutorBackend")


def python_worker_of(pid: int) -> int:
    """The Spark Python worker that process `pid` runs under: the nearest process above it with
    PySpark's daemon's command line, which the workers it forks keep (called in a rank, which
    SIGKILLs it to lose its task's Python worker)."""
    return _ancestor_with(pid, b"pyspark.daemon")


def join_the_job(api: str = "horovod") -> tuple:
    """In a rank: join the job on Horovod's API or (``api="torch"``) torch.distributed's, whose
    transport errors name no peer; return (rank, an allreduce of one tensor)."""
    if api == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        return dist.get_rank(), dist.all_reduce
    import horovod.torch as hvd

    hvd.init()
    return hvd.rank(), lambda tensor: hvd.allreduce(tensor, name="step")


def lose_the_executor_at_step_5(lost: str, api: str = "horovod") -> int:
    """A rank program for the lost-executor tests (`join_the_job`): an allreduce every 20 ms; at
    step 5 rank 1 SIGKILLs its executor's JVM (noting the time in the file `lost`) and dies with
    it."""
    import signal
    import time

    import torch

    rank, allreduce = join_the_job(api)
    for step in range(400):
        allreduce(torch.ones(1))
        if step == 5 and rank == 1:
            with open(lost, "w") as f:
                f.write(str(time.time()))
            os.kill(executor_jvm_of(os.getpid()), signal.SIGKILL)
            time.sleep(60)  # dies with its executor
        time.sleep(0.02)
    return rank


def elastic_train(marker, steps, executor_of=None, victim=1, world=2):
    """(w - 1)^2 on every worker, so the averaged gradient does not depend on the world size: after
    S committed steps from w = 0 with lr 0.1, w = 1 - 0.8**S exactly when each step counted once.
    The first worker to reach step 5 as rank `victim` SIGKILLs itself once (`marker` records it),
    or with `executor_of` (`executor_jvm_of`, passed as an argument so that it travels by value)
    its executor's JVM, and every worker of that executor with it; the loop goes on past `steps`
    until the replacements are back in the world (size `world`), for at most 150 s (then the
    test's size check fails instead of the job running until the test's timeout)."""
    import os
    import signal
    import socket
    import time

    import torch

    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    print(f"joined as rank {hvd.rank()} of {hvd.size()}", flush=True)
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append((hvd.size(), time.time()))])
    give_up = time.monotonic() + 150

    @hvd.elastic.run
    def train(state):
        while state.step < steps or (hvd.size() < world and time.monotonic() < give_up):
            if state.step == 5 and hvd.rank() == victim and not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(str(time.time()))
                os.kill(executor_of(os.getpid()) if executor_of else os.getpid(),
                        signal.SIGKILL)
                time.sleep(60)  # dies with its executor
            opt.zero_grad()
            ((model.weight - 1.0) ** 2).sum().backward()
            opt.step()
            state.step += 1
            state.commit()
            time.sleep(0.02)
        return state.step, hvd.size(), model.weight.item()

    step, size, weight = train(state)
    return {"step": step, "size": size, "weight": weight, "rank": hvd.rank(), "resets": resets,
            "host": socket.gethostname()}


def descendants(pid: int) -> List[int]:
    """Every live descendant of `pid` (from /proc)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        fields = procfs.stat_fields(int(entry)) if entry.isdigit() else None
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


alive = procfs.alive


def kill_tree(pids: List[int], timeout: float = 15.0) -> None:
    """SIGTERM then SIGKILL `pids`, waiting for them to go."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not any(alive(p) for p in pids):
            return


def wait_port(address: str, port: int, timeout: float, procs: List[subprocess.Popen] = (),
              log: Optional[Path] = None) -> None:
    """Wait until something listens on address:port; raise (with the end of `log`) if one of
    `procs`, the process that should listen, exits first, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            said = log.read_text()[-2000:] if log is not None else ""
            raise RuntimeError(f"the process that should listen on {address}:{port} exited: {said}")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {address}:{port} after {timeout}s")


class StandaloneCluster:
    """A Spark standalone master and one worker on 127.0.0.1, started with pyspark's spark-class."""

    def __init__(self, root: Path, cores: int = 2, memory: str = "2g") -> None:
        self.root = root
        self.home = mirror_spark_home(root)
        self.work_dir = root / "worker-work"
        self.work_dir.mkdir(exist_ok=True)
        self.master_port = free_port()
        self.url = f"spark://127.0.0.1:{self.master_port}"
        env = {**os.environ, **SPARK_TEST_ENV, "SPARK_HOME": str(self.home),
               "SPARK_LOG_DIR": str(root / "logs"), "SPARK_NO_DAEMONIZE": "1",
               "SPARK_DAEMON_JAVA_OPTS": FAST_JVM_OPTS, "SPARK_DAEMON_MEMORY": "512m"}
        spark_class = str(self.home / "bin" / "spark-class")
        self.procs: List[subprocess.Popen] = []
        self._logs = []
        self.procs.append(self._start(spark_class, env, "master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.master_port), "--webui-port", str(free_port()),
        ]))
        wait_port("127.0.0.1", self.master_port, 60.0, self.procs, self.root / "master.log")
        self.procs.append(self._start(spark_class, env, "worker", [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", str(cores), "--memory", memory, "--work-dir", str(self.work_dir), self.url,
        ]))

    def _start(self, spark_class: str, env: dict, name: str, args: List[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        self._logs.append(log)
        return subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        """Stop the worker (and its executors) and the master, by PID."""
        for proc in reversed(self.procs):
            tree = [proc.pid] + descendants(proc.pid)
            kill_tree(tree)
            proc.wait()
        for log in self._logs:
            log.close()


class _Shared:
    """The test process's shared session: its kind (master or "standalone", executors), the
    session, the folder of its SPARK_HOME mirror, its standalone cluster if any, the environment
    patch while a module holds it, and what it hid from pyspark while parked."""

    def __init__(self, kind: tuple, executors: int, root: Path, session, env: EnvPatch,
                 cluster: Optional["StandaloneCluster"] = None) -> None:
        self.kind, self.executors, self.root, self.session = kind, executors, root, session
        self.cluster = cluster
        self.env: Optional[EnvPatch] = env
        self.hidden: Optional[tuple] = None
        gateway = getattr(session.sparkContext, "_gateway", None)
        self.jvm = getattr(gateway, "proc", None)  # the driver JVM, parent of every other one

    def park(self) -> None:
        """Hide the session from pyspark (no active context or session: a later module sees no
        Spark, as after a stop) and give the environment back; the JVMs keep running."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        if self.hidden is None:
            self.hidden = (SparkContext._active_spark_context, SparkSession._instantiatedSession,
                           SparkSession._activeSession)
            SparkContext._active_spark_context = None
            SparkSession._instantiatedSession = SparkSession._activeSession = None
        if self.env is not None:
            self.env.restore()
            self.env = None

    def unhide(self) -> None:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        if self.hidden is not None:
            (SparkContext._active_spark_context, SparkSession._instantiatedSession,
             SparkSession._activeSession) = self.hidden
            self.hidden = None

    def take_back(self) -> bool:
        """Unhide the session for the next module; False if it is no longer whole (a module
        stopped it, its JVM died, or an executor it killed has not come back)."""
        self.unhide()
        sc = self.session.sparkContext
        if self.jvm is None or self.jvm.poll() is not None or sc._jsc is None:
            return False
        if self.cluster is not None and any(p.poll() is not None for p in self.cluster.procs):
            return False
        try:
            jsc = sc._jsc.sc()
            if jsc.isStopped() or len(jsc.statusTracker().getExecutorInfos()) - 1 < self.executors:
                return False
        except Exception:  # noqa: BLE001 - a gateway that no longer answers: start afresh
            return False
        home = self.cluster.home if self.cluster is not None else self.root / "spark-home"
        self.env = EnvPatch({**SPARK_TEST_ENV, "SPARK_HOME": str(home)})
        return True


_shared: Optional[_Shared] = None
_stop_at_session_end = False


@contextlib.contextmanager
def shared_session(request, master: str = "local[2]", executors: int = 0) -> Iterator[object]:
    """The test process's shared SparkSession on `master` (with `executors` registered), for one
    test module: in a module-scoped fixture, ``with shared_session(request) as spark: yield
    spark``. Started on first use, parked after the module, taken back by the next module of the
    same kind, stopped (JVMs by PID) when another kind or `start_session` needs the process's one
    SparkContext, and at the end of the test session. A module that changes the session for good
    (stops it, kills an executor) leaves it to be checked and replaced, not reused broken."""
    with _shared_kind(request, (master,), executors) as shared:
        yield shared.session


@contextlib.contextmanager
def shared_standalone_session(request, cores: int = 2) -> Iterator[tuple]:
    """(StandaloneCluster, SparkSession): the test process's shared standalone master and worker
    (`cores` cores) with a session on them, for one test module, as `shared_session`; stopped
    and checked gone (by PID) with the session."""
    with _shared_kind(request, ("standalone", cores), 1) as shared:
        yield shared.cluster, shared.session


@contextlib.contextmanager
def _shared_kind(request, kind: tuple, executors: int) -> Iterator[_Shared]:
    global _shared, _stop_at_session_end
    shared = _shared
    if shared is not None and (shared.kind != kind or shared.executors != executors
                               or not shared.take_back()):
        stop_shared()
        shared = None
    if shared is None:
        root = Path(tempfile.mkdtemp(prefix="spark-shared-"))
        cluster = env = None
        try:
            if kind[0] == "standalone":
                cluster = StandaloneCluster(root, cores=kind[1], memory="2g")
                env = EnvPatch({**SPARK_TEST_ENV, "SPARK_HOME": str(cluster.home)})
                session = start_session(cluster.url, "tests' shared standalone", executors=executors,
                                        conf={"spark.cores.max": str(kind[1])})
            else:
                env = EnvPatch({**SPARK_TEST_ENV, "SPARK_HOME": str(mirror_spark_home(root))})
                session = start_session(kind[0], f"tests' shared {kind[0]}", executors=executors)
        except BaseException:
            if cluster is not None:
                cluster.stop()
            if env is not None:
                env.restore()
            shutil.rmtree(root, ignore_errors=True)
            raise
        shared = _shared = _Shared(kind, executors, root, session, env, cluster)
        if not _stop_at_session_end:
            _stop_at_session_end = True
            request.session.addfinalizer(_session_ended)
    try:
        yield shared
    finally:
        shared.park()


def _session_ended() -> None:
    global _stop_at_session_end
    _stop_at_session_end = False
    stop_shared()


def stop_shared() -> None:
    """Stop the shared session, if there is one, and every JVM and Python worker under its driver
    JVM (by PID), and remove its folder."""
    global _shared
    shared, _shared = _shared, None
    if shared is None:
        return
    shared.unhide()
    family = []
    if shared.jvm is not None and shared.jvm.poll() is None:
        family = [shared.jvm.pid] + descendants(shared.jvm.pid)
    if shared.cluster is not None:
        family += [p.pid for p in shared.cluster.procs]
        family += [d for p in shared.cluster.procs for d in descendants(p.pid)]
    try:
        stop_session(shared.session)
    except Exception:  # noqa: BLE001 - a broken session: its processes are killed below
        pass
    finally:
        if shared.cluster is not None:
            shared.cluster.stop()
        kill_tree([p for p in family if alive(p)])
        if shared.env is not None:
            shared.env.restore()
        shutil.rmtree(shared.root, ignore_errors=True)
    assert not [p for p in family if alive(p)], "the shared session's JVMs were left behind"


def no_active_jobs(spark, timeout: float = 60.0) -> bool:
    """Whether Spark lists no active job, waiting up to `timeout` seconds for it: the status
    tracker learns of a job's end from Spark's listener bus, asynchronously, so it may list a job
    for a moment after its action returned (longer on a loaded machine; no wait once it is done)."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not tracker.getActiveJobsIds()
