"""The control exchange under the coordinator: one small message from every rank of a process set
per negotiation round, delivered to every rank (an all-gather).

A message is a list of int64 *words* (at most ``WORDS``) plus an optional byte *blob* (the full
descriptors of ops that missed the response cache).  Three implementations, chosen per process set
when it is registered; the coordinator (``negotiation``) cannot tell them apart:

* ``ShmExchange`` -- every rank of the set on this host (x86-64, ``/dev/shm``): each rank owns a row
  of a shared segment and writes round ``r``'s message into bank ``r % 2`` of its row, then its
  sequence word.  A reader waits until every row shows ``r``.  Two banks suffice: a rank writes
  bank ``b`` again (round ``r + 2``) only after it saw every peer post round ``r + 1``, which a peer
  does only after it finished reading round ``r``.  A round costs a few memory stores and reads.
  Waiting spins, then yields, then sleeps (``_shm.PeerWatch``), checking that the peers' processes
  are alive and that none has left the job (its ``bye`` word), so a dead or departed peer raises
  ``HorovodInternalError`` within a fraction of a second.
* ``TcpExchange`` -- ranks on several hosts (or ``HOROVOD_COMPAT_SHM_CONTROL=0``), sets of up to
  ``_mesh.MAX_RANKS`` ranks: one frame to and from every peer over the set's authenticated TCP mesh
  (``_mesh``), tens of microseconds where a gloo all-gather costs a few hundred.  A peer that exits,
  is killed or leaves closes its connections: the others read end of file and raise
  ``HorovodInternalError`` at once.
* ``GlooExchange`` -- larger sets (a full mesh would hold too many connections) or
  ``HOROVOD_COMPAT_TCP_CONTROL=0``: one ``all_gather_into_tensor`` of the
  fixed-size word vector on the set's control group, and a second one for the blobs only in rounds
  where some rank has one.  A peer that died breaks gloo's connection: the gather raises and the
  coordinator turns that into ``HorovodInternalError``.

Memory ordering of the shared rows relies on x86-64's total store order (data stores, then the
sequence store), as the shared-memory data transport does.
"""
from __future__ import annotations

import os
import platform
import socket
import struct
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _mesh, _shm, liveness
from .exceptions import HorovodInternalError, peer_failure

__all__ = ["WORDS", "Message", "GlooExchange", "ShmExchange", "TcpExchange", "create"]

#: int64 words in one rank's message (header + entries); the coordinator packs at most this many.
WORDS = 3 + 3 * 48
#: one rank's blob capacity per round (bytes); the coordinator defers what does not fit.
BLOB_BYTES = 64 << 10

Message = Tuple[List[int], bytes]

