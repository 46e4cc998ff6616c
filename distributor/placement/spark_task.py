"""What runs inside each Spark barrier task: a supervisor for this task's ranks.

The task connects to the driver hub with the job secret, finds its host and a free port and
exchanges them with the other tasks through the hub (a gather like `BarrierTaskContext.allGather`,
without its 1 s polling steps), works out its ranks (`spark_plan.plan_ranks`), starts its ranks with the job's launcher under a `Supervisor`, and forwards every output line and
exit to the hub. A STOP from the driver, or the loss of the hub connection (driver killed),
stops the ranks at once; and the ranks die with this Python worker if Spark kills the task.

`run_elastic` is the task of an elastic job (`spark_elastic.py`): no gather, no rank plan; it
starts and stops the workers the driver names, and outlives their failures.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

import cloudpickle

from .. import protocol
from ..protocol import Channel, Kind
from ..rank_env import GPU_IDS_VAR, HUB_ADDRESS_VAR, RANK_VAR, SECRET_VAR, free_port, rank_environment
from ..spec import RankSpec
from ..supervisor import Supervisor
from .spark_plan import GPU_RESOURCE, NOT_STARTED, TASK_ERROR_MARKER, TaskSlot, plan_ranks


class _HubForwarder:
    """A `RankEventSink` that sends the supervisor's events to the driver hub."""

    def __init__(self, channel: Channel, ranks: Iterable[int]) -> None:
        self.channel = channel
        self._pending = set(ranks)
        self._lock = threading.Lock()
        self.all_exited = threading.Event()
        if not self._pending:
            self.all_exited.set()

    def on_output(self, rank: int, stream: str, line: str) -> None:
        try:
            self.channel.send(Kind.OUTPUT, (rank, stream, line))
        except OSError:
            pass  # the driver is gone; the hub watcher stops the ranks

    def on_exit(self, rank: int, returncode: int) -> None:
        try:
            self.channel.send(Kind.EXITED, (rank, returncode))
        except OSError:
            pass
        with self._lock:
            self._pending.discard(rank)
            if not self._pending:
                self.all_exited.set()


def _own_host(context: Any) -> str:
    """The address Spark knows this task's executor by (reachable from the other executors)."""
    try:
        address = context.getTaskInfos()[context.partitionId()].address
        host = address.rsplit(":", 1)[0]
        if host:
            return host
    except Exception:  # noqa: BLE001 - fall back to what this host calls itself
        pass
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostbyname(socket.gethostname())


def _task_gpus(context: Any) -> List[str]:
    resources = context.resources()
    info = resources.get(GPU_RESOURCE)
    return list(info.addresses) if info is not None else []


def _free_port_on(host: str) -> int:
    """A port free on `host` (on every interface if `host` is not an address of this machine)."""
    try:
        return free_port(host)
    except OSError:
        return free_port("0.0.0.0")


def _watch_hub(channel: Channel, supervisor: Supervisor, done: threading.Event,
               stopped: threading.Event, remote: "_RemoteCommands") -> None:
    """Run remote-shell commands the hub sends; stop the ranks on STOP or when the connection drops."""
    try:
        while True:
            kind, body = channel.recv()
            if kind == Kind.STOP:
                break
            if kind == Kind.SPAWN:
                remote.run(*body)
    except (ConnectionError, OSError):
        pass
    stopped.set()
    remote.stop()
    if not done.is_set():
        supervisor.stop(grace=2.0)


