"""The elastic job on the driver: failed workers are replaced while the others keep running.

It shares the fixed-size `engine.Job`'s event handling (hub frames, output, exits, one
`WorkerRecord` per worker) and replaces its watch loop. One control thread makes every decision
(`_step`, woken by each event): hub threads only record facts. What it does:

- a worker that fails (error, exit, signal, lost connection or heartbeat) is FAILED; one `Attempt`
  is recorded. The job gives up (`ElasticJobFailedError`, listing every attempt) when the same
  exception type at the same place has already caused a reset (the training code's bug), or when
  `reset_limit` resets have been made. Otherwise a replacement worker starts on a host with a
  free slot, the failed worker's first (after that host's cooldown), up to `max_workers`;
- the survivors find out themselves (their collective fails; one still joining the round learns
  it from the LOST notice the driver sends the members at once, `store.RoundStore`; a frozen
  member is FAILED and stopped when a peer reports it, FROZEN), send JOIN, and a new round forms
  at once if they are at least `min_workers` (shrink); otherwise it waits for the replacement,
  at most `elastic_timeout` seconds. A worker that joins while a round runs (a replacement, or a
  worker on a host discovery added) makes the driver send HOSTS_UPDATED(ADDED) to the members,
  which then join the next round with it;
- `policy.discovery` is polled in a thread; a host that appears gets workers, a host that goes
  has its workers stopped (not counted as failures) and the others get HOSTS_UPDATED(REMOVED);
- the job succeeds once every member of the last round has succeeded; the value is the one of
  the worker that had rank 0 (with `return_all`, every such worker's value in rank order).

A reset is a new round caused by a failure or a host change (a replacement joining after a
shrink belongs to the failure it replaces), or the failure of a worker that never got a world.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import pickle
import queue
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from ..engine import Job, WorkerRecord
from ..errors import (
    DistributedRunError,
    ElasticJobFailedError,
    ElasticTimeoutError,
    JobTimeoutError,
    LaunchValidationError,
    RankFailedError,
    describe_exit,
)
from ..launchers import Launcher, PythonLauncher
from ..protocol import Kind, PayloadFlag
from ..spec import LaunchRequest
from ..worker import ELASTIC_VAR
from ..worker_state import WorkerState
from .policy import Attempt, ElasticPolicy
from .rendezvous import Rounds, start_store
from .world import HostUpdate, World

log = logging.getLogger(__name__)

#: How often the control thread looks at timers when no event wakes it.
TICK_SECONDS = 0.1
#: How long a worker whose connection was lost may take to report its exit status (which names
#: the signal that killed it), and a worker that exited to have its last frames read (its error
#: report), before its failure is handled without them.
EXIT_WAIT_SECONDS = 1.0


class ElasticJob(Job):
    """One run of an elastic `LaunchRequest` (`request.elastic` set)."""

    _lost_connection_fails = True

    @staticmethod
    def _prepared(request: LaunchRequest) -> LaunchRequest:
        if request.elastic is None:
            raise ValueError("ElasticJob runs requests with an elastic policy")
        return dataclasses.replace(request, env={**request.env, ELASTIC_VAR: "1"})

    @staticmethod
    def _default_launcher() -> Launcher:
        # Replacements fork from a server that already imported torch (PythonLauncher.keep_warm).
        return PythonLauncher(preload=("torch",))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # Job's arguments
        request = self.request
        self.policy: ElasticPolicy = request.elastic
        self.attempts: List[Attempt] = []
        self.rounds_formed = 0
        self._joins: List[int] = []  # worker ids whose JOIN the control thread has not handled
        #: (reporting worker id, round, rank, message) of each FROZEN not handled yet
        self._frozen: List[Tuple[int, int, int, str]] = []
        self._handled: Set[int] = set()  # workers whose final state was handled
        self._worlds: Dict[int, World] = {}  # each worker's latest world
        self._replaces: Dict[int, int] = {}  # replacement worker id -> the failed worker's id
        self._owed: List[int] = []  # failed workers whose replacement has not started yet
        self._hosts: Dict[str, int] = {}  # host -> slots the job may use now
        self._discovered: Optional[Dict[str, int]] = None  # last discovery answer not applied yet
        self._cooldown_until: Dict[str, float] = {}
        self._host_failures: Dict[str, int] = collections.Counter()
        self._user_errors: Set[Tuple[str, str]] = set()  # (exception type, "file:line") retried once
        self._causes: Dict[int, str] = {}  # why the driver failed a worker itself (heartbeat, start)
        self._resets = 0
        self._reset_cause: Optional[str] = None  # a new round is due for this reason, not counted yet
        self._short_since: Optional[float] = None  # since when too few workers to form a round
        self._fatal: Optional[BaseException] = None
        self._completing = False
        self._finishing = False  # a worker succeeded: the job ends when the round's members have
        self._failures: Dict[int, Tuple[bool, float]] = {}  # failed, not handled: (was member, until)
        self._next_id = request.num_processes
        self._last_stamp = 0.0
        self._store: Any = None
        self._store_host = "127.0.0.1"
        self._rounds: Optional[Rounds] = None
        self._done = threading.Event()
        #: (time.monotonic(), what) of each recovery step, for benchmarks and debugging.
        self.timeline: List[Tuple[float, str]] = []

    # ---- events from hub threads -----------------------------------------------------------
    def _payload_flags(self, rank: int) -> PayloadFlag:
        # any worker may hold rank 0 of the last round; a worker that finished is not held: the
        # driver serves each round's store, and a round ends when its members exit
        return PayloadFlag.SEND_RESULT

    def _on_worker_frame(self, state: WorkerRecord, kind: Kind, body: Any) -> None:
        if kind == Kind.JOIN:
            with self._lock:
                self._joins.append(state.worker_id)
            self._wake.put("join")
        elif kind == Kind.FROZEN:
            round_number, rank, message = body
            with self._lock:
                self._frozen.append((state.worker_id, int(round_number), int(rank), str(message)))
            self._wake.put("frozen")

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> Any:
        if not self.placement.capabilities.adds_workers or not self.launcher.capabilities.adds_ranks:
            raise LaunchValidationError(
                f"An elastic job needs a placement that adds workers while the job runs and a "
                f"launcher that adds ranks; {type(self.placement).__name__} with "
                f"{type(self.launcher).__name__} cannot. Use LocalPlacement, HostsPlacement or "
                "SparkPlacement with PythonLauncher, or drop the elastic policy.")
        hosts = self.placement.worker_hosts(self.request)
        for wid, host in enumerate(hosts):
            self._states[wid].host = host
        self._hosts = dict(collections.Counter(hosts))
        self._rounds = Rounds([(wid, host) for wid, host in enumerate(hosts)])
        self._store_host = self.placement.store_host()
        self._store = start_store(self._store_host)
        poller = None
        if self.policy.discovery is not None:
            poller = threading.Thread(target=self._poll_discovery, name="elastic-discovery", daemon=True)
            poller.start()
        try:
            return super().run()
        finally:
            self._done.set()
            if poller is not None:
                poller.join(timeout=self.policy.discovery_interval + 5)
            self._store = None  # the server stops with its last reference

    def _poll_discovery(self) -> None:
        assert self.policy.discovery is not None
        while not self._done.is_set():
            try:
                answer = self.policy.discovery()
                hosts = {str(h): int(n) for h, n in dict(answer).items() if int(n) > 0}
            except Exception:  # noqa: BLE001 - a flaky discovery must not end the job
                log.warning("host discovery failed; keeping the current hosts", exc_info=True)
            else:
                with self._lock:
                    self._discovered = hosts
                self._wake.put("discovery")
            self._done.wait(self.policy.discovery_interval)

    def _watch(self) -> Optional[BaseException]:
        started = time.monotonic()
        while True:
            try:
                self._wake.get(timeout=TICK_SECONDS)
            except queue.Empty:
                pass
            now = time.monotonic()
            self._watch_turn(now)
            if self._fatal is None and self.placement.failure() is not None:
                self._fail(self.placement.failure())
            if self._fatal is None:
                try:
                    self._step(now, now - started)
                except DistributedRunError as exc:
                    self._fail(exc)
            if self._fatal is not None or self._completing:
                with self._lock:
                    states = list(self._states.values())
                if self._all_ended(states, now):
                    break
        return self._fatal

    def _fail(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
            self._stop_all()

    def _collect(self) -> Any:
        succeeded = [s for s in self._states.values() if s.state is WorkerState.SUCCEEDED]
        finished = [s for s in succeeded if s.worker_id in self._worlds]
        if not finished and succeeded and not self._worlds:
            # no round ever formed (no worker called hvd.init()): the workers in their first ranks
            last = sorted(succeeded, key=lambda s: s.worker_id)
        elif not finished:
            raise ElasticJobFailedError(
                "no worker finished its training", "look at the workers' output above",
                self.attempts)
        else:
            last_round = max(self._worlds[s.worker_id].round for s in finished)
            last = sorted((s for s in finished if self._worlds[s.worker_id].round == last_round),
                          key=lambda s: self._worlds[s.worker_id].rank)
        values = []
        for s in last:
            if s.result is None:
                raise RankFailedError(
                    s.worker_id, s.returncode, "RuntimeError",
                    "the worker exited with status 0 without reporting its result",
                    output_tail=list(s.tail))
            values.append(pickle.loads(s.result))
        return values if self.request.return_all else values[0]

    # ---- the control thread ----------------------------------------------------------------
    def _step(self, now: float, elapsed: float) -> None:
        rounds = self._rounds
        assert rounds is not None
        request = self.request
        with self._lock:
            joins, self._joins = self._joins, []
            discovered, self._discovered = self._discovered, None
            self._check_silence(now)
            self._check_frozen()
            ended = [s for s in self._states.values() if s.state.final and s.worker_id not in self._handled]
        if request.timeout is not None and elapsed > request.timeout:
            raise JobTimeoutError(
                f"The job exceeded timeout={request.timeout:g}s; its workers were still running "
                "and have been stopped. Their last output lines above show where they were.")
        for s in ended:
            self._handled.add(s.worker_id)
            if s.state is WorkerState.SUCCEEDED:
                self._finishing = True  # training is over: no slot freed now is refilled
            if s.state is WorkerState.FAILED and not self._completing:
                # Acted on once its exit status is known (it names the signal), which follows
                # the lost connection within milliseconds; the round does not wait for it.
                self._failures[s.worker_id] = (s.worker_id in rounds.members, now + EXIT_WAIT_SECONDS)
            rounds.leave(s.worker_id)
            if s.state is WorkerState.FAILED:
                self._tell_lost(s.worker_id)
        for wid, (was_member, deadline) in list(self._failures.items()):
            s = self._record(wid)
            # its exit status, and every frame it sent before it (its error report, read by a hub
            # thread that a loaded machine may run after the exit is seen)
            drained = s.channel is None or s.disconnected
            if (s.returncode is not None and drained) or now >= deadline:
                del self._failures[wid]
                self._on_failure(s, was_member, now)
        for wid in joins:
            self._on_join(wid)
        if discovered is not None and discovered != self._hosts and not self._completing:
            self._apply_hosts(discovered, now)
        states = list(self._states.values())
        if not rounds.members and any(s.state is WorkerState.SUCCEEDED for s in states) and (
                rounds.round >= 0 or all(s.state.final for s in states)):
            # (no round ever formed: every worker ended without joining one -- a function that
            # never called hvd.init() -- and that is the job's end too)
            self._complete()
            return
        self._form_round(now)
        self._fill(now)
        self._check_shortfall(now)

    def _record(self, worker_id: int) -> WorkerRecord:
        return self._states[worker_id]

    def _describe(self, s: WorkerRecord) -> str:
        world = self._worlds.get(s.worker_id)
        where = f"worker {s.worker_id} (rank {world.rank} of round {world.round}" if world else \
            f"worker {s.worker_id} (not in a round yet"
        where += f", host {s.host})"
        error = s.error or {}
        if error.get("exc_type"):
            what = f"raised {error['exc_type']}: {error.get('exc_message')}"
        elif s.worker_id in self._causes:
            what = self._causes[s.worker_id]
        elif s.returncode is not None:
            what = describe_exit(s.returncode)
        else:
            what = "lost its connection to the driver"
        return f"{where} {what}"

    def _root_cause(self, s: WorkerRecord) -> RankFailedError:
        error = s.error or {}
        world = self._worlds.get(s.worker_id)
        return RankFailedError(
            rank=world.rank if world else s.worker_id, exit_code=s.returncode, exc_type=error.get("exc_type"),
            exc_message=error.get("exc_message") or self._causes.get(s.worker_id),
            traceback=error.get("traceback"), output_tail=list(s.tail))

    def _on_failure(self, s: WorkerRecord, was_member: bool, now: float) -> None:
        """Record the attempt; give up (raise) if the policy says so; else start a replacement."""
        cause = self._describe(s)
        self.timeline.append((now, f"failed: worker {s.worker_id}"))
        number = len(self.attempts) + 1
        error = s.error or {}
        key = (error["exc_type"], error.get("where") or "?") if error.get("exc_type") else None
        if key is not None and key in self._user_errors:
            self.attempts.append(Attempt(number, time.time(), cause, "job failed: the same error again"))
            raise ElasticJobFailedError(
                f"{error['exc_type']} was raised again at {key[1]} after a reset; an error that "
                "repeats at the same place is a bug in the training code, not a lost worker",
                "fix the error shown in the traceback above (an elastic job replaces workers "
                "that die; it does not retry code that raises)", self.attempts, self._root_cause(s))
        needs_reset = was_member or s.worker_id not in self._worlds
        limit = self.policy.reset_limit
        if needs_reset and self._reset_cause is None and limit is not None and self._resets >= limit:
            self.attempts.append(Attempt(number, time.time(), cause, "job failed: reset_limit reached"))
            raise ElasticJobFailedError(
                f"a worker failed after {self._resets} reset(s), and reset_limit={limit}",
                "raise reset_limit (None: unlimited), or find why workers keep failing in the "
                "attempts and root cause above", self.attempts, self._root_cause(s))
        if key is not None:
            self._user_errors.add(key)
        if was_member:
            self._reset_cause = self._reset_cause or cause
        elif s.worker_id not in self._worlds:
            self._resets += 1  # a worker that failed before it got a world: a reset of its own
        k = self._host_failures[s.host] = self._host_failures[s.host] + 1
        if self.policy.cooldown_range is not None:
            low, high = self.policy.cooldown_range
            self._cooldown_until[s.host] = now + min(low * 2 ** (k - 1), high)
        self._owed.append(s.worker_id)
        added = self._fill(now, prefer=s.host)
        live = sum(1 for r in self._states.values() if not r.state.final)
        if added:
            action = f"replacement worker {added[0]} on host {self._states[added[0]].host}"
        elif self._cooldown_until.get(s.host, 0) > now:
            action = f"host {s.host} cools down until a replacement may start there"
        else:
            action = "no free slot for a replacement"
        if live - len(added) >= self.policy.min_workers:
            action += f"; {live - len(added)} other worker(s) go on without waiting"
        else:
            action += f"; waiting for {self.policy.min_workers} workers (min_workers)"
        self.attempts.append(Attempt(number, time.time(), cause, action))
        log.warning("elastic job: %s -> %s", cause, action)

    def _on_join(self, wid: int) -> None:
        rounds = self._rounds
        assert rounds is not None
        s = self._record(wid)
        with self._lock:
            if not s.move(WorkerState.WAITING) and s.state is not WorkerState.WAITING:
                return  # it ended meanwhile
        self.timeline.append((time.monotonic(), f"join: worker {wid}"))
        member = rounds.join(wid, s.host)
        if member or rounds.round < 0 or rounds.open:
            return
        # A new worker while a round runs: tell the members, who join the next round with it.
        if wid not in self._replaces and self._reset_cause is None:
            limit = self.policy.reset_limit
            if limit is not None and self._resets >= limit:
                log.warning("elastic job: not adding worker %s on host %s: reset_limit=%s resets "
                            "were made already", wid, s.host, limit)
                self._stop_worker(wid)
                return
            self._reset_cause = f"worker {wid} on host {s.host} was added"
        self._notify(HostUpdate.ADDED)

    def _tell_lost(self, failed: int) -> None:
        """Tell the other members of the current round at once that `failed`, one of them, failed:
        one still joining the round would otherwise wait for it until the store's timeout
        (`store.RoundStore`); the others learn it from their collectives anyway."""
        rounds = self._rounds
        assert rounds is not None
        world = self._worlds.get(failed)
        if world is None or world.round != rounds.round:
            return
        self._send(list(rounds.members), Kind.LOST, (world.round, world.rank), running_only=False)

    def _notify(self, update: HostUpdate, only: Optional[List[int]] = None) -> None:
        rounds = self._rounds
        assert rounds is not None
        self._send(only if only is not None else list(rounds.members), Kind.HOSTS_UPDATED,
                   (self._stamp(), int(update)), running_only=True)

    def _send(self, wids: List[int], kind: Kind, payload: object, running_only: bool) -> None:
        """Send one frame to each worker of `wids` still connected and not ended (with
        `running_only`, running); a connection that breaks meanwhile is that worker's own failure,
        which its supervisor reports."""
        for wid in wids:
            s = self._record(wid)
            if s.channel is None or s.state.final or (
                    running_only and s.state is not WorkerState.RUNNING):
                continue
            try:
                s.channel.send(kind, payload)
            except OSError:
                pass

    def _form_round(self, now: float) -> None:
        rounds = self._rounds
        assert rounds is not None
        worlds = rounds.try_form(self.policy.min_workers, self.policy.max_workers,
                                 self._store_host, self._store.port, self._stamp())
        if worlds is None:
            return
        if rounds.round > 0 and self._reset_cause is not None:
            self._resets += 1
        self._reset_cause = None
        self._short_since = None
        self.rounds_formed += 1
        self.timeline.append((now, f"round {rounds.round}: {len(worlds)} workers"))
        for wid, world in worlds.items():
            s = self._record(wid)
            with self._lock:
                moved = s.move(WorkerState.RUNNING)
            if not moved or s.channel is None:
                continue  # it ended meanwhile; its peers' collectives will fail and they re-join
            self._worlds[wid] = world
            try:
                s.channel.send(Kind.WORLD, world)
            except OSError:
                pass

    def _stamp(self) -> float:
        """`time.time()` for rounds and host notices, strictly increasing even if the clock steps
        back: a worker orders them by it (`World.formed_at`)."""
        self._last_stamp = max(time.time(), self._last_stamp + 1e-6)
        return self._last_stamp

    def _live_by_host(self) -> Dict[str, int]:
        counts: Dict[str, int] = collections.Counter()
        for s in self._states.values():
            # A worker keeps its slot until the control thread has handled its end (a failure
            # until its replacement is decided): one that ended after this step's look at the
            # ended workers must not have its slot refilled as if discovery had added it.
            if not s.state.final or s.worker_id in self._failures or s.worker_id not in self._handled:
                counts[s.host] += 1
        return counts

    def _fill(self, now: float, prefer: Optional[str] = None) -> List[int]:
        """Start workers on listed hosts with free slots (not cooling down), up to max_workers:
        first the replacements owed to failed workers, then (while reset_limit allows another
        reset) workers for slots that discovery added."""
        if self._completing or self._finishing or self._fatal is not None:
            return []
        added: List[int] = []
        live = self._live_by_host()
        total = sum(live.values())
        hosts = sorted(self._hosts, key=lambda h: h != prefer)
        for host in hosts:
            if self._cooldown_until.get(host, 0) > now:
                continue
            while live[host] < self._hosts[host] and total < self.policy.max_workers:
                limit = self.policy.reset_limit
                if not self._owed and limit is not None and self._resets >= limit:
                    return added  # one more worker would need one more reset
                wid = self._next_id
                self._next_id += 1
                with self._lock:
                    self._states[wid] = WorkerRecord(wid, host)
                if self._owed:
                    self._replaces[wid] = self._owed.pop(0)
                self.timeline.append((time.monotonic(), f"start: worker {wid} on {host}"))
                try:
                    self.placement.add_worker(wid, host)
                except Exception as exc:
                    # no worker will ever report for this record: drop it, or the job would wait
                    # for it to end
                    with self._lock:
                        del self._states[wid]
                    self._replaces.pop(wid, None)
                    raise DistributedRunError(
                        f"{type(self.placement).__name__} could not start worker {wid} on host "
                        f"{host}: {exc}") from exc
                added.append(wid)
                live[host] += 1
                total += 1
        return added

    def _apply_hosts(self, hosts: Mapping[str, int], now: float) -> None:
        """Discovery changed the hosts: stop workers on hosts that went (or lost slots)."""
        old, self._hosts = self._hosts, dict(hosts)
        self.timeline.append((now, f"hosts: {self._hosts}"))
        removed: List[int] = []
        for host in old:
            slots = self._hosts.get(host, 0)
            on_host = sorted((s.worker_id for s in self._states.values()
                              if s.host == host and not s.state.final), reverse=True)
            removed += on_host[:max(len(on_host) - slots, 0)]
        if not removed:
            return
        rounds = self._rounds
        assert rounds is not None
        hit_members = [wid for wid in removed if wid in rounds.members]
        for wid in removed:
            self._stop_worker(wid)
        if hit_members:
            self._reset_cause = self._reset_cause or f"hosts removed: workers {hit_members} stopped"
            self._notify(HostUpdate.REMOVED)

    def _stop_worker(self, wid: int) -> None:
        s = self._record(wid)
        with self._lock:
            s.move(WorkerState.STOPPED)
        self._handled.add(wid)
        assert self._rounds is not None
        self._rounds.leave(wid)
        if s.channel is not None:
            try:
                s.channel.send(Kind.STOP)
            except OSError:
                pass
        self.placement.stop_worker(wid)

    def _complete(self) -> None:
        """Every member of the last round ended and one succeeded: stop whoever still waits."""
        self._completing = True
        for s in list(self._states.values()):
            if not s.state.final:
                self._stop_worker(s.worker_id)

    def _check_shortfall(self, now: float) -> None:
        """Fail once the job had too few workers to form a round for `elastic_timeout`."""
        rounds = self._rounds
        assert rounds is not None
        short = rounds.open and not rounds.blocked_by()
        if not short:
            self._short_since = None
            return
        self._short_since = self._short_since or now
        if now - self._short_since > self.policy.elastic_timeout:
            waiting = len(rounds.waiting)
            raise ElasticTimeoutError(
                f"only {waiting} worker(s) were ready for a new round for "
                f"{self.policy.elastic_timeout:g}s (elastic_timeout), fewer than "
                f"min_workers={self.policy.min_workers}; no replacement came "
                f"(hosts {self._hosts}, cooling down: "
                f"{sorted(h for h, t in self._cooldown_until.items() if t > now) or 'none'})",
                "make more hosts or slots available (host discovery), lower min_workers, "
                "shorten cooldown_range, or raise elastic_timeout", self.attempts)

    def _check_silence(self, now: float) -> None:
        """Under the lock: a worker silent for heartbeat_timeout, or not connected within
        start_timeout, is FAILED (and stopped: it may still be running somewhere)."""
        request = self.request
        for s in self._states.values():
            if s.state.final:
                continue
            why = None
            if s.channel is None and now - s.started_at > request.start_timeout:
                why = f"did not connect within start_timeout={request.start_timeout:g}s"
            elif s.channel is not None and s.finished_at is None and \
                    now - s.last_seen > request.heartbeat_timeout:
                why = (f"sent no heartbeat for {request.heartbeat_timeout:g}s (stopped or hung, or "
                       "its host or network lost)")
            if why is not None:
                self._fail_worker(s, why)

    def _check_frozen(self) -> None:
        """Under the lock: a member of the current round that a peer found frozen (FROZEN) and
        that has not sent JOIN since (a worker that left the round stops beating in it too) is
        FAILED and stopped at once; the heartbeat of a worker hung in native code goes on, and a
        stopped one's silence shows only after heartbeat_timeout."""
        reports, self._frozen = self._frozen, []
        rounds = self._rounds
        for reporter, round_number, rank, message in reports:
            for s in self._states.values():
                world = self._worlds.get(s.worker_id)
                if (world is not None and (world.round, world.rank) == (round_number, rank)
                        and s.state is WorkerState.RUNNING and s.worker_id not in self._joins
                        and rounds is not None and s.worker_id in rounds.blocked_by()):
                    self._fail_worker(s, f"stopped responding (worker {reporter} found: {message})")

    def _fail_worker(self, s: WorkerRecord, why: str) -> None:
        """Under the lock: the driver fails worker `s` itself, for `why`, and stops it."""
        self._causes[s.worker_id] = why
        s.move(WorkerState.FAILED)
        if s.channel is not None:
            try:
                s.channel.send(Kind.STOP)
            except OSError:
                pass
        self.placement.stop_worker(s.worker_id)
