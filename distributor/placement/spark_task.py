"""What runs inside each Spark barrier task: a supervisor for this task's ranks.

The task finds its host and a free port, exchanges them with the other tasks (`allGather`),
works out its ranks (`spark_plan.plan_ranks`), connects to the driver hub with the job secret,
starts its ranks with the job's launcher under a `Supervisor`, and forwards every output line and
exit to the hub. A STOP from the driver, or the loss of the hub connection (driver killed),
stops the ranks at once; and the ranks die with this Python worker if Spark kills the task.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping

import cloudpickle

from .. import protocol
from ..protocol import Channel, Kind
from ..rank_env import HUB_ADDRESS_VAR, RANK_VAR, SECRET_VAR, free_port, rank_environment
from ..spec import RankSpec
from ..supervisor import Supervisor
from .spark_plan import GPU_RESOURCE, TaskSlot, plan_ranks

#: Exit status reported for a rank whose process could not be started at all.
NOT_STARTED = 127


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
               stopped: threading.Event) -> None:
    """Stop the ranks on a STOP frame or when the hub connection drops."""
    try:
        while True:
            kind, _ = channel.recv()
            if kind == Kind.STOP:
                break
    except (ConnectionError, OSError):
        pass
    stopped.set()
    if not done.is_set():
        supervisor.stop(grace=2.0)


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
    gathered = context.allGather(json.dumps({"host": mine.host, "port": mine.port, "gpus": mine.gpus}))
    slots = [TaskSlot(d["host"], int(d["port"]), tuple(d["gpus"])) for d in map(json.loads, gathered)]
    specs: List[RankSpec] = plan_ranks(slots, per_task, use_gpu, config["node_per"])[partition]
    master_addr, master_port = slots[0].host, slots[0].port

    secret = bytes.fromhex(config["secret"])
    hub = tuple(config["hub_address"])
    try:
        channel = protocol.connect((hub[0], int(hub[1])), secret)
    except OSError as exc:
        from .spark import TASK_ERROR_MARKER

        raise RuntimeError(
            f"{TASK_ERROR_MARKER} Spark task {partition} on {host} could not reach the driver hub "
            f"at {hub[0]}:{hub[1]} ({exc}). Set spark.driver.host (and spark.driver.bindAddress) "
            "to an address of the driver that the executors can reach."
        ) from None
    channel.send(Kind.AGENT, (specs[0].node_rank, [s.rank for s in specs]))
    forwarder = _HubForwarder(channel, [s.rank for s in specs])
    supervisor = Supervisor(forwarder)
    stopped = threading.Event()
    threading.Thread(
        target=_watch_hub, args=(channel, supervisor, forwarder.all_exited, stopped),
        name="distributor-hub-watch", daemon=True,
    ).start()

    launcher = cloudpickle.loads(config["launcher"])
    if getattr(launcher, "python", None) == config["driver_python"]:
        launcher.python = sys.executable  # the executor's interpreter, not the driver's path
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
        launcher.start(specs, env_for, supervisor)
        if stopped.is_set():
            supervisor.stop(grace=1.0)  # a STOP that raced with the start
    except Exception as exc:  # noqa: BLE001 - reported to the driver as this task's ranks' failure
        started = supervisor.pids()
        supervisor.stop(grace=1.0)
        for spec in specs:
            if spec.rank not in started:
                forwarder.on_output(spec.rank, "stderr",
                                    f"could not start rank {spec.rank} on {host}: {exc!r}")
                forwarder.on_exit(spec.rank, NOT_STARTED)
    forwarder.all_exited.wait()
    channel.close()
    yield json.dumps({"partition": partition, "host": host, "ranks": [s.rank for s in specs]})