class _RemoteCommands:
    """Commands run in this task for another task's mpirun (its per-host daemon, `prted`).

    Their output goes to the driver as launcher lines; their exit status goes back to the
    remote shell that asked, through the hub.
    """

    def __init__(self, channel: Channel, extra_env: Mapping[str, str]) -> None:
        self._channel = channel
        self._env = {**os.environ, **extra_env}
        self._procs: List[subprocess.Popen] = []
        self._changed = threading.Condition()
        self._running = 0
        self._started = False
        self._stopped = False

    def run(self, spawn_id: int, command: str) -> None:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], env=self._env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
        with self._changed:
            self._procs.append(proc)
            self._running += 1
            self._started = True
        pumps = [threading.Thread(target=self._pump, args=(stream, pipe), daemon=True)
                 for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr))]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._wait, args=(spawn_id, proc, pumps), daemon=True).start()

    def _pump(self, stream: str, pipe: Any) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                try:
                    self._channel.send(Kind.OUTPUT, (None, stream, line))
                except OSError:
                    pass

    def _wait(self, spawn_id: int, proc: subprocess.Popen, pumps: List[threading.Thread]) -> None:
        status = proc.wait()
        for pump in pumps:
            pump.join(timeout=5.0)
        try:
            self._channel.send(Kind.SPAWN_EXIT, (spawn_id, status if status >= 0 else 128 - status))
        except OSError:
            pass
        with self._changed:
            self._running -= 1
            self._changed.notify_all()

    def wait_done(self) -> None:
        """Until every command asked of this task has ended (at least one was), or `stop()`."""
        with self._changed:
            self._changed.wait_for(lambda: self._stopped or (self._started and not self._running))

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _gather_slots(channel: Channel, context: Any, partition: int, mine: TaskSlot) -> Optional[List[TaskSlot]]:
    """Every task's slot in partition order, exchanged through the driver hub (see
    `hub.TaskRendezvous`); None if the driver stops the job first."""
    tasks = len(context.getTaskInfos())
    offer = {"host": mine.host, "port": mine.port, "gpus": list(mine.gpus)}
    channel.send(Kind.SLOT, ((context.stageId(), context.attemptNumber()), partition, tasks, offer))
    while True:
        kind, body = channel.recv()
        if kind == Kind.SLOTS:
            return [TaskSlot(d["host"], int(d["port"]), tuple(d["gpus"])) for d in body]
        if kind == Kind.STOP:
            return None


def _connect_to_driver(address: Any, secret_hex: str, partition: int, host: str) -> Channel:
    """An authenticated connection to the driver's hub at `address`, or one marked sentence."""
    try:
        return protocol.connect((address[0], int(address[1])), bytes.fromhex(secret_hex))
    except OSError as exc:
        raise RuntimeError(
            f"{TASK_ERROR_MARKER} Spark task {partition} on {host} could not reach the driver hub "
            f"at {address[0]}:{address[1]} ({exc}). Set spark.driver.host (and "
            "spark.driver.bindAddress) to an address of the driver that the executors can reach."
        ) from None


def _task_launcher(config: Mapping[str, Any]) -> Any:
    """The job's launcher, adapted to this executor's Python."""
    launcher = cloudpickle.loads(config["launcher"])
    if launcher.capabilities.runs_executor_python:
        launcher.on_executor(sys.executable, config["driver_python"])
    return launcher


def run(config: Mapping[str, Any], _rows: Iterator[Any]) -> Iterator[str]:
    """Body of one barrier task: runs its ranks to their end, then yields one JSON line naming
    its partition, host and ranks (their outcomes went to the driver through the hub)."""
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    partition = context.partitionId()
    use_gpu = bool(config["use_gpu"])
    per_task = int(config["ranks_per_task"])
    host = _own_host(context)
    mine = TaskSlot(host, _free_port_on(host), tuple(_task_gpus(context)) if use_gpu else ())

    hub = tuple(config["hub_address"])
    channel = _connect_to_driver(hub, config["secret"], partition, host)
    slots = _gather_slots(channel, context, partition, mine)
    if slots is None:  # the driver stopped the job while the tasks were gathering
        channel.close()
        yield json.dumps({"partition": partition, "host": host, "ranks": []})
        return
    plan = plan_ranks(slots, per_task, use_gpu, config["node_per"])
    specs: List[RankSpec] = plan[partition]
    master_addr, master_port = slots[0].host, slots[0].port

    launcher = _task_launcher(config)
    if config["reuse_worker"]:
        launcher.in_reused_worker()
    # A launcher that spans tasks (mpirun) is started by task 0 alone, which then reports every
    # rank; the other tasks only host what it asks them to run.
    spans = launcher.capabilities.spans_tasks
    reported = [s.rank for task in plan for s in task] if partition == 0 else []
    channel.send(Kind.AGENT, (partition, [s.rank for s in specs]))
    reported = reported if spans else [s.rank for s in specs]
    forwarder = _HubForwarder(channel, reported)
    supervisor = Supervisor(forwarder)
    remote = _RemoteCommands(channel, {GPU_IDS_VAR: ",".join(mine.gpus)} if use_gpu else {})
    stopped = threading.Event()
    threading.Thread(
        target=_watch_hub, args=(channel, supervisor, forwarder.all_exited, stopped, remote),
        name="distributor-hub-watch", daemon=True,
    ).start()
    hub_text = f"{hub[0]}:{hub[1]}"

    def env_for(spec: RankSpec) -> Dict[str, str]:
        env = rank_environment(spec, master_addr, master_port, config["run_id"], config["env"])
        env[HUB_ADDRESS_VAR] = hub_text
        env[SECRET_VAR] = config["secret"]
        env[RANK_VAR] = str(spec.rank)
        return env

    try:
        if stopped.is_set():  # the job ended before this task got going: start nothing
            raise RuntimeError("the driver stopped the job before these ranks started")
        if not spans:
            launcher.start(specs, env_for, supervisor)
        elif partition == 0:
            launcher.start_across_tasks(plan, env_for, supervisor)
        if stopped.is_set():
            supervisor.stop(grace=1.0)  # a STOP that raced with the start
    except Exception as exc:  # noqa: BLE001 - reported to the driver as this task's ranks' failure
        started = supervisor.pids()
        supervisor.stop(grace=1.0)
        for rank in reported:
            if rank not in started:
                forwarder.on_output(rank, "stderr", f"could not start rank {rank} on {host}: {exc!r}")
                forwarder.on_exit(rank, NOT_STARTED)
    forwarder.all_exited.wait()
    if spans:  # the daemons mpirun started here end with its job (or with a STOP)
        remote.wait_done()  # `_watch_hub` stops it on STOP or when the driver is gone
        remote.stop()
    try:  # (a connection that ends without it: this task's process died, or its network)
        channel.send(Kind.TASK_DONE, (partition,))
    except OSError:
        pass  # the driver is gone
    channel.close()
    yield json.dumps({"partition": partition, "host": host, "ranks": [s.rank for s in specs]})