_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class GlooExchange:
    """All-gather of the messages over the set's gloo control group."""

    blob_capacity = BLOB_BYTES

    def __init__(self, group: Any, n: int) -> None:
        self.group, self.n = group, n
        self.send = torch.zeros(WORDS, dtype=torch.int64)
        self.recv = torch.zeros(n * WORDS, dtype=torch.int64)

    def gather(self, words: Sequence[int], blob: bytes) -> List[Message]:
        send = self.send
        send.zero_()
        send[:len(words)] = torch.tensor(words, dtype=torch.int64)
        send[2] = len(blob)
        _gather(self.recv, send, group=self.group)
        rows = self.recv.view(self.n, WORDS).tolist()
        longest = max(r[2] for r in rows)
        if not longest:
            return [(r, b"") for r in rows]
        sb = torch.zeros(longest, dtype=torch.uint8)
        if blob:
            sb[:len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        rb = torch.empty(self.n * longest, dtype=torch.uint8)
        _gather(rb, sb, group=self.group)
        raw = rb.numpy().tobytes()
        return [(r, raw[i * longest:i * longest + r[2]]) for i, r in enumerate(rows)]

    def leave(self) -> None:
        """Nothing to announce: closing the process group breaks the peers' pending gathers."""

    def close(self) -> None:
        pass


class TcpExchange:
    """All-gather of the messages over the set's TCP mesh (``_mesh``).

    Frame: ``<u32 word count><u32 blob bytes>``, the words (int64, little-endian), the blob."""

    blob_capacity = BLOB_BYTES
    _HEAD = struct.Struct("<II")

    def __init__(self, mesh: _mesh.Mesh) -> None:
        self.mesh = mesh

    def gather(self, words: Sequence[int], blob: bytes) -> List[Message]:
        nw = len(words)
        frame = self._HEAD.pack(nw, len(blob)) + struct.pack(f"<{nw}q", *words) + blob
        frames = self.mesh.exchange(frame, self._HEAD.size, self._body_size)
        out: List[Message] = []
        for j, f in enumerate(frames):
            if f is None:
                out.append((list(words), blob))
                continue
            cw, _cb = self._HEAD.unpack_from(f)
            end = self._HEAD.size + 8 * cw
            out.append((list(struct.unpack_from(f"<{cw}q", f, self._HEAD.size)), f[end:]))
        return out

    def _body_size(self, head: bytearray) -> int:
        cw, cb = self._HEAD.unpack(head)
        return 8 * cw + cb

    def leave(self) -> None:
        """Shut the mesh down: peers waiting for this rank read end of file and raise."""
        self.mesh.leave()

    def close(self) -> None:
        self.mesh.close()


class ShmExchange:
    """All-gather of the messages through a shared segment (every rank on this host)."""

    blob_capacity = BLOB_BYTES
    HEAD = 8  # words per row header: sequence, bye, padding to one cache line

    def __init__(self, mm: Any, n: int, me: int, pids: List[int],
                 ranks: Optional[Sequence[int]] = None) -> None:
        self.mm, self.n, self.me = mm, n, me
        self.ranks = list(ranks) if ranks is not None else list(range(n))  # global, by set index
        self.words = memoryview(mm).cast("q")
        self.bytes = memoryview(mm)
        self.bank = WORDS * 8 + BLOB_BYTES
        self.row = self.HEAD * 8 + 2 * self.bank  # bytes, a multiple of 8
        self.watch = _shm.PeerWatch(pids, me)
        self.seq = 0
        self.leaving = False

    @staticmethod
    def size(n: int) -> int:
        return n * (ShmExchange.HEAD * 8 + 2 * (WORDS * 8 + BLOB_BYTES))

    def pending(self) -> List[int]:
        """The peers (set indices) whose message of the current round has not arrived yet."""
        w, step = self.words, self.row // 8
        return [j for j in range(self.n) if w[j * step] < self.seq]

    def _posted(self, s: int) -> bool:
        w, step = self.words, self.row // 8
        for j in range(self.n):
            if w[j * step] < s:
                # a peer posts, then (maybe right after, its op done) leaves: having read its
                # sequence word before the post and its bye word after the leave, read the sequence
                # again -- stores are seen in order (x86-64 TSO), so a set bye means its post shows
                if w[j * step + 1]:
                    if w[j * step] >= s:
                        continue
                    raise peer_failure(
                        f"rank {j} of this process set left the job (its process is exiting, "
                        "e.g. after an error, or it called hvd.shutdown()) while this rank "
                        "waited for it in a collective", peer=self.ranks[j])
                if self.leaving:
                    raise HorovodInternalError("Horovod has been shut down on this rank")
                return False
        return True

    def gather(self, words: Sequence[int], blob: bytes) -> List[Message]:
        self.seq += 1
        s = self.seq
        w, b = self.words, self.bytes
        base = self.me * self.row + self.HEAD * 8 + (s & 1) * self.bank
        wb = base // 8
        nw = len(words)
        w[wb:wb + nw] = memoryview(_pack(words)).cast("q") if nw else w[wb:wb]
        w[wb + 2] = len(blob)
        if blob:
            b[base + WORDS * 8:base + WORDS * 8 + len(blob)] = blob
        w[self.me * self.row // 8] = s  # the sequence word last
        if not self._posted(s):
            self.watch.wait(lambda: self._posted(s), "the other ranks' negotiation messages")
        out: List[Message] = []
        for j in range(self.n):
            base = j * self.row + self.HEAD * 8 + (s & 1) * self.bank
            row = w[base // 8:base // 8 + WORDS].tolist()
            nb = row[2]
            out.append((row, bytes(b[base + WORDS * 8:base + WORDS * 8 + nb]) if nb else b""))
        return out

    def departed(self) -> Optional[int]:
        """The set index of a peer that announced it left (its ``bye`` word), if any."""
        step = self.row // 8
        return next((j for j in range(self.n) if j != self.me and self.words[j * step + 1]), None)

    def leave(self) -> None:
        """Tell the peers this rank is gone (they raise instead of waiting for it)."""
        self.leaving = True
        self.words[self.me * self.row // 8 + 1] = 1

    def close(self) -> None:
        liveness.unmap(self.mm, self.words, self.bytes)


def _pack(words: Sequence[int]) -> bytes:
    import struct

    return struct.pack(f"{len(words)}q", *words)


def shm_allowed() -> bool:
    """Whether this rank may use shared memory for the control exchange."""
    return (os.environ.get("HOROVOD_COMPAT_SHM_CONTROL", "1") != "0" and os.path.isdir("/dev/shm")
            and platform.machine().lower() in ("x86_64", "amd64"))


def create(st: Any) -> Tuple[Any, Optional[List[int]], Optional[_mesh.Mesh]]:
    """The exchange for set ``st`` (collective over its control group); when its ranks share this
    host, their process ids (the shared-memory data transport watches them too); the set's TCP mesh
    when it negotiates over one and every rank lets allreduce data move over it too (the exchange
    owns the mesh: its ``leave``/``close`` shut it)."""
    info: List[Any] = [None] * st.n
    dist.all_gather_object(info, (socket.gethostname(), shm_allowed(), os.getpid(),
                                  _mesh.allowed(st.n), _mesh.data_allowed()), group=st.ctl)
    same_host = len({i[0] for i in info}) == 1
    pids = [i[2] for i in info] if same_host else None
    if same_host and all(i[1] for i in info):
        try:
            mm = _shm.map_segment(st, ShmExchange.size(st.n))
        except OSError:
            pass  # every rank's mapping failed alike (collective): fall through to the network
        else:
            return ShmExchange(mm, st.n, st.me, pids, st.ranks), pids, None
    if all(i[3] for i in info):
        mesh = _mesh.Mesh.build(st.me, st.n, same_host, st.ctl)
        return TcpExchange(mesh), pids, mesh if all(i[4] for i in info) else None
    return GlooExchange(st.ctl, st.n), pids, None
