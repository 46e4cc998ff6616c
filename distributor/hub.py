"""The driver hub: one authenticated TCP server per job.

Ranks (and, on a cluster, the per-host supervisors) connect here, prove the job secret, and then
exchange frames with the engine. A peer that fails the challenge is dropped without a byte of its
data being interpreted; the job goes on. Connections are authenticated by a
`protocol.Gatekeeper`: all at once, each within `protocol.HANDSHAKE_TIMEOUT` seconds in all, so
silent or slow strangers delay no genuine peer; the first rejection is logged with its reason,
later ones as a count at most once a minute.
"""
from __future__ import annotations

import itertools
import logging
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import protocol
from .protocol import Channel, Kind

log = logging.getLogger(__name__)

#: Called for each frame of an authenticated peer: (channel, kind, body).
FrameHandler = Callable[[Channel, Kind, Any], None]
#: Called once when an authenticated peer's connection ends.
CloseHandler = Callable[[Channel], None]


class DriverHub:
    """Accepts authenticated connections and hands their frames to the engine."""

    def __init__(
        self,
        secret: bytes,
        on_frame: FrameHandler,
        on_close: CloseHandler,
        bind_host: str = "127.0.0.1",
    ) -> None:
        self._secret = secret
        self._on_frame = on_frame
        self._on_close = on_close
        self._server = socket.create_server((bind_host, 0), backlog=128)
        self.address: Tuple[str, int] = self._server.getsockname()[:2]
        self._channels: List[Channel] = []
        self._lock = threading.Lock()
        self._closed = False
        self._gate = protocol.Gatekeeper(self._server, secret, self._admitted, what="driver hub",
                                         logger=log)

    @property
    def rejected_peers(self) -> int:
        """How many connections failed (or never finished) the job-secret challenge."""
        return self._gate.rejected

    def _admitted(self, sock: socket.socket, peer: Any) -> None:
        threading.Thread(
            target=self._serve, args=(sock,), name=f"distributor-hub-{peer}", daemon=True
        ).start()

    def _serve(self, sock: socket.socket) -> None:
        channel = Channel(sock)
        with self._lock:
            if self._closed:
                channel.close()
                return
            self._channels.append(channel)
        try:
            while True:
                kind, body = channel.recv()
                self._on_frame(channel, kind, body)
        except (ConnectionError, OSError):
            pass
        finally:
            channel.close()
            self._on_close(channel)

    def broadcast(self, kind: Kind, body: Any = None) -> None:
        """Send a frame to every connected peer, ignoring peers that are already gone."""
        with self._lock:
            channels = list(self._channels)
        for channel in channels:
            try:
                channel.send(kind, body)
            except OSError:
                pass

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, []
        self._gate.close()
        self._server.close()
        for channel in channels:
            channel.close()


def routable_address(hint: Optional[str] = None) -> str:
    """The address ranks on other hosts should use to reach this host: `hint` if given."""
    if hint:
        return hint
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class SpawnRouter:
    """Routes remote-shell requests between hub peers: a command for barrier task N goes to the
    supervisor that announced itself as task N (queued until it has), and the command's exit
    status goes back to the requester. Used by mpirun across Spark tasks (no ssh)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: Dict[int, Channel] = {}
        self._queued: Dict[int, List[Tuple[int, str]]] = {}
        self._requesters: Dict[int, Channel] = {}
        self._ids = itertools.count()

    def task_announced(self, index: int, channel: Channel) -> None:
        with self._lock:
            self._tasks[index] = channel
            queued = self._queued.pop(index, [])
        for spawn_id, command in queued:
            _send_quietly(channel, Kind.SPAWN, (spawn_id, command))

    def spawn_requested(self, requester: Channel, index: int, command: str) -> None:
        with self._lock:
            spawn_id = next(self._ids)
            self._requesters[spawn_id] = requester
            task = self._tasks.get(index)
            if task is None:
                self._queued.setdefault(index, []).append((spawn_id, command))
        if task is not None:
            _send_quietly(task, Kind.SPAWN, (spawn_id, command))

    def spawn_exited(self, spawn_id: int, status: int) -> None:
        with self._lock:
            requester = self._requesters.pop(spawn_id, None)
        if requester is not None:
            _send_quietly(requester, Kind.SPAWN_EXIT, status)


class TaskRendezvous:
    """Gathers every Spark barrier task's slot (host, port, GPUs) and sends the full list back to
    each task once all have arrived: what `BarrierTaskContext.allGather` does, without its cost
    (Spark's allGather polls for completion in 1 s steps, which was most of a small job's launch
    time). Rounds are keyed by (stage, task attempt), so a retried stage gathers afresh."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: Dict[Any, Dict[int, Tuple[Channel, Any]]] = {}

    def slot_offered(self, channel: Channel, attempt: Any, partition: int, tasks: int, slot: Any) -> None:
        with self._lock:
            offers = self._rounds.setdefault(attempt, {})
            offers[partition] = (channel, slot)
            if len(offers) < tasks:
                return
            del self._rounds[attempt]
        ordered = [offers[p] for p in range(tasks)]
        slots = [slot for _, slot in ordered]
        for task_channel, _ in ordered:
            _send_quietly(task_channel, Kind.SLOTS, slots)


def _send_quietly(channel: Channel, kind: Kind, body: Any) -> None:
    try:
        channel.send(kind, body)
    except OSError:
        pass  # that peer is gone; its own connection loss is handled elsewhere