def run_elastic(config: Mapping[str, Any], _rows: Iterator[Any]) -> Iterator[str]:
    """Body of one task of an elastic job (a plain, non-barrier task): a supervisor that starts
    and stops the workers the driver asks for, until the driver ends the job.

    The task announces itself (`SLOT`) on the placement's control connection, then obeys
    `WORKER` frames: ("start", RankSpec) starts that worker here with the job's launcher (the
    environment contract of a fixed-size job plus `DISTRIBUTOR_ELASTIC=1`), ("stop", worker id)
    stops one. A worker that fails is reported (`EXITED`) and the task stays, so that the driver
    can start its replacement here: a worker's failure never fails the task. STOP, or the loss of
    the connection, stops the workers and ends the task.
    """
    from pyspark import TaskContext

    from ..worker import ELASTIC_VAR

    context = TaskContext.get()
    partition, attempt = context.partitionId(), context.attemptNumber()
    host = _own_host(context)
    gpus = _task_gpus(context) if config["use_gpu"] else []
    channel = _connect_to_driver(config["control_address"], config["secret"], partition, host)
    offer = {"host": host, "port": 0, "gpus": gpus}
    channel.send(Kind.SLOT, ((context.stageId(), attempt), partition, None, offer))

    launcher = _task_launcher(config)
    forwarder = _HubForwarder(channel, ())
    supervisor = Supervisor(forwarder)
    hub_text = "{}:{}".format(*config["hub_address"])

    def env_for(spec: RankSpec) -> Dict[str, str]:
        # MASTER_ADDR/PORT and RANK are placeholders until the worker's first round
        # (`worker.join_world` sets the round's, with the job's store as master).
        env = rank_environment(spec, config["hub_address"][0], 0, config["run_id"], config["env"])
        env.update({HUB_ADDRESS_VAR: hub_text, SECRET_VAR: config["secret"],
                    RANK_VAR: str(spec.rank), ELASTIC_VAR: "1"})
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        return env

    if config["reuse_worker"]:
        launcher.in_reused_worker()  # replacements fork from the Python worker's warm server
    else:
        launcher.keep_warm(env_for(RankSpec(0, 1, 0, 1, 0, 1)))  # ... or from this task's
    started: List[int] = []
    try:
        while True:
            kind, body = channel.recv()
            if kind == Kind.STOP:
                break
            if kind != Kind.WORKER:
                continue
            action, what = body
            if action == "stop":
                threading.Thread(target=supervisor.stop, args=([what],), daemon=True).start()
                continue
            try:
                launcher.start([what], env_for, supervisor)
                started.append(what.rank)
            except Exception as exc:  # noqa: BLE001 - the driver sees this worker fail to start
                forwarder.on_output(what.rank, "stderr",
                                    f"could not start worker {what.rank} on {host}: {exc!r}")
                forwarder.on_exit(what.rank, NOT_STARTED)
    except (ConnectionError, OSError):
        pass  # the driver ended the job (or is gone): nothing here may outlive it
    finally:
        supervisor.stop(grace=2.0)
        launcher.release()
        channel.close()
    yield json.dumps({"partition": partition, "attempt": attempt, "host": host, "ranks": started})
