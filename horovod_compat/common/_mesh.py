"""An authenticated TCP mesh between the ranks of a process set: the set's negotiation messages and
its allreduce data when its ranks do not share a host (or shared memory is turned off).

Why not gloo for these: a gloo collective from Python goes through the process group's work queue,
a worker thread and a future, a few hundred microseconds even for eight bytes; a negotiation round
over the mesh is one ``send`` and one ``recv`` per peer (tens of microseconds), and a ring allreduce
driven from the coordinator's thread skips the same hand-offs for the data (``benchmarks/
collectives.py`` prints both against ``dist.all_reduce``).

Set-up (``Mesh.build``, collective over the set's gloo control group): every rank listens on an
ephemeral port (loopback when the set is on one host, else on all interfaces, advertising its
address on the route to the rendezvous host); the set's first rank draws a random secret, handed to
the others over the job's control group with the addresses; then every rank connects to each lower
rank and accepts each higher one, twice (see Liveness below).  Each connection passes
``distributor.protocol``'s mutual HMAC challenge before a byte of it is read, and nothing is ever
unpickled from it: control frames are int64 words and JSON, data are raw tensor bytes.  The
listener authenticates its connections concurrently while the rank connects out
(``protocol.Gatekeeper``, each within ``protocol.HANDSHAKE_TIMEOUT`` s in all), so a stranger's
connection -- silent, dripping, or sending garbage -- delays no rank's handshake; the listener is
closed once every rank has connected.

Use: only the thread that drives the set's rounds touches the sockets, and every rank moves the
same byte counts in the agreed order, so the streams stay aligned without headers on the data.  A
failed transfer (a peer that exited, was killed or called ``shutdown()`` closes its sockets, so its
peers read end of file; keep-alive probes notice a vanished host) breaks the mesh: that op and every
later one raise ``HorovodInternalError``, as misaligned streams cannot be trusted again.

Liveness: each pair of ranks has a second connection, set up and authenticated the same way, that
carries only *beats* (one byte every ``liveness.INTERVAL`` from the process's beat thread) and the
stall inspector's *posts* (``2, <u32 length>, JSON``); the beat thread also drains it.  A transfer
that makes no progress for a moment checks the beats of the peers it waits for
(``liveness.Watch``): a peer whose process is stopped, hung in native code or on a host that became
unreachable shows none, and the transfer raises ``peer_failure(..., frozen=True)`` after
``HOROVOD_COMPAT_FROZEN_SECONDS`` instead of waiting for ``HOROVOD_COMPAT_OP_TIMEOUT``.

Ring allreduce (``allreduce``): the tensor is cut into one chunk per rank; n - 1 reduce-scatter
steps (send a chunk to the right neighbour while receiving one from the left and combining it), then
n - 1 all-gather steps, as in Baidu's and Horovod's ring; sends and receives of a step interleave on
non-blocking sockets, so no rank waits for a peer's buffer to drain.  A small tensor (its bytes
times n - 1 within ``GATHER_BYTES``) is instead sent to every peer at once and each rank combines
the n contributions in rank order (``gather_allreduce``): one hand-off instead of 2(n - 1) in a row.
"""
from __future__ import annotations

import os
import queue
import select
import socket
import struct
import threading
import time
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from distributor import protocol
from distributor.hub import routable_address
from distributor.netif import address_toward, interface_address

from . import liveness, ops
from .exceptions import HorovodInternalError, peer_failure

__all__ = ["Mesh", "MAX_RANKS", "allowed", "data_allowed"]

#: Largest set that builds a mesh (n * (n - 1) / 2 connections); larger sets negotiate over gloo.
MAX_RANKS = 64
_CONNECT_TIMEOUT = 60.0
#: Listen backlog of a set's mesh listener (at least twice its size).
_BACKLOG = 128
_BUF = 4 << 20  # socket buffer size asked for (the kernel caps it)
#: An allreduce whose bytes times (n - 1) peers fit here goes by `Mesh.gather_allreduce`
#: (``HOROVOD_COMPAT_GATHER_BYTES`` overrides it, the same on every rank; 0: always the ring).
GATHER_BYTES = 64 << 10
#: The rank index a connection announces carries this bit when it is the pair's beat connection.
_BEAT = 1 << 31
#: How often a transfer that makes no progress checks its peers' beats (seconds).
_CHECK = 0.25
#: Bytes queued on a beat connection whose peer reads nothing before beats are dropped.
_OUTBOX_LIMIT = 1 << 16


