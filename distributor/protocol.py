"""The wire protocol between ranks (or their supervisors) and the driver hub.

A connection starts with a mutual HMAC-SHA256 challenge over the job's random secret: each side
sends a random nonce and must answer the other's with HMAC(secret, nonce + role). Until both
answers check out nothing else is read, and nothing is ever unpickled from a peer that has not
proved the secret. After that, each message is one frame: 1 byte kind, 8 bytes big-endian length,
then the body (a pickle, or raw bytes for PAYLOAD and RESULT).

A handshake has ``HANDSHAKE_TIMEOUT`` seconds in all, however its bytes trickle in. A server
authenticates the connections it accepts with a `Gatekeeper`: all of them at once, in one thread,
so a stranger that connects and sends nothing (or a byte now and then) cannot delay a genuine
peer's handshake, and at most ``PENDING_LIMIT`` unauthenticated connections are held (a new one
beyond that drops the oldest). Rejections are logged without flooding the log (`Rejections`).
"""
from __future__ import annotations

import enum
import errno
import hmac
import logging
import pickle
import secrets
import selectors
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

_NONCE_BYTES = 32
_DIGEST = "sha256"
_HEADER = struct.Struct("!BQ")
#: Seconds a whole handshake may take (not each read of it).
HANDSHAKE_TIMEOUT = 10.0
#: Most connections a `Gatekeeper` holds while they have not proved the secret yet.
PENDING_LIMIT = 256
#: A `Rejections` log says how many more connections it rejected at most once per this many seconds.
SUMMARY_SECONDS = 60.0
#: Bytes a client sends in answer to the server's challenge: its HMAC, then its own nonce.
REPLY_BYTES = 32 + _NONCE_BYTES


class AuthenticationError(ConnectionError):
    """The peer did not prove knowledge of the job secret."""


class Kind(enum.IntEnum):
    """Message kinds. Rank → driver unless noted."""

    HELLO = 1  # (rank,) a rank process asks for its payload
    PAYLOAD = 2  # driver → rank: the pickled target
    OUTPUT = 3  # (rank, stream, line) one output line, from a supervisor
    RESULT = 4  # raw pickled return value
    ERROR = 5  # dict: exc_type, exc_message, traceback, time, where (innermost "file:line")
    HEARTBEAT = 6  # ()
    EXITED = 7  # (rank, returncode) from a supervisor
    STOP = 8  # driver → supervisor/rank: stop now
    AGENT = 9  # (task index, [ranks]) a supervisor in a Spark task announces the ranks it runs
    MESSAGE = 10  # (rank, object) sent by user code with distributor.worker.send_to_driver
    SPAWN = 11  # remote shell → driver: (task index, command); driver → task: (spawn id, command)
    SPAWN_EXIT = 12  # task → driver: (spawn id, exit status); driver → remote shell: exit status
    SLOT = 13  # Spark task → driver: ((stage, attempt), partition, task count, slot)
    SLOTS = 14  # driver → every Spark task: [slot of each partition] once all have arrived
    # elastic jobs (distributor/elastic/): a worker's place in the job changes between rounds
    JOIN = 15  # (last round seen, or -1) the worker left its world and waits for the next one
    WORLD = 16  # driver → worker: its `elastic.world.World` in the round that just formed
    HOSTS_UPDATED = 17  # driver → worker: (timestamp, HostUpdate flags) hosts were added/removed
    WORKER = 18  # driver → Spark task of an elastic job: ("start", RankSpec) or ("stop", worker id)
    LOST = 19  # driver → worker: (round, rank) a member of the worker's round failed
    FROZEN = 20  # (round, rank, message) a member of the worker's round stopped responding
    TASK_DONE = 21  # (task index,) a Spark task's supervisor ends in order: its ranks have ended


class PayloadFlag(enum.IntFlag):
    """First byte of a PAYLOAD frame: what the driver asks of the rank besides running it."""

    SEND_RESULT = 1  # send the return value back (else an empty RESULT says it succeeded)
    #: After its RESULT, a rank whose process holds a torch.distributed process group keeps the
    #: process (the TCPStore rank 0 serves, its gloo connections) until the driver's STOP, which
    #: comes once every rank has finished: a peer may still be connecting to it (torchrun's agent
    #: keeps the store alive in the same way).
    HOLD = 2


def payload_frame(flags: PayloadFlag, payload: bytes) -> bytes:
    """The body of a PAYLOAD frame."""
    return bytes([int(flags)]) + payload


def split_payload(body: bytes) -> Tuple[PayloadFlag, bytes]:
    """A PAYLOAD frame's body as (flags, pickled target)."""
    return PayloadFlag(body[0]), body[1:]


def new_secret() -> bytes:
    """A fresh random per-job secret."""
    return secrets.token_bytes(32)


def _answer(secret: bytes, nonce: bytes, role: bytes) -> bytes:
    return hmac.new(secret, nonce + role, _DIGEST).digest()


