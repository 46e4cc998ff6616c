"""The TCP mesh (horovod_compat/torch/_mesh.py) on its own: ranks are threads of this process joined
by real loopback sockets, so every case runs in well under a second.

End-to-end use (the coordinator's rounds and allreduce data when shared memory is off) is covered
by the soak, the negotiation tests and the upstream conformance run with shared memory off.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, List

import pytest
import torch

from distributor import protocol
from horovod_compat.common import _mesh, liveness, ops
from horovod_compat.common.exceptions import HorovodInternalError

SECRET = protocol.new_secret()


def _listeners(n: int):
    out = []
    for _ in range(n):
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(max(_mesh._BACKLOG, 2 * n))  # as Mesh.build
        out.append(ls)
    return out, [("127.0.0.1", ls.getsockname()[1]) for ls in out]


def _on_ranks(n: int, body: Callable[[int, _mesh.Mesh], Any], before_connect=None) -> List[Any]:
    """Build an n-rank mesh (one thread per rank) and run ``body(rank, mesh)`` on each."""
    lss, addrs = _listeners(n)
    if before_connect is not None:
        before_connect(addrs)
    results: List[Any] = [None] * n

    def rank(r: int) -> None:
        try:
            mesh = _mesh.Mesh._connect(lss[r], r, addrs, SECRET)
            try:
                results[r] = body(r, mesh)
            finally:
                mesh.close()
        except BaseException as exc:  # reported by the assertions below
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for ls in lss:
        ls.close()
    return results


def _frames(mesh: _mesh.Mesh, payload: bytes) -> List[Any]:
    return mesh.exchange(len(payload).to_bytes(4, "little") + payload, 4,
                         lambda head: int.from_bytes(head, "little"))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_exchange_delivers_every_ranks_frame(n):
    got = _on_ranks(n, lambda r, m: [_frames(m, f"rank{r}-round{i}".encode() * (r + 1))
                                     for i in range(3)])
    for r, rounds in enumerate(got):
        assert not isinstance(rounds, BaseException), rounds
        for i, frames in enumerate(rounds):
            assert frames[r] is None
            for j in range(n):
                if j != r:
                    assert frames[j][4:] == f"rank{j}-round{i}".encode() * (j + 1)


def test_beats_and_posts_travel_on_their_own_connections():
    """Each pair has a beat connection besides its data one: the process's beat thread counts the
    peers' beats, and a post (the stall inspector's op names) reaches every peer; data frames are
    untouched by either."""
    def body(r: int, mesh: _mesh.Mesh):
        mesh.post(b"names of rank %d" % r)
        deadline = time.monotonic() + 10
        peers = [j for j in range(3) if j != r]
        while time.monotonic() < deadline and not all(
                mesh.count(j) >= 2 and mesh.posted(j) is not None for j in peers):
            time.sleep(0.05)
        frames = _frames(mesh, b"data%d" % r)
        return ({j: mesh.count(j) >= 2 for j in peers},
                {j: mesh.posted(j)[1] for j in peers if mesh.posted(j)}, frames)

    for r, got in enumerate(_on_ranks(3, body)):
        assert not isinstance(got, BaseException), got
        beats, posts, frames = got
        assert all(beats.values()) and len(beats) == 2, beats
        assert posts == {j: b"names of rank %d" % j for j in range(3) if j != r}
        assert [f[4:] if f else f for f in frames] == [None if j == r else b"data%d" % j
                                                      for j in range(3)]


def test_a_peer_without_beats_is_named_frozen_while_a_transfer_waits(monkeypatch):
    """Rank 1 stops beating (its mesh is taken off the beat thread, as a stopped process's would
    be) and sends nothing: rank 0's exchange raises ``frozen`` naming it after the bound, not the
    operation timeout.

    The frozen bound is 2 s and the operation timeout 120 s: the exchange must end after at least
    the bound, and well before the operation timeout (under 30 s, which a loaded 2-core machine
    meets with a wide margin), with the frozen error rather than the timeout's."""
    monkeypatch.setenv("HOROVOD_COMPAT_FROZEN_SECONDS", "2")
    monkeypatch.setenv("HOROVOD_COMPAT_OP_TIMEOUT", "120")
    release = threading.Event()

    def body(r: int, mesh: _mesh.Mesh):
        mesh.attach(liveness.Watch([5, 7], r, mesh, None), [5, 7])  # the set's global ranks
        if r == 1:
            liveness.unregister(mesh)
            release.wait(150)  # silent until rank 0 gave up (longer than its operation timeout)
            return None
        t0 = time.monotonic()
        try:
            _frames(mesh, b"x")
        except HorovodInternalError as exc:
            return exc, time.monotonic() - t0
        finally:
            release.set()
        return "no error", 0.0

    (exc, took), _ = _on_ranks(2, body)
    assert isinstance(exc, HorovodInternalError), exc
    assert (exc.knock_on, exc.peer, exc.frozen) == (True, 7, True)
    assert str(exc).startswith("rank 7 stopped making progress (no sign of life for 2 s while "
                               "rank 5 waited for it")
    assert 1.5 <= took < 30.0, took  # the frozen bound (2 s), not the operation timeout (120 s)


CASES = [(torch.float32, ops.Sum), (torch.float64, ops.Average), (torch.float16, ops.Max),
         (torch.bfloat16, ops.Min), (torch.int8, ops.Sum), (torch.uint8, ops.Max),
         (torch.int32, ops.Product), (torch.int64, ops.Min)]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("numel", [0, 1, 2, 7, 100_003])
