"""The job: one launch request from validation to the value returned on the driver.

The engine starts the driver hub, asks a placement to start the ranks, and then watches one
stream of events (rank connected, output line, result, error, heartbeat, exit). The first
failure ends the job: every other rank is stopped and one `RankFailedError` is raised, after
every output line has been delivered.

Each worker (rank process) has one `WorkerRecord` whose `state` follows the life cycle of
`distributor.worker_state`. An elastic job (`request.elastic`) is run by
`distributor.elastic.job.ElasticJob`, which shares this event handling but replaces failed
workers instead of ending the job; `distributor.api.launch` runs a request with either.
"""
from __future__ import annotations

import collections
import logging
import math
import pickle
import queue
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Collection, Deque, Dict, List, Optional, Tuple

from . import payload, protocol
from .errors import (JobTimeoutError, LaunchTimeoutError, RankFailedError, describe_exit,
                     last_traceback, parse_exception_line)
from .hub import DriverHub, SpawnRouter, TaskRendezvous
from .launchers import Launcher, PythonLauncher
from .placement import JobContext, LocalPlacement, Placement
from .protocol import Channel, Kind, PayloadFlag, payload_frame
from .spec import LaunchRequest, MessageHandler, OutputHandler
from .worker_state import WorkerState, check_transition

log = logging.getLogger(__name__)

#: How long after the first failure the engine waits for other failures before choosing the root
#: cause (a rank that dies takes its peers' collectives down with it a moment later).
FAILURE_SETTLE_SECONDS = 0.5
#: The most it waits after the first failure while every failure so far is a knock-on (a rank
#: whose collective failed because a peer died or left) for the cause to report.
KNOCK_ON_SETTLE_SECONDS = 3.0
#: The most it waits after the first failure, once a cause has reported (a command reports before
#: it exits), for the failed ranks to exit on their own, so that they are shown with their own
#: exit status rather than stopped: an interpreter that loaded torch and TensorFlow can take
#: several seconds to tear down on a loaded machine.
FAILED_EXIT_SECONDS = 10.0
#: How long a rank that already sent its result may take to exit, once every rank has, before it
#: is stopped.
EXIT_GRACE_SECONDS = 30.0
OUTPUT_TAIL_LINES = 200
#: How long after the placement reports that nothing runs any more the engine waits for frames.
PLACEMENT_END_GRACE_SECONDS = 2.0
#: How long after the placement failed (a Spark executor lost) the engine waits for a rank's
#: connection to drop before it stops the job: the lost rank is then named.
PLACEMENT_FAILURE_SETTLE_SECONDS = 3.0
#: How long after a rank's exit the engine keeps reading what it sent before the exit.
DISCONNECT_GRACE_SECONDS = 10.0
#: A pause of the driver's own watch loop (it turns every 0.2 s) longer than this means the driver
#: was not scheduled: the heartbeats that came meanwhile are unread, so no rank counts as silent.
WATCH_GAP_SECONDS = 1.0

#: Words of errors that are the knock-on of another rank's failure, not a cause: the transports'
#: (gloo, sockets) and the Horovod runtime's for a peer that died, stopped responding or left.
KNOCK_ON_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "connectFullMesh",
    "Socket closed",
    "recvBytes",
    "Connection was likely closed",  # torch's store client: the process serving the store died
    "ECONNRESET",
    "peer closed",
    "left the job",
    "stopped responding",
    "exited while rank",
    "closed its connection",
    "left a shared-memory allreduce",
    "Horovod has been shut down. This was caused by an exception on one of the ranks",
)
#: What ``torch.distributed.init_process_group`` puts before every line of a rank's uncaught
#: exception (its ``sys.excepthook``): the driver names the rank already.
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")


def is_knock_on(message: Optional[str]) -> bool:
    """Whether an error with this message reads as the knock-on of another rank's failure rather
    than a cause: the text fallback of `classify_failure` for ranks that send no typed report
    (plain torch/gloo scripts), and what the Horovod front ends' live output folds."""
    return bool(message) and any(marker in message for marker in KNOCK_ON_MARKERS)


@dataclass(frozen=True)
class Verdict:
    """What a failed worker's failure was (`classify_failure`): a `cause` (it failed on its own)
    or a knock-on of rank `peer`'s failure (None: unknown rank) -- `frozen` when that peer stopped
    making progress rather than died; `typed` when the worker said so itself
    (`distributor.failure_report`), not read from the text of its error."""

    cause: bool
    peer: Optional[int] = None
    frozen: bool = False
    typed: bool = False


