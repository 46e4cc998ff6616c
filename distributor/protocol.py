"""The wire protocol between ranks (or their supervisors) and the driver hub.

A connection starts with a mutual HMAC-SHA256 challenge over the job's random secret: each side
sends a random nonce and must answer the other's with HMAC(secret, nonce + role). Until both
answers check out nothing else is read, and nothing is ever unpickled from a peer that has not
proved the secret. After that, each message is one frame: 1 byte kind, 8 bytes big-endian length,
then the body (a pickle, or raw bytes for PAYLOAD and RESULT).
"""
from __future__ import annotations

import enum
import hmac
import pickle
import secrets
import socket
import struct
import threading
from typing import Any, Tuple

_NONCE_BYTES = 32
_DIGEST = "sha256"
_HEADER = struct.Struct("!BQ")
HANDSHAKE_TIMEOUT = 10.0


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


#: First byte of a PAYLOAD frame: whether the rank must send its return value back.
SEND_NOTHING = b"\x00"
SEND_RESULT = b"\x01"


def new_secret() -> bytes:
    """A fresh random per-job secret."""
    return secrets.token_bytes(32)


def _answer(secret: bytes, nonce: bytes, role: bytes) -> bytes:
    return hmac.new(secret, nonce + role, _DIGEST).digest()


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes from `sock`; ConnectionError if the peer closes first."""
    chunks = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def server_handshake(sock: socket.socket, secret: bytes) -> None:
    """Authenticate a freshly accepted peer; raise `AuthenticationError` if it fails."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    try:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sock.sendall(nonce)
        reply = recv_exact(sock, 32 + _NONCE_BYTES)
        if not hmac.compare_digest(reply[:32], _answer(secret, nonce, b"client")):
            raise AuthenticationError("peer failed the job-secret challenge")
        sock.sendall(_answer(secret, reply[32:], b"server"))
    except (OSError, ConnectionError) as exc:
        if isinstance(exc, AuthenticationError):
            raise
        raise AuthenticationError(f"handshake failed: {exc}") from exc
    finally:
        sock.settimeout(None)


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Prove the secret to the hub and check that the hub knows it too."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    try:
        nonce = recv_exact(sock, _NONCE_BYTES)
        mine = secrets.token_bytes(_NONCE_BYTES)
        sock.sendall(_answer(secret, nonce, b"client") + mine)
        if not hmac.compare_digest(recv_exact(sock, 32), _answer(secret, mine, b"server")):
            raise AuthenticationError("the driver hub failed the job-secret challenge")
    finally:
        sock.settimeout(None)


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