def allowed(n: int) -> bool:
    """Whether a set of ``n`` ranks may negotiate over a mesh (``HOROVOD_COMPAT_TCP_CONTROL=0``:
    over gloo)."""
    return 1 < n <= MAX_RANKS and os.environ.get("HOROVOD_COMPAT_TCP_CONTROL", "1") != "0"


def data_allowed() -> bool:
    """Whether allreduce data may move over the mesh (``HOROVOD_COMPAT_TCP_DATA=0``: over gloo)."""
    return os.environ.get("HOROVOD_COMPAT_TCP_DATA", "1") != "0"


class Mesh:
    """One connection to every other rank of a set; see the module docstring."""

    def __init__(self, me: int, socks: List[Optional[socket.socket]],
                 beat_socks: Optional[List[Optional[socket.socket]]] = None) -> None:
        self.me, self.n = me, len(socks)
        self.socks = socks
        self.peers = [(j, s) for j, s in enumerate(socks) if s is not None]
        self.index = {s: j for j, s in self.peers}
        self.leaving = False
        self.broken: Optional[str] = None
        self.broken_error: Optional[BaseException] = None
        # liveness: one more connection per peer carrying only beats (``liveness``), sent and
        # drained by the process's beat thread; ``beats[j]`` counts the bytes peer j sent
        self.beat_socks = [(j, s) for j, s in enumerate(beat_socks or []) if s is not None]
        self.beats = [0] * self.n
        self.posts: List[Optional[Tuple[float, bytes]]] = [None] * self.n  # (received, payload)
        self._outbox = {j: bytearray() for j, _s in self.beat_socks}
        self._inbox = {j: bytearray() for j, _s in self.beat_socks}
        self._send_lock = threading.Lock()  # the beat thread and the stall inspector send
        self.watch: Optional[liveness.Watch] = None
        self.ranks: Optional[List[int]] = None  # the set's global ranks (``attach``)
        if self.beat_socks:
            liveness.register(self)
        self.timeout = float(os.environ.get("HOROVOD_COMPAT_OP_TIMEOUT", "1800"))
        self.gather_bytes = int(os.environ.get("HOROVOD_COMPAT_GATHER_BYTES", GATHER_BYTES))
        self._scratch = torch.empty(0, dtype=torch.uint8)

    # -- set-up -------------------------------------------------------------------------------
    @classmethod
    def build(cls, me: int, n: int, same_host: bool, ctl: Any) -> "Mesh":
        """Collective over control group ``ctl``: listen, swap addresses and the secret, connect
        (two connections per pair: data and control frames, and beats)."""
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            ls.bind(("127.0.0.1" if same_host else "0.0.0.0", 0))
            ls.listen(max(_BACKLOG, 2 * n))
            addr = "127.0.0.1" if same_host else _routable_address()
            if addr.startswith("127.") and not same_host:
                warnings.warn(f"horovod_compat: this host's address for its peers resolves to "
                              f"{addr}, a loopback address the other hosts cannot reach; set "
                              "GLOO_SOCKET_IFNAME to the interface they share", RuntimeWarning)
            mine = (addr, ls.getsockname()[1], protocol.new_secret() if me == 0 else None)
            info: List[Any] = [None] * n
            dist.all_gather_object(info, mine, group=ctl)
            return cls._connect(ls, me, [(a, p) for a, p, _ in info], info[0][2])
        finally:
            ls.close()

    @classmethod
    def _connect(cls, ls: socket.socket, me: int, addrs: List[Tuple[str, int]],
                 secret: bytes) -> "Mesh":
        """Connect to every lower rank and accept every higher one (twice each).  Connections
        to ``ls`` are authenticated concurrently from the start (`protocol.Gatekeeper`): a
        stranger's connection, silent or not, delays no rank's handshake."""
        n = len(addrs)
        socks: List[Optional[socket.socket]] = [None] * n
        beats: List[Optional[socket.socket]] = [None] * n
        admitted: "queue.Queue[socket.socket]" = queue.Queue()
        waiting = 2 * (n - me - 1)
        gate = protocol.Gatekeeper(ls, secret, lambda s, _peer: admitted.put(s),
                                   what=f"rank {me}'s TCP mesh listener") if waiting else None
        try:
            for j in range(me):
                # two connections: the pair's data and control frames, then its beats
                for table, tag in ((socks, me), (beats, me | _BEAT)):
                    try:
                        s = socket.create_connection(addrs[j], timeout=_CONNECT_TIMEOUT)
                    except OSError as exc:
                        raise ConnectionError(
                            f"rank {me} of a process set cannot reach rank {j} at {addrs[j][0]}:"
                            f"{addrs[j][1]} ({exc}) to build the set's TCP mesh. Name the network "
                            "interface the hosts share with GLOO_SOCKET_IFNAME (horovodrun "
                            "--network-interface), or negotiate over gloo with "
                            "HOROVOD_COMPAT_TCP_CONTROL=0 HOROVOD_COMPAT_TCP_DATA=0") from exc
                    table[j] = s
                    protocol.client_handshake(s, secret)
                    s.sendall(struct.pack("<I", tag))
            deadline = time.monotonic() + _CONNECT_TIMEOUT
            while waiting:
                try:
                    s = admitted.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    missing = sorted({j for j in range(me + 1, n)
                                      if socks[j] is None or beats[j] is None})
                    raise ConnectionError(
                        f"rank {me} of a process set waited {_CONNECT_TIMEOUT:g} s for rank(s) "
                        f"{missing} to connect to its TCP mesh at {ls.getsockname()[0]}:"
                        f"{ls.getsockname()[1]}; they did not (they failed or cannot reach this "
                        f"host; connections that could not prove the set's secret: "
                        f"{gate.rejected if gate else 0}). Name the network interface the hosts "
                        "share with GLOO_SOCKET_IFNAME, or negotiate over gloo with "
                        "HOROVOD_COMPAT_TCP_CONTROL=0 HOROVOD_COMPAT_TCP_DATA=0") from None
                # an authenticated rank of the set: its index comes right after the handshake
                try:
                    j = struct.unpack("<I", protocol.recv_exact(
                        s, 4, time.monotonic() + protocol.HANDSHAKE_TIMEOUT))[0]
                except OSError:
                    s.close()
                    raise
                table = beats if j & _BEAT else socks
                j &= ~_BEAT
                if not me < j < n or table[j] is not None:
                    s.close()
                    raise protocol.AuthenticationError(f"unexpected rank index {j} in the mesh")
                table[j] = s
                waiting -= 1
                deadline = time.monotonic() + _CONNECT_TIMEOUT
        except BaseException:
            for s in socks + beats:
                if s is not None:
                    s.close()
            raise
        finally:
            if gate is not None:
                gate.close()  # strangers still waiting are dropped
            while not admitted.empty():
                admitted.get_nowait().close()
        for s in socks:
            if s is not None:
                _tune(s)
        for s in beats:
            if s is not None:
                s.settimeout(None)
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(me, socks, beats)

    # -- transfers ----------------------------------------------------------------------------
    def exchange(self, frame: bytes, head_size: int,
                 body_size: Callable[[bytearray], int]) -> List[Optional[bytes]]:
        """Send ``frame`` to every peer and read one frame from each: its first ``head_size``
        bytes, then ``body_size(head)`` more.  Returns the peers' frames (None at this rank's
        index)."""
        self._check()
        out: List[Optional[bytes]] = [None] * self.n
        try:
            out_mv = memoryview(frame)
            for _j, s in self.peers:
                self._move(s, out_mv, None, None)
            for j, s in self.peers:
                head = bytearray(head_size)
                self._move(None, None, s, memoryview(head))
                body = bytearray(body_size(head))
                if body:
                    self._move(None, None, s, memoryview(body))
                out[j] = bytes(head + body)
        except HorovodInternalError as exc:
            self._fail(exc)
        return out

    def allreduce(self, pairs: Sequence[Tuple[torch.Tensor, torch.Tensor]], op: int) -> List[Any]:
        """``dst = op(src over the ranks)`` for each pair of contiguous CPU tensors (one dtype and
        numel per pair; ``dst`` may be ``src``), now, in this thread: by `gather_allreduce` when
        the tensor is small (`gathers`), else by the ring.  Returns no works to wait on."""
        self._check()
        combine = ops.COMBINE[op]
        try:
            for src, dst in pairs:
                if self.gathers(src):
                    self._gather_reduce(src, dst, combine)
                    continue
                if dst is not src:
                    dst.copy_(src)
                self._ring(dst.detach().reshape(-1), combine)
        except HorovodInternalError as exc:
            self._fail(exc)
        return []

    def gathers(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is small enough for `gather_allreduce`: what each rank sends, one copy
        per peer, stays within ``GATHER_BYTES``.  Every rank decides alike (same numel and dtype)."""
        return tensor.numel() * tensor.element_size() * (self.n - 1) <= self.gather_bytes

    def gather_allreduce(self, src: torch.Tensor, dst: torch.Tensor, op: int) -> None:
        """``dst = op(src over the ranks)`` for a small contiguous CPU tensor: every rank sends its
        bytes to every peer and combines the n contributions itself, in rank order, so every rank
        ends with the same bytes.  One step where a ring takes 2(n - 1) in sequence, which is
        what a few-byte allreduce costs (each step is a hand-off between processes)."""
        self._check()
        try:
            self._gather_reduce(src, dst, ops.COMBINE[op])
        except HorovodInternalError as exc:
            self._fail(exc)

    def _gather_reduce(self, src: torch.Tensor, dst: torch.Tensor, combine: Any) -> None:
        flat = src.detach().reshape(-1)
        if flat.numel() == 0:
            return
        mine = (flat.view(torch.uint8) if flat.element_size() > 1 else flat).numpy().tobytes()
        frames = self.exchange(mine, len(mine), lambda _head: 0)
        acc: Optional[torch.Tensor] = None
        for j in range(self.n):
            frame = frames[j]
            part = flat if frame is None else \
                torch.frombuffer(bytearray(frame), dtype=torch.uint8).view(flat.dtype)
            if acc is None:
                acc = part.clone()
            else:
                combine(acc, part, out=acc)
        assert acc is not None
        dst.detach().reshape(-1).copy_(acc)

    def ring_allreduce(self, flat: torch.Tensor, op: int, members: Sequence[int]) -> None:
        """``flat = op(flat over members)`` in place, by a ring over ``members`` (indices in the
        set, this rank among them; the others do not take part), now, in this thread."""
        self._check()
        try:
            self._ring(flat, ops.COMBINE[op], members)
        except HorovodInternalError as exc:
            self._fail(exc)

    def _ring(self, flat: torch.Tensor, combine: Any, members: Optional[Sequence[int]] = None) -> None:
        """Ring allreduce of ``flat`` over ``members`` (default: every rank of the set)."""
        ring = list(range(self.n)) if members is None else list(members)
        n, me = len(ring), ring.index(self.me)
        total = flat.numel()
        if total == 0 or n == 1:
            return
        bounds = [total * j // n for j in range(n + 1)]
        raw = flat.view(torch.uint8) if flat.element_size() > 1 else flat
        size = flat.element_size()
        right, left = self.socks[ring[(me + 1) % n]], self.socks[ring[(me - 1) % n]]
        largest = max(bounds[j + 1] - bounds[j] for j in range(n))
        if self._scratch.numel() < largest * size:
            self._scratch = torch.empty(largest * size, dtype=torch.uint8)

        def part(c: int) -> Tuple[int, int]:
            return bounds[c], bounds[c + 1]

        def mv(c: int) -> memoryview:
            lo, hi = part(c)
            return memoryview(raw[lo * size:hi * size].numpy())

        for s in range(n - 1):  # reduce-scatter: after it, rank r owns chunk (r + 1) % n
            send_c, recv_c = (me - s) % n, (me - s - 1) % n
            lo, hi = part(recv_c)
            tmp = self._scratch[:(hi - lo) * size]
            self._move(right, mv(send_c), left, memoryview(tmp.numpy()))
            if hi > lo:
                mine = flat[lo:hi]
                combine(mine, tmp.view(flat.dtype), out=mine)
        for s in range(n - 1):  # all-gather of the reduced chunks
            send_c, recv_c = (me + 1 - s) % n, (me - s) % n
            self._move(right, mv(send_c), left, mv(recv_c))

    def _move(self, out_s: Optional[socket.socket], out_mv: Optional[memoryview],
              in_s: Optional[socket.socket], in_mv: Optional[memoryview]) -> None:
        """Send all of ``out_mv`` on ``out_s`` while reading exactly ``len(in_mv)`` bytes from
        ``in_s`` (either side may be None)."""
        sent, got, deadline, check_at = 0, 0, 0.0, 0.0
        ns = len(out_mv) if out_mv is not None else 0
        nr = len(in_mv) if in_mv is not None else 0
        while sent < ns or got < nr:
            progressed = False
            if sent < ns:
                try:
                    sent += out_s.send(out_mv[sent:])
                    progressed = True
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    raise self._lost(out_s, exc) from exc
            if got < nr:
                try:
                    k = in_s.recv_into(in_mv[got:])
                except (BlockingIOError, InterruptedError):
                    k = -1
                except OSError as exc:
                    raise self._lost(in_s, exc) from exc
                if k == 0:
                    raise self._lost(in_s, None)
                if k > 0:
                    got += k
                    progressed = True
            if progressed:
                deadline = 0.0  # the timeout counts time without any progress
            else:
                now = time.monotonic()
                if not deadline:
                    deadline, check_at = now + self.timeout, now + _CHECK
                if now >= deadline:
                    raise peer_failure(
                        f"no progress from a peer within HOROVOD_COMPAT_OP_TIMEOUT={self.timeout:g} s "
                        "(it is stuck, or much slower than this rank)", frozen=True)
                if self.watch is not None and now >= check_at:
                    # stuck for a while: are the peers this transfer waits for still alive?
                    check_at = now + _CHECK
                    self.watch.check([self.index[x] for x, busy in ((in_s, got < nr),
                                                                    (out_s, sent < ns)) if busy],
                                     "a transfer over the TCP mesh")
                _wait(in_s if got < nr else None, out_s if sent < ns else None,
                      min(deadline - now, _CHECK))

    def _lost(self, s: socket.socket, exc: Optional[BaseException]) -> HorovodInternalError:
        if self.leaving:
            return HorovodInternalError("Horovod has been shut down on this rank")
        j = self.socks.index(s)
        why = f": {exc}" if exc is not None else ""
        return peer_failure(
            f"rank {j} of this process set closed its connection (it called hvd.shutdown(), exited "
            f"or was killed) while this rank exchanged data with it{why}",
            peer=self.ranks[j] if self.ranks is not None else None)

    def _check(self) -> None:
        if self.broken is not None:
            raise liveness.same_kind(self.broken_error, self.broken)

    def _fail(self, exc: HorovodInternalError) -> None:
        self.broken, self.broken_error = str(exc), exc
        raise exc

    # -- liveness -----------------------------------------------------------------------------
    def attach(self, watch: Optional[liveness.Watch], ranks: Sequence[int]) -> None:
        """Check ``watch`` (built on this mesh's beats) in transfers that stall; ``ranks``: the
        set's global ranks, for the errors."""
        self.watch, self.ranks = watch, list(ranks)

    def beat(self) -> None:
        """One beat to every peer, and read the peers' beats and posts; the beat thread calls
        it.  Frames on a beat connection: ``1`` (a beat) or ``2, <u32 length>, payload`` (a
        post)."""
        self._send(b"\x01")
        for j, s in self.beat_socks:
            self._read_beats(j, s)

    def _send(self, frame: bytes) -> None:
        """Queue ``frame`` to every peer's beat connection and send what the sockets take."""
        with self._send_lock:
            for j, s in self.beat_socks:
                out = self._outbox[j]
                if len(out) < _OUTBOX_LIMIT:  # else the peer reads nothing: frozen or gone
                    out += frame
                try:
                    del out[:s.send(out)]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    out.clear()  # gone: its data connection says so

    def _read_beats(self, j: int, s: socket.socket) -> None:
        inbox = self._inbox[j]
        while True:
            try:
                chunk = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not chunk:
                break  # gone: its data connection says so
            inbox += chunk
        i, end = 0, len(inbox)
        while i < end:
            kind = inbox[i]
            if kind == 1:
                self.beats[j] += 1
                i += 1
            elif kind == 2 and end - i >= 5:
                size = struct.unpack_from("<I", inbox, i + 1)[0]
                if size > liveness.POST_BYTES:
                    inbox.clear()  # not our framing (cannot happen between authenticated ranks)
                    return
                if end - i - 5 < size:
                    break
                self.posts[j] = (time.monotonic(), bytes(inbox[i + 5:i + 5 + size]))
                self.beats[j] += 1
                i += 5 + size
            elif kind == 2:
                break
            else:
                inbox.clear()
                return
        del inbox[:i]

    def count(self, j: int) -> int:
        """How many beats peer ``j`` sent so far (``liveness.Watch``)."""
        return self.beats[j]

    def post(self, payload: bytes) -> None:
        """Send ``payload`` (this rank's stall-inspector post) to every peer."""
        self._send(b"\x02" + struct.pack("<I", len(payload)) + payload)

    def posted(self, j: int) -> Optional[Tuple[float, bytes]]:
        """``(time received, payload)`` of peer ``j``'s latest post, or None."""
        return self.posts[j]

    # -- shutdown -----------------------------------------------------------------------------
    def leave(self) -> None:
        """Shut the connections down: peers read end of file and raise; a thread of ours blocked
        on them wakes up and raises too."""
        self.leaving = True
        liveness.unregister(self)
        for _j, s in self.peers + self.beat_socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        liveness.unregister(self)
        for _j, s in self.peers + self.beat_socks:
            s.close()


def _wait(readable: Optional[socket.socket], writable: Optional[socket.socket],
          seconds: float) -> None:
    """Until ``readable`` can be read or ``writable`` written, at most ``seconds`` (``poll``:
    unlike ``select``, any descriptor number works, so a process with many open files is fine)."""
    masks: dict = {}
    if readable is not None:
        masks[readable.fileno()] = select.POLLIN
    if writable is not None:
        masks[writable.fileno()] = masks.get(writable.fileno(), 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    poller.poll(max(0.0, seconds) * 1000.0)


def _tune(s: socket.socket) -> None:
    s.settimeout(None)
    s.setblocking(False)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, _BUF)
        except OSError:
            pass


def _routable_address() -> str:
    """The address this host's peers reach it at: that of the first interface in
    ``GLOO_SOCKET_IFNAME`` (what ``horovodrun --network-interface`` sets, so the mesh and gloo use
    the same NIC), else this host's address on the route to the job's rendezvous host."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if iface:
        return _interface_address(iface)
    target = os.environ.get("MASTER_ADDR") or os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    try:
        return address_toward(target or socket.gethostname())
    except OSError:
        return routable_address()


def _interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name``, or ValueError saying what to pass."""
    try:
        return interface_address(name)
    except OSError as exc:
        raise ValueError(f"GLOO_SOCKET_IFNAME names interface {name!r}, which has no IPv4 address "
                         f"here ({exc}); pass an interface this host has (see `ip addr`)") from exc