def recv_exact(sock: socket.socket, size: int, deadline: Optional[float] = None) -> bytes:
    """Exactly `size` bytes from `sock`; ConnectionError if the peer closes first. With `deadline`
    (a `time.monotonic()` value) `socket.timeout` once it passes, however the bytes trickle in
    (the socket's timeout is changed for that)."""
    chunks = []
    remaining = size
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"timed out with {remaining} of {size} bytes still to come")
            sock.settimeout(left)
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class Challenge:
    """The server's side of one handshake: send `nonce`, read `REPLY_BYTES` from the peer, and
    `answer(reply)` checks them and returns what to send back (`AuthenticationError` when the
    peer does not know the secret)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self.nonce = secrets.token_bytes(_NONCE_BYTES)

    def answer(self, reply: bytes) -> bytes:
        if len(reply) != REPLY_BYTES or not hmac.compare_digest(
                reply[:32], _answer(self._secret, self.nonce, b"client")):
            raise AuthenticationError("peer failed the job-secret challenge")
        return _answer(self._secret, reply[32:], b"server")


def client_handshake(sock: socket.socket, secret: bytes, timeout: Optional[float] = None) -> None:
    """Prove the secret to the server and check that it knows it too, within `timeout` seconds in
    all (default `HANDSHAKE_TIMEOUT`)."""
    deadline = time.monotonic() + (HANDSHAKE_TIMEOUT if timeout is None else timeout)
    try:
        nonce = recv_exact(sock, _NONCE_BYTES, deadline)
        mine = secrets.token_bytes(_NONCE_BYTES)
        sock.sendall(_answer(secret, nonce, b"client") + mine)
        if not hmac.compare_digest(recv_exact(sock, 32, deadline), _answer(secret, mine, b"server")):
            raise AuthenticationError("the driver hub failed the job-secret challenge")
    finally:
        sock.settimeout(None)


class Rejections:
    """Counts the connections a server rejected and logs them without flooding the log: the
    first at once (with its reason), then at most one line per `interval` seconds with how many
    more there were since the last line, and the rest when the server closes (`flush`)."""

    def __init__(self, logger: Optional[logging.Logger], what: str,
                 interval: float = SUMMARY_SECONDS) -> None:
        self._log, self._what, self._interval = logger, what, interval
        self._lock = threading.Lock()
        self.count = 0
        self._unlogged = 0
        self._logged_at = 0.0
        self._last = ""

    def add(self, peer: Any, reason: Any) -> None:
        with self._lock:
            self.count += 1
            self._last = f"the last from {_peer_name(peer)}: {reason}"
            if self.count == 1:
                line = (f"{self._what} rejected a connection from {_peer_name(peer)}: {reason} "
                        f"(more rejections are counted and logged at most every "
                        f"{self._interval:g} s)")
            else:
                self._unlogged += 1
                if time.monotonic() - self._logged_at < self._interval:
                    return
                line = self._summary()
            self._logged_at = time.monotonic()
        if self._log is not None:
            self._log.warning("%s", line)

    def flush(self) -> None:
        """Log what was not logged yet."""
        with self._lock:
            if not self._unlogged:
                return
            line = self._summary()
        if self._log is not None:
            self._log.warning("%s", line)

    def _summary(self) -> str:
        n, self._unlogged = self._unlogged, 0
        return (f"{self._what} rejected {n} more connection{'s' if n != 1 else ''} that did not "
                f"prove the job secret ({self.count} in all; {self._last})")


def _peer_name(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class _Pending:
    __slots__ = ("sock", "peer", "challenge", "reply", "deadline")

    def __init__(self, sock: socket.socket, peer: Any, challenge: Challenge, deadline: float) -> None:
        self.sock, self.peer, self.challenge, self.deadline = sock, peer, challenge, deadline
        self.reply = bytearray()


class Gatekeeper:
    """Accepts connections on `listener` and authenticates them concurrently, in one thread.

    Each accepted connection gets the challenge at once and has ``timeout`` seconds in all to
    answer (default `HANDSHAKE_TIMEOUT`); connections are served as their bytes arrive, so a
    silent or slow stranger delays no one. Nothing beyond the challenge's reply is read before the
    peer proved the secret. A peer that proves it is handed, blocking and with no timeout, to
    ``on_admitted(sock, peer)`` (called in the gatekeeper's thread: it must not block); the
    others are closed and counted in `rejections` (logged to ``logger`` as ``what``, without
    flooding). At most ``limit`` (default `PENDING_LIMIT`) connections wait at once: one more
    closes the oldest. `close` stops it (the caller closes ``listener``)."""

    def __init__(self, listener: socket.socket, secret: bytes,
                 on_admitted: Callable[[socket.socket, Any], None], *, what: str,
                 logger: Optional[logging.Logger] = None, timeout: Optional[float] = None,
                 limit: Optional[int] = None) -> None:
        self._listener, self._secret, self._on_admitted = listener, secret, on_admitted
        self._timeout = HANDSHAKE_TIMEOUT if timeout is None else timeout
        self._limit = max(1, PENDING_LIMIT if limit is None else limit)
        self.rejections = Rejections(logger, what)
        self._pending: Dict[socket.socket, _Pending] = {}  # insertion order: oldest first
        self._stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()  # epoll: no limit on descriptor numbers
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name=f"{what} gatekeeper", daemon=True)
        self._thread.start()

    @property
    def rejected(self) -> int:
        """How many connections failed (or never finished) the challenge so far."""
        return self.rejections.count

    @property
    def waiting(self) -> int:
        """Connections accepted that have not proved the secret yet."""
        return len(self._pending)

    def close(self) -> None:
        """Stop accepting; drop the connections still waiting; log the rejections not logged."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    # -- the gatekeeper's thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                wait = 1.0
                if self._pending:
                    wait = min(wait, max(0.0, next(iter(self._pending.values())).deadline - now))
                for key, _events in self._selector.select(wait):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._stopping = True
                    else:
                        self._read(self._pending.get(key.fileobj))  # type: ignore[arg-type]
                now = time.monotonic()
                while self._pending:
                    oldest = next(iter(self._pending.values()))
                    if oldest.deadline > now:
                        break
                    self._reject(oldest, f"did not answer the challenge within {self._timeout:g} s")
        finally:
            for entry in list(self._pending.values()):
                self._drop(entry)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
            self.rejections.flush()

    def _accept(self) -> None:
        for _ in range(64):  # then let the others be served too
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors: free the oldest waiting one, else let the others' go
                    if self._pending:
                        self._reject(next(iter(self._pending.values())),
                                     "dropped: this process ran out of file descriptors")
                    else:
                        time.sleep(0.05)
                    return
                if self._stopping:
                    return
                raise
            entry = _Pending(sock, peer, Challenge(self._secret), time.monotonic() + self._timeout)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if sock.send(entry.challenge.nonce) != _NONCE_BYTES:  # an empty buffer takes it
                    raise ConnectionError("the challenge did not fit the socket's buffer")
            except OSError as exc:
                self.rejections.add(peer, f"handshake failed: {exc}")
                sock.close()
                continue
            if len(self._pending) >= self._limit:
                self._reject(next(iter(self._pending.values())),
                             f"dropped: {self._limit} connections were waiting to authenticate")
            self._pending[sock] = entry
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, entry: Optional[_Pending]) -> None:
        if entry is None:
            return
        try:
            chunk = entry.sock.recv(REPLY_BYTES - len(entry.reply))  # never past the reply
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._reject(entry, f"handshake failed: {exc}")
            return
        if not chunk:
            self._reject(entry, "handshake failed: connection closed by peer")
            return
        entry.reply += chunk
        if len(entry.reply) < REPLY_BYTES:
            return
        try:
            answer = entry.challenge.answer(bytes(entry.reply))
            self._forget(entry)
            entry.sock.setblocking(True)
            entry.sock.settimeout(self._timeout)
            entry.sock.sendall(answer)
            entry.sock.settimeout(None)
        except (AuthenticationError, OSError) as exc:
            self._reject(entry, exc if isinstance(exc, AuthenticationError)
                         else f"handshake failed: {exc}")
            return
        if self._stopping:
            entry.sock.close()
            return
        try:
            self._on_admitted(entry.sock, entry.peer)
        except Exception as exc:  # noqa: BLE001 - e.g. no thread to serve it: drop this peer only
            self.rejections.add(entry.peer, f"admitted, but could not be served: {exc!r}")
            entry.sock.close()

    def _forget(self, entry: _Pending) -> None:
        if self._pending.pop(entry.sock, None) is not None:
            try:
                self._selector.unregister(entry.sock)
            except (KeyError, ValueError):
                pass

    def _drop(self, entry: _Pending) -> None:
        self._forget(entry)
        try:
            entry.sock.close()
        except OSError:
            pass

    def _reject(self, entry: _Pending, reason: Any) -> None:
        self.rejections.add(entry.peer, reason)  # counted before the peer can see the close
        self._drop(entry)


class Channel:
    """An authenticated connection that sends and receives frames; sending is thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, kind: Kind, body: Any = None, raw: bool = False) -> None:
        """Send one frame; `raw` bodies are bytes sent as they are, others are pickled."""
        data = body if raw else pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
        header = _HEADER.pack(kind, len(data))
        with self._send_lock:
            if len(data) < 65536:
                self.sock.sendall(header + data)
            else:
                self.sock.sendall(header)
                self.sock.sendall(data)

    def recv(self) -> Tuple[Kind, Any]:
        """Receive one frame; PAYLOAD and RESULT bodies come back as raw bytes."""
        kind, size = _HEADER.unpack(recv_exact(self.sock, _HEADER.size))
        data = recv_exact(self.sock, size)
        kind = Kind(kind)
        return kind, (data if kind in _RAW_KINDS else pickle.loads(data))

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


_RAW_KINDS = frozenset({Kind.PAYLOAD, Kind.RESULT})


def connect(address: Tuple[str, int], secret: bytes, timeout: float = 30.0) -> Channel:
    """Open an authenticated connection to the hub."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client_handshake(sock, secret)
    return Channel(sock)