def classify_failure(error: Optional[dict], message: Optional[str],
                     exit_code: Optional[int]) -> Verdict:
    """The one place that decides whether a failure is a cause or a knock-on: the typed fields of
    the worker's report (``knock_on``, ``peer``, ``frozen``) when it has them; else a death by a
    signal is a cause, and an error is a knock-on when its `message` reads as one (`is_knock_on`).
    A worker that raised a knock-on error and was then ended by a request to stop (SIGTERM,
    SIGINT, SIGHUP: Spark cancelling the rest of a barrier stage, a launcher's teardown) failed as
    a knock-on: the stop came after, and because of, its failure."""
    error = error or {}
    if "knock_on" in error:
        if not error["knock_on"]:
            return Verdict(cause=True, typed=True)
        peer = error.get("peer")
        return Verdict(cause=False, peer=peer if isinstance(peer, int) and not isinstance(peer, bool) else None,
                       frozen=bool(error.get("frozen")), typed=True)
    signal_number = error.get("signal") or (-exit_code if exit_code is not None and exit_code < 0 else None)
    if signal_number and not (signal_number in _STOP_SIGNALS and is_knock_on(message)):
        return Verdict(cause=True)
    return Verdict(cause=not is_knock_on(message))


#: Signals that ask a process to stop (and that a rank's teardown after its failure may receive).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def strip_torch_rank_prefix(line: str) -> str:
    """`line` without the ``[rankN]: `` that torch's exception hook adds in a rank process."""
    return _TORCH_RANK_PREFIX.sub("", line, count=1)


def print_output(rank: Optional[int], stream: str, line: str) -> None:
    """Default output handler: each line on the driver's stdout/stderr with a rank prefix
    (``[rank N] `` or ``[launcher] ``)."""
    target = sys.stdout if stream == "stdout" else sys.stderr
    prefix = "[launcher]" if rank is None else f"[rank {rank}]"
    target.write(f"{prefix} {line}\n")
    target.flush()


def print_message(rank: int, message: Any) -> None:
    """Default handler of what ranks send with `distributor.worker.send_to_driver`."""
    print(f"[rank {rank}] {message}", flush=True)


@dataclass
class WorkerRecord:
    """What the driver knows of one worker (rank process): its `WorkerState` and the facts the
    state derives from. `worker_id` is the rank in a fixed-size job."""

    worker_id: int
    host: str = "localhost"
    state: WorkerState = WorkerState.STARTING
    channel: Optional[Channel] = None  # its authenticated hub connection, once it said HELLO
    result: Optional[bytes] = None
    error: Optional[dict] = None
    returncode: Optional[int] = None
    exit_time: Optional[float] = None
    finished_at: Optional[float] = None  # when the worker reported success
    disconnected: bool = False  # its hub connection has been read to the end
    exit_seen: Optional[float] = None
    disconnect_time: Optional[float] = None
    started_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    tail: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_TAIL_LINES))
    #: its last stderr lines, where the traceback of an uncaught exception in a command is found
    stderr_tail: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_TAIL_LINES))

    @property
    def rank(self) -> int:  # the name fixed-size jobs use
        return self.worker_id

    @property
    def connected(self) -> bool:
        return self.channel is not None

    @property
    def stopped_by_driver(self) -> bool:
        return self.state is WorkerState.STOPPED

    def move(self, new: WorkerState) -> bool:
        """Go to `new` (checked against `worker_state.TRANSITIONS`); False if already final."""
        if self.state.final or self.state is new:
            return False
        self.state = check_transition(self.state, new)
        return True

    def settle(self, lost_connection_fails: bool = False) -> None:
        """Derive the state from the facts after an event: an error report or a non-zero exit
        before success is FAILED; a result and then an exit is SUCCEEDED; with
        `lost_connection_fails` (elastic jobs, which must act at once) a connection lost before
        a result is FAILED too (the worker, or its host, is gone)."""
        if self.state.final:
            return
        if self.error is not None:
            self.move(WorkerState.FAILED)
        elif self.returncode is not None and self.returncode != 0 and self.finished_at is None:
            self.move(WorkerState.FAILED)
        elif lost_connection_fails and self.disconnected and self.finished_at is None:
            self.move(WorkerState.FAILED)
        elif self.returncode is not None and self.finished_at is not None:
            if self.state is WorkerState.WAITING:  # gave up waiting for a round, and returned
                self.move(WorkerState.RUNNING)
            self.move(WorkerState.SUCCEEDED)
        elif self.returncode == 0 and self.disconnected:
            self.move(WorkerState.FAILED)  # exited 0 without reporting its result