@pytest.mark.parametrize("dtype, op", CASES)
def test_ring_allreduce_matches_a_local_reduction(n, numel, dtype, op):
    def value(r: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(100 * r + numel)
        if dtype.is_floating_point:
            return (torch.rand(numel, generator=g) * 4 - 2).to(dtype)
        hi = 3 if op == ops.Product else 50
        return torch.randint(0 if dtype == torch.uint8 else -hi, hi, (numel,), generator=g).to(dtype)

    def body(r: int, mesh: _mesh.Mesh):
        src = value(r)
        out = torch.empty_like(src)
        mesh.allreduce([(src, out)], op)
        inplace = value(r)
        mesh.allreduce([(inplace, inplace)], op)
        return src, out, inplace

    got = _on_ranks(n, body)
    parts = [value(r) for r in range(n)]
    want = parts[0].clone()
    for p in parts[1:]:
        ops.COMBINE[op](want, p, out=want)
    for r, res in enumerate(got):
        assert not isinstance(res, BaseException), res
        src, out, inplace = res
        assert torch.equal(src, parts[r])  # the input is only read
        # every rank holds the same bits; floats add in ring order, so compare loosely to ours,
        # but a small tensor is combined in rank order on every rank: exactly ours
        assert torch.equal(out, got[0][1]) and torch.equal(inplace, out)
        gathered = numel * parts[0].element_size() * (n - 1) <= _mesh.GATHER_BYTES
        assert gathered == (numel < 100_003)
        if dtype.is_floating_point and not gathered:
            torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(out, want)


def test_a_peer_that_leaves_breaks_the_mesh_with_a_clear_error():
    def body(r: int, mesh: _mesh.Mesh):
        if r == 1:
            mesh.leave()
            return "left"
        errors = []
        for _ in range(2):
            try:
                _frames(mesh, b"x")
            except HorovodInternalError as exc:
                errors.append(str(exc))
        return errors

    got = _on_ranks(2, body)
    assert got[1] == "left"
    first, second = got[0]
    assert "rank 1 of this process set closed its connection" in first
    assert second == first  # broken: later transfers fail at once with the same message


def test_a_connection_without_the_secret_is_ignored_and_the_mesh_still_forms():
    intruders: List[socket.socket] = []

    def intrude(addrs):
        s = socket.create_connection(addrs[0])
        intruders.append(s)
        s.sendall(b"\0" * 64)  # a wrong answer to rank 0's challenge, then a fake rank index

    got = _on_ranks(2, lambda r, m: _frames(m, b"ok%d" % r), before_connect=intrude)
    assert got[0][1][4:] == b"ok1" and got[1][0][4:] == b"ok0"
    # rank 0 closed the intruder without reading what it sent after the challenge
    intruders[0].settimeout(5)
    data = b""
    while True:
        chunk = intruders[0].recv(1024)
        if not chunk:
            break
        data += chunk
    assert len(data) == 32  # the challenge nonce only
    intruders[0].close()


@pytest.mark.parametrize("n", [2, 3])
def test_silent_strangers_queued_before_the_ranks_do_not_stop_the_mesh_from_forming(n):
    # Strangers connect to every rank's listener before any rank does and then say nothing (or
    # drip a byte): the ranks' own handshakes must not wait behind theirs (they would time out
    # after protocol.HANDSHAKE_TIMEOUT and the job would not start).
    strangers: List[Any] = []  # (rank whose listener, socket, whether it sent a byte)

    def intrude(addrs):
        for r, addr in enumerate(addrs):
            for k in range(8):
                s = socket.create_connection(addr, timeout=10)
                if k == 0:
                    s.sendall(b"\x01")
                strangers.append((r, s, k == 0))

    try:
        got = _on_ranks(n, lambda r, m: _frames(m, b"ok%d" % r), before_connect=intrude)
        for r in range(n):
            assert not isinstance(got[r], BaseException), got[r]
            assert [f[4:] for j, f in enumerate(got[r]) if j != r] == \
                [b"ok%d" % j for j in range(n) if j != r]
        # every stranger was dropped once the mesh formed, and heard nothing but the challenge
        # (the last rank accepts no one: its listener just closes)
        for r, s, sent in strangers:
            s.settimeout(5)
            data = b""
            try:
                while True:
                    chunk = s.recv(1024)
                    if not chunk:
                        break
                    data += chunk
            except ConnectionResetError:
                assert sent or r == n - 1  # reset on close: a byte nobody read, or never accepted
                continue
            assert len(data) == (0 if r == n - 1 else 32)  # the challenge nonce at most
    finally:
        for _r, s, _sent in strangers:
            s.close()


def test_a_bad_network_interface_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-nic0")
    with pytest.raises(ValueError, match="GLOO_SOCKET_IFNAME names interface 'no-such-nic0'"):
        _mesh._routable_address()


def test_an_unreachable_peer_is_a_clear_error():
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there
    try:
        with pytest.raises(ConnectionError, match=r"cannot reach rank 0 at 127\.0\.0\.1:\d+ .*"
                                                  r"GLOO_SOCKET_IFNAME"):
            _mesh.Mesh._connect(ls, 1, [("127.0.0.1", port), ("127.0.0.1", 0)], SECRET)
    finally:
        ls.close()