class Job:
    """One run of a `LaunchRequest` on a placement."""

    #: Whether a worker whose hub connection ends before its result is FAILED at once (before
    #: its exit is reported). A fixed-size job waits for the exit to pick the root cause.
    _lost_connection_fails = False

    def __init__(
        self,
        request: LaunchRequest,
        placement: Optional[Placement] = None,
        launcher: Optional[Launcher] = None,
        output: Optional[OutputHandler] = None,
        on_message: Optional[MessageHandler] = None,
    ) -> None:
        request = self.request = self._prepared(request)
        self.on_message = on_message or print_message
        self.placement = placement or LocalPlacement()
        self.launcher = launcher or self._default_launcher()
        self.output = output or print_output
        self.run_id = f"distributor-{uuid.uuid4().hex[:12]}"
        self._states: Dict[int, WorkerRecord] = {r: WorkerRecord(r) for r in range(request.num_processes)}
        self._lock = threading.Lock()
        self._wake: "queue.Queue[str]" = queue.Queue()
        self._payload = b""
        self._channels: Dict[Channel, int] = {}
        self.hub: Optional[DriverHub] = None
        self._stopping = False
        self._stopped_running: set = set()  # ranks still running when the driver stopped them
        self._released_at: Optional[float] = None  # when every rank had finished (`_release_finished`)
        # (rank, why) of the rank that sent no heartbeat for heartbeat_timeout (`_check_timeouts`)
        self._silent_rank: Optional[Tuple[int, str]] = None
        self._stopped_at: Optional[float] = None  # time.time() of `_stop_all`
        self._watched_at: Optional[float] = None  # the last turn of `_watch`'s loop
        self._launcher_tail: Deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._spawns = SpawnRouter()
        self._task_ranks: Dict[int, List[int]] = {}  # placement task -> its ranks (Kind.AGENT)
        self._task_channels: Dict[Channel, int] = {}  # a task's connection -> the task
        self._tasks_done: set = set()  # tasks that said they end in order (Kind.TASK_DONE)
        # task -> time.time() its connection ended without TASK_DONE before the driver stopped
        # the job: its process died (a lost Python worker) or its connection did
        self._tasks_gone: Dict[int, float] = {}
        self._slots = TaskRendezvous()

    @staticmethod
    def _prepared(request: LaunchRequest) -> LaunchRequest:
        """The request as this kind of job runs it (a subclass may add to its environment)."""
        return request

    @staticmethod
    def _default_launcher() -> Launcher:
        return PythonLauncher()

    # ---- events, called from hub and supervisor threads -------------------------------------
    def on_output(self, rank: Optional[int], stream: str, line: str) -> None:
        """A line from a rank, or (rank None) from the launcher itself, e.g. mpirun."""
        state = self._states.get(rank) if rank is not None else None
        if state is not None:
            if stream == "stderr":
                line = strip_torch_rank_prefix(line)
                state.stderr_tail.append(line)
            state.tail.append(line)
        else:
            self._launcher_tail.append(line)
        self.output(rank, stream, line)

    def on_exit(self, rank: int, returncode: int) -> None:
        with self._lock:
            state = self._states[rank]
            state.returncode = returncode
            state.exit_time = time.time()
            state.settle(self._lost_connection_fails)
        self._wake.put("exit")

    def _on_frame(self, channel: Channel, kind: Kind, body: Any) -> None:
        if kind == Kind.HELLO:
            rank, _pid = body
            with self._lock:
                state = self._states.get(rank)
                if state is None or state.connected or state.state is not WorkerState.STARTING:
                    channel.close()
                    return
                self._channels[channel] = rank
                state.channel = channel
                state.last_seen = time.monotonic()  # its heartbeats start with the payload
                state.move(WorkerState.RUNNING)
            channel.send(Kind.PAYLOAD, payload_frame(self._payload_flags(rank), self._payload), raw=True)
            self._wake.put("connected")
            return
        if kind == Kind.OUTPUT:
            self.on_output(*body)
            return
        if kind == Kind.EXITED:
            self.on_exit(*body)
            return
        if kind == Kind.MESSAGE:
            self.on_message(*body)
            return
        if kind == Kind.AGENT:
            self._task_ranks[body[0]] = list(body[1])
            self._task_channels[channel] = body[0]
            self._spawns.task_announced(body[0], channel)
            return
        if kind == Kind.TASK_DONE:
            self._tasks_done.add(body[0])
            return
        if kind == Kind.SPAWN:
            self._spawns.spawn_requested(channel, *body)
            return
        if kind == Kind.SPAWN_EXIT:
            self._spawns.spawn_exited(*body)
            return
        if kind == Kind.SLOT:
            self._slots.slot_offered(channel, *body)
            return
        rank = self._channels.get(channel)
        if rank is None:
            return
        state = self._states[rank]
        state.last_seen = time.monotonic()
        if kind == Kind.RESULT:
            with self._lock:
                state.result = body or None  # empty: success, no value asked of this rank
                state.finished_at = time.monotonic()
                state.settle(self._lost_connection_fails)
            self._wake.put("result")
        elif kind == Kind.ERROR:
            with self._lock:
                state.error = body
                state.settle(self._lost_connection_fails)
            self._wake.put("error")
        else:
            self._on_worker_frame(state, kind, body)

    def _on_worker_frame(self, state: WorkerRecord, kind: Kind, body: Any) -> None:
        """A frame of a connected worker that the fixed-size job does not use (elastic: JOIN)."""

    def _payload_flags(self, rank: int) -> PayloadFlag:
        """Rank 0 sends its value (every rank with return_all); each holds its process group
        until every rank has finished (`_release_finished`)."""
        flags = PayloadFlag.HOLD
        if rank == 0 or self.request.return_all:
            flags |= PayloadFlag.SEND_RESULT
        return flags

    def _on_close(self, channel: Channel) -> None:
        task = self._task_channels.get(channel)
        if task is not None and task not in self._tasks_done and not self._stopping:
            self._tasks_gone.setdefault(task, time.time())
        rank = self._channels.get(channel)
        if rank is not None:
            with self._lock:
                state = self._states[rank]
                state.disconnected = True
                state.disconnect_time = time.time()
                state.settle(self._lost_connection_fails)
        self._wake.put("closed")

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> Any:
        """Run the job to its end and return rank 0's value (or every rank's, in rank order)."""
        self.placement.validate(self.request)
        self._payload = payload.dumps_target(self.request.target)
        payload.warn_if_large(self.request.target, self._payload)
        secret = protocol.new_secret()
        self.hub = DriverHub(secret, self._on_frame, self._on_close, bind_host=self.placement.hub_bind_host)
        try:
            context = JobContext(self.request, self.run_id, self.hub.address, secret, self, self.launcher)
            self.placement.start(context)
            failure = self._watch()
        except BaseException:
            self._stop_all()
            raise
        finally:
            self.hub.close()
            self.placement.close()
        if failure is not None:
            raise failure
        return self._collect()

    def _watch(self) -> Optional[BaseException]:
        """Wait until every rank has ended; return the error to raise, if any."""
        started = time.monotonic()
        first_failure_at: Optional[float] = None
        timeout_error: Optional[BaseException] = None
        placement_ended_at: Optional[float] = None
        placement_failed_at: Optional[float] = None
        while True:
            try:
                self._wake.get(timeout=0.2)
            except queue.Empty:
                pass
            now = time.monotonic()
            self._watch_turn(now)
            with self._lock:
                states = list(self._states.values())
            if self._all_ended(states, now):
                break
            if self.placement.finished():  # no rank can still run (the Spark job has ended)
                placement_ended_at = placement_ended_at or now
                if now - placement_ended_at > PLACEMENT_END_GRACE_SECONDS:
                    break  # the frames they sent before the end have been read by now
            if self._stopping:
                continue
            if self.placement.failure() is not None:
                # the ranks lost with it (an executor) drop their connections a moment later:
                # wait for that before stopping the others, to name the lost rank
                placement_failed_at = placement_failed_at or now
                if (now - placement_failed_at < PLACEMENT_FAILURE_SETTLE_SECONDS
                        and any(s.connected for s in states) and not self._lost(states)):
                    continue
                self._stop_all()
                continue
            failed = [s for s in states if self._failed(s)]
            if first_failure_at is None and failed:
                first_failure_at = now
            if first_failure_at is not None and self._settled(
                    states, failed, now - first_failure_at, self.launcher.capabilities.reports_each_exit):
                self._stop_all()
                continue
            timeout_error = self._check_timeouts(states, now - started, now)
            if timeout_error is not None:
                self._stop_all()
                continue
            released_at = self._release_finished(states, now)
            overdue = [
                s.rank for s in states
                if released_at is not None and s.returncode is None
                and now - released_at > EXIT_GRACE_SECONDS
            ]
            if overdue:
                log.warning("ranks %s finished but did not exit within %ss; stopping them",
                            overdue, EXIT_GRACE_SECONDS)
                self.placement.stop()
        if self._stopping and self.placement.capabilities.loses_tasks:
            # which tasks Spark lost with their executor is in the Spark job's error: let it end
            # (the stop cancelled it) before naming the root cause
            deadline = time.monotonic() + PLACEMENT_END_GRACE_SECONDS
            while not self.placement.finished() and time.monotonic() < deadline:
                time.sleep(0.05)
        failure = self._failure_error() or self._lost_with_placement() or self.placement.failure()
        return failure if failure is not None else timeout_error

    def _lost(self, states: List[WorkerRecord]) -> List[WorkerRecord]:
        """The ranks whose connection ended without a result, an error or an exit status before
        the driver stopped the job."""
        stopped_at = self._stopped_at or math.inf
        return [s for s in states
                if s.disconnected and s.result is None and s.finished_at is None and s.error is None
                and s.returncode is None and (s.disconnect_time or math.inf) < stopped_at]

    def _lost_with_placement(self) -> Optional[RankFailedError]:
        """When the placement failed (e.g. a Spark executor lost), the rank whose connection
        ended first without a result, an error or an exit status, before the driver stopped the
        job: it was lost with what ran it, and the placement's failure is the knock-on."""
        placement_failure = self.placement.failure()
        if placement_failure is None:
            return None
        lost_task = self._lost_with_task()
        if lost_task is not None:
            return self._rank_failed(*lost_task, outcome="exit status unknown")
        lost = self._lost(list(self._states.values()))
        if not lost:
            return None
        root = min(lost, key=lambda s: s.disconnect_time or math.inf)
        first_line = str(placement_failure).splitlines()[0] if str(placement_failure) else \
            type(placement_failure).__name__
        return self._rank_failed(root, f"was lost: its connection to the driver ended with no "
                                       f"result and no exit status (the placement failed: "
                                       f"{first_line})", outcome="exit status unknown")

    def _lost_with_task(self) -> Optional[Tuple[WorkerRecord, str]]:
        """The lowest rank of the first task lost with what hosted it, and why: it was lost with
        it, whatever it or the others reported. First the tasks the placement says it lost (a
        Spark executor), then the task whose connection ended first without its last word
        (``Kind.TASK_DONE``) while the job ran: the process that ran it died."""
        gone = sorted(self._tasks_gone.items(), key=lambda item: item[1])
        for task, why in [*sorted(self.placement.lost_tasks().items()),
                          *((task, "the task's connection to the driver ended before the task "
                                   "did: its process died (a Spark task's Python worker lost) or "
                                   "its network did")
                            for task, _ in gone)]:
            ranks = sorted(r for r in self._task_ranks.get(task, ()) if r in self._states)
            if ranks:
                return self._states[ranks[0]], f"was lost with the process that ran its task ({why})"
        return None

    def _release_finished(self, states: List[WorkerRecord], now: float) -> Optional[float]:
        """Once every rank has finished, tell those held (`PayloadFlag.HOLD`) to exit; return
        when that happened (None before)."""
        if self._released_at is None and all(s.finished_at is not None for s in states):
            self._released_at = now
            for s in states:
                if s.channel is not None and not s.disconnected:
                    try:
                        s.channel.send(Kind.STOP)
                    except OSError:
                        pass  # it has exited already
        return self._released_at

    def _check_timeouts(self, states: List[WorkerRecord], elapsed: float, now: float) -> Optional[BaseException]:
        request = self.request
        not_connected = [s.rank for s in states if not s.connected and s.returncode is None]
        if not_connected and elapsed > request.start_timeout:
            return LaunchTimeoutError(
                f"Ranks {not_connected} did not connect to the driver within "
                f"start_timeout={request.start_timeout:g}s. They may be stuck importing modules or "
                "waiting for resources; raise start_timeout if startup is slow."
            )
        if request.timeout is not None and elapsed > request.timeout:
            running = [s.rank for s in states if s.returncode is None and s.finished_at is None]
            return JobTimeoutError(
                f"The job exceeded timeout={request.timeout:g}s; ranks {running} were still running "
                "and have been stopped. Their last output lines above show where they were."
            )
        silent = [
            s for s in states
            if s.connected and s.returncode is None and s.finished_at is None
            and now - s.last_seen > request.heartbeat_timeout
        ]
        if silent:
            first = min(silent, key=lambda s: s.last_seen)
            self._silent_rank = (first.rank, (
                f"stopped responding (no heartbeat for {request.heartbeat_timeout:g}s: its process "
                "is stopped or hung in native code, or its host or its network connection to the "
                "driver was lost)"))
            return JobTimeoutError(
                f"Ranks {[s.rank for s in silent]} sent no heartbeat for "
                f"{request.heartbeat_timeout:g}s: stopped or hung processes, or their host or their "
                "network connection to the driver was lost."
            )
        return None

    def _watch_turn(self, now: float) -> None:
        """A turn of the watch loop at `now`. After a pause of the driver itself (it was not
        scheduled), every rank counts as heard from: the heartbeats that came meanwhile are read
        only now."""
        if self._watched_at is not None and now - self._watched_at > WATCH_GAP_SECONDS:
            with self._lock:
                for s in self._states.values():
                    s.last_seen = max(s.last_seen, now)
        self._watched_at = now

    @classmethod
    def _all_ended(cls, states: List[WorkerRecord], now: float) -> bool:
        """Whether every worker has `_ended`. Each is asked (no short cut at the first that has
        not): each notes when its exit was first seen, so that the graces of ranks whose
        connections stay open (a lost host's) run at once, not one after the other."""
        ended = [cls._ended(s, now) for s in states]
        return all(ended)

    @staticmethod
    def _ended(state: WorkerRecord, now: float) -> bool:
        """Exited, and every frame it sent has been read (bounded, in case a child holds the socket)."""
        if state.returncode is None:
            return False
        if not state.connected or state.disconnected:
            return True
        state.exit_seen = state.exit_seen or now
        return now - state.exit_seen > DISCONNECT_GRACE_SECONDS

    @staticmethod
    def _failed(state: WorkerRecord) -> bool:
        """Raised, or exited non-zero before reporting success."""
        return state.error is not None or (
            state.returncode not in (None, 0) and state.finished_at is None
        )

    @classmethod
    def _settled(cls, states: List[WorkerRecord], failed: List[WorkerRecord], elapsed: float,
                 exit_reported: bool = False) -> bool:
        """Whether, `elapsed` seconds after the first failure, the root cause is known and the
        others may be stopped: `FAILURE_SETTLE_SECONDS` after it once a cause has failed (or
        every rank has, each a knock-on) and the failed ranks have exited, at the latest
        `FAILED_EXIT_SECONDS` after it; with no cause known, `KNOCK_ON_SETTLE_SECONDS` after it.
        Knock-ons are not waited for longer than that once the causes have exited (a rank whose
        peer broke its connection can hang in its exit: the job must still end soon after the
        fault). A rank has exited when its exit status is in; where the launcher reports each
        rank's exit (`exit_reported`: one process per rank), not before, since a rank that closed
        its hub connection still tears its interpreter down and would be stopped by SIGTERM in
        the middle of it (a loaded machine's rank was shown "killed by SIGTERM", not with its exit
        status); under mpirun, whose statuses come at its end, its closed connection stands for
        it."""
        if elapsed < FAILURE_SETTLE_SECONDS:
            return False
        causes = [s for s in failed if cls._classify(s).cause]
        # with no cause yet, one can still report unless every rank has failed already
        if len(failed) < len(states) and not causes:
            return elapsed >= KNOCK_ON_SETTLE_SECONDS
        # the failed ranks are exiting: let them, so that each is shown with its own exit status

        def exited(s: WorkerRecord) -> bool:
            return s.returncode is not None or (s.disconnected and not exit_reported)

        if elapsed >= FAILED_EXIT_SECONDS or all(exited(s) for s in failed):
            return True
        return elapsed >= KNOCK_ON_SETTLE_SECONDS and all(exited(s) for s in causes)

    def _stop_all(self) -> None:
        """Stop every rank that is still running; only the first call acts."""
        if self._stopping:
            return
        self._stopping = True
        self._stopped_at = time.time()
        with self._lock:
            for s in self._states.values():
                if s.returncode is None and s.finished_at is None:  # (a finished one is held)
                    s.move(WorkerState.STOPPED)
                    if not s.disconnected:  # (under mpirun an exited rank's status comes later)
                        self._stopped_running.add(s.rank)
        if self.hub is not None:
            self.hub.broadcast(Kind.STOP)
        self.placement.stop()

    def _failure_error(self) -> Optional[RankFailedError]:
        """The root cause: the failed rank that came first in causal order. A rank that failed
        on its own (the earliest of them) over the knock-ons of its death; if every failure is a
        knock-on, a rank they name that did not fail itself (it froze, or finished while they
        waited for it) or that one named frozen before it failed, else the rank named by the
        others, else the earliest."""
        failed = [s for s in self._states.values() if self._failed(s) and self._own_failure(s)]
        if not failed:
            if self._silent_rank is None:
                return None
            rank, reason = self._silent_rank
            return self._rank_failed(self._states[rank], reason)
        verdicts = {s.rank: self._classify(s, self._stopped_running) for s in failed}
        outcome = None
        # when a knock-on first named each rank frozen: a rank that failed after that (mpirun
        # continues a stopped rank and kills it with SIGTERM when other ranks exit, at times
        # before the driver stops the job) failed because it had been stopped, not on its own
        named_frozen: Dict[int, float] = {}
        for s in failed:
            v = verdicts[s.rank]
            if v.frozen and v.peer is not None:
                named_frozen[v.peer] = min(named_frozen.get(v.peer, math.inf), self._when(s))
        causes = [s for s in failed if verdicts[s.rank].cause
                  and not self._when(s) > named_frozen.get(s.rank, math.inf)]
        reason = None
        if causes:
            root = min(causes, key=self._when)
        else:
            blamed = [(self._when(s), verdicts[s.rank].peer, s.rank) for s in failed
                      if verdicts[s.rank].peer in self._states]
            failed_at = {s.rank: self._when(s) for s in failed}
            # A peer is silent if it never failed, or if a knock-on named it frozen before it
            # failed itself: a stopped rank that is continued (mpirun sends SIGCONT before
            # SIGTERM when it ends the job) then fails waiting for the ranks that gave up on it.
            silent = [peer for when, peer, rank in sorted(blamed) if peer not in failed_at
                      or (verdicts[rank].frozen and failed_at[peer] > when)]
            if silent:
                root = self._states[silent[0]]
                waiting = sorted(rank for _, peer, rank in blamed if peer == root.rank)
                lost = bool(self._lost([root]))
                reason = self._unresponsive(root, waiting,
                                            any(verdicts[r].frozen for r in waiting), lost)
                outcome = "exit status unknown" if lost else None
            elif (lost_task := self._lost_with_task()) is not None:
                # knock-ons naming no peer (a torch.distributed transport error) and a task the
                # placement lost with its host process: its rank went first
                root, reason = lost_task
                outcome = "exit status unknown"
            else:
                named = {peer for _, peer, _ in blamed}
                root = min(failed, key=lambda s: (s.rank not in named, self._when(s)))
        return self._rank_failed(root, reason, outcome)

    def _rank_failed(self, root: WorkerRecord, reason: Optional[str],
                     outcome: Optional[str] = None) -> RankFailedError:
        """The job's error: `root` is the root cause (`reason`: why, when it did not fail itself;
        `outcome`: how it ended, when its exit status cannot say), with one line for each other
        rank that failed or that the driver stopped."""
        others = [
            (s.rank, self._summary(s)) for s in sorted(self._states.values(), key=lambda s: s.rank)
            if s is not root and (self._failed(s) or s.stopped_by_driver)
        ]
        exc_type, exc_message, traceback = self._reported(root) if reason is None else (None, None, None)
        tail = list(root.tail) + [f"[launcher] {line}" for line in self._launcher_tail]
        return RankFailedError(
            rank=root.rank,
            exit_code=self._exit_code(root, self._stopped_running),
            exc_type=exc_type,
            exc_message=exc_message,
            traceback=traceback,
            output_tail=tail,
            other_failures=others,
            reason=reason,
            outcome=outcome,
        )

    @staticmethod
    def _own_failure(state: WorkerRecord) -> bool:
        """Whether a failed worker's failure is its own doing, not the driver's stopping it (a
        rank the driver stopped counts only with an error report that is not a death by a signal)."""
        if not state.stopped_by_driver:
            return True
        return state.error is not None and not state.error.get("signal")

    @staticmethod
    def _unresponsive(state: WorkerRecord, waiting: List[int], frozen: bool,
                      lost: bool = False) -> str:
        """Why a rank that did not fail is the root cause: ranks `waiting` failed waiting for it
        (`lost`: its connection ended with nothing to say how, e.g. with its Spark executor)."""
        who = (f"rank {waiting[0]}" if len(waiting) == 1
               else "ranks " + ", ".join(map(str, waiting[:-1])) + f" and {waiting[-1]}")
        if lost:
            return (f"was lost (its connection to the driver ended with no result and no exit "
                    f"status) while {who} waited for it in a collective")
        if state.finished_at is not None or state.returncode == 0:
            return f"finished while {who} waited for it in a collective"
        if frozen:
            return f"stopped responding (no progress while {who} waited for it in a collective)"
        return f"stopped responding: {who} failed waiting for it in a collective"

    @classmethod
    def _classify(cls, state: WorkerRecord, stopped: Collection[int] = ()) -> Verdict:
        """Cause or knock-on of which rank (`classify_failure`), for a failed worker. The exit
        status of a worker in `stopped` (still running when the driver stopped the job, e.g. in
        its teardown after its report) is the driver's doing, not how it failed."""
        code = cls._exit_code(state, stopped)
        message = cls._reported(state)[1] if "knock_on" not in (state.error or {}) else None
        return classify_failure(state.error, message, code)

    @staticmethod
    def _when(state: WorkerRecord) -> float:
        """When the worker failed: the time in its report, else when it was seen to die."""
        # A rank that died without a word is seen first by its hub connection dropping (several
        # ranks under one mpirun share one exit report).
        died_at = state.disconnect_time if state.result is None and state.finished_at is None else None
        return (state.error or {}).get("time") or died_at or state.exit_time or float("inf")

    @staticmethod
    def _exit_code(state: WorkerRecord, stopped: Collection[int] = ()) -> Optional[int]:
        """The worker's exit status as `subprocess` gives it (negative: killed by that signal);
        a rank that ran a command reports the signal that killed the command. None for a rank in
        `stopped` (still running when the driver stopped it: its status is the driver's doing) or
        whose command was stopped from outside after it reported its failure."""
        error = state.error or {}
        if error.get("signal"):
            return -error["signal"]
        return None if state.rank in stopped or error.get("stopped_by") else state.returncode

    @classmethod
    def _reported(cls, state: WorkerRecord) -> Tuple[Optional[str], Optional[str], Optional[str]]:
        """(exception type, message, traceback) of the worker's failure: what it reported; a
        command (which reports no traceback, and its type and message only when it wrote a
        failure report) that exited non-zero, not by a signal: the traceback it printed last."""
        error = state.error or {}
        exc_type, exc_message, traceback = error.get("exc_type"), error.get("exc_message"), error.get("traceback")
        if traceback:
            return exc_type, exc_message, traceback
        code = cls._exit_code(state)
        # a command that raised (it said so, or it exited with a status, not by a signal)
        raised = not error.get("signal") and (bool(exc_type) or (code is not None and code > 0))
        block = last_traceback(list(state.stderr_tail)) if raised else None
        printed_type, printed_message = parse_exception_line(block[-1]) if block else (None, None)
        if block is None or (exc_type and printed_type != exc_type.rsplit(".", 1)[-1]):  # not ours
            return (exc_type, exc_message, None) if exc_type else (None, None, None)
        if not exc_type:
            exc_type, exc_message = printed_type, printed_message
        return exc_type, exc_message, "\n".join(block) + "\n"

    def _summary(self, state: WorkerRecord) -> str:
        """One line: how a worker other than the root cause ended."""
        if state.stopped_by_driver and state.error is None:
            return f"stopped by the driver ({describe_exit(self._exit_code(state))})"
        how = describe_exit(self._exit_code(state, self._stopped_running))
        if how == describe_exit(None):
            how = "stopped by the driver"
        exc_type, exc_message, _ = self._reported(state)
        if not exc_type:
            return how
        lines = (exc_message or "").strip().splitlines() or [""]
        return f"{exc_type}: {lines[0]}{' [...]' if len(lines) > 1 else ''} ({how})"

    def _collect(self) -> Any:
        ranks = range(self.request.num_processes) if self.request.return_all else [0]
        values = []
        for rank in ranks:
            data = self._states[rank].result
            if data is None:
                raise RankFailedError(
                    rank, self._states[rank].returncode, "RuntimeError",
                    "the rank exited with status 0 without reporting its result",
                    output_tail=list(self._states[rank].tail),
                )
            values.append(pickle.loads(data))
        return values if self.request.return_all else values[0]
