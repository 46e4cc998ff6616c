"""The driver's listeners against strangers: the hub (distributor/hub.py, protocol.Gatekeeper)
and an elastic job's c10d store. Real loopback sockets, no rank processes; the whole-job view is
the fuzz tier (tests/fuzz)."""
from __future__ import annotations

import logging
import pickle
import socket
import threading
import time
from typing import List

import pytest

from distributor import protocol
from distributor.hub import DriverHub

SECRET = protocol.new_secret()


@pytest.fixture
def hub():
    frames: List[tuple] = []
    h = DriverHub(SECRET, lambda ch, kind, body: frames.append((kind, body)), lambda ch: None)
    h.frames = frames
    yield h
    h.close()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server ends the connection within `within` seconds (reading what it sends)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_genuine_peer_is_admitted_while_strangers_hold_connections_open(hub):
    strangers = [socket.create_connection(hub.address) for _ in range(20)]
    try:
        for s in strangers[:5]:
            s.sendall(b"\x01")  # a byte of an answer, then nothing
        channel = protocol.connect(hub.address, SECRET)
        channel.send(protocol.Kind.MESSAGE, (0, "hello"))
        deadline = time.monotonic() + 10
        while not hub.frames and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hub.frames == [(protocol.Kind.MESSAGE, (0, "hello"))]
        channel.close()
    finally:
        for s in strangers:
            s.close()


def test_the_handshake_deadline_covers_the_whole_handshake_not_each_read(monkeypatch):
    # a byte every 0.5 s: each read is quick, the whole answer would take 64 * 0.5 = 32 s; the
    # handshake has 2 s in all (a per-read deadline of 2 s would never fire), so the hub must close
    # the connection after about 2 s -- well under 20 s even on a loaded machine, and well under
    # the 32 s a per-read deadline would let the drip run
    monkeypatch.setattr(protocol, "HANDSHAKE_TIMEOUT", 2.0)
    h = DriverHub(SECRET, lambda *a: None, lambda ch: None)
    try:
        drip = socket.create_connection(h.address)
        stop = threading.Event()

        def dribble():
            while not stop.wait(0.5):
                try:
                    drip.send(b"\x00")
                except OSError:
                    return

        threading.Thread(target=dribble, daemon=True).start()
        started = time.monotonic()
        closed = _closed_by_server(drip, within=20.0)
        stop.set()
        drip.close()
        assert closed, "the hub kept a connection that dripped a byte at a time past its deadline"
        assert time.monotonic() - started < 20.0
        assert h.rejected_peers == 1
    finally:
        h.close()


def test_rejections_are_logged_once_then_counted(hub, caplog):
    caplog.set_level(logging.WARNING, logger="distributor.hub")
    for _ in range(30):
        with socket.create_connection(hub.address) as s:
            s.recv(32)
            s.sendall(b"\x00" * protocol.REPLY_BYTES)  # a wrong answer
            assert _closed_by_server(s, within=10.0)
    deadline = time.monotonic() + 10
    while hub.rejected_peers < 30 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.rejected_peers == 30
    lines = [r.getMessage() for r in caplog.records if r.name == "distributor.hub"]
    assert len(lines) == 1, lines
    assert "driver hub rejected a connection from 127.0.0.1:" in lines[0]
    assert "failed the job-secret challenge" in lines[0]
    hub.close()  # the rest are summed up when the hub closes
    lines = [r.getMessage() for r in caplog.records if r.name == "distributor.hub"]
    assert len(lines) == 2, lines
    assert "rejected 29 more connections that did not prove the job secret (30 in all;" in lines[1]


def test_a_summary_line_at_most_once_per_interval():
    records: List[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("test_hub.rejections")
    logger.addHandler(Collect())
    logger.propagate = False
    rejections = protocol.Rejections(logger, "a server", interval=0.3)
    for _ in range(100):
        rejections.add(("10.0.0.1", 5), "no")
    assert len(records) == 1
    time.sleep(0.35)
    rejections.add(("10.0.0.2", 6), "garbage")
    assert len(records) == 2 and "rejected 100 more connections" in records[1]
    assert "the last from 10.0.0.2:6: garbage" in records[1]
    rejections.flush()
    assert len(records) == 2  # nothing left to say


def test_the_oldest_waiting_stranger_makes_way_when_too_many_wait(monkeypatch):
    monkeypatch.setattr(protocol, "PENDING_LIMIT", 8)
    h = DriverHub(SECRET, lambda *a: None, lambda ch: None)
    try:
        strangers = []
        for _ in range(20):
            s = socket.create_connection(h.address)
            s.recv(32)  # accepted: the challenge came
            strangers.append(s)
        assert all(_closed_by_server(s, within=10.0) for s in strangers[:12])
        assert not any(_closed_by_server(s, within=0.2) for s in strangers[12:])
        channel = protocol.connect(h.address, SECRET)  # and a genuine peer still gets in
        channel.close()
        for s in strangers:
            s.close()
        assert h.rejected_peers >= 12
    finally:
        h.close()


def test_nothing_a_stranger_sends_after_a_forged_answer_is_unpickled(hub, tmp_path):
    marker = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    body = pickle.dumps(Boom())
    frame = bytes([protocol.Kind.HELLO]) + len(body).to_bytes(8, "big") + body
    with socket.create_connection(hub.address) as s:
        s.recv(32)
        s.sendall(b"\x07" * protocol.REPLY_BYTES + frame)
        assert _closed_by_server(s, within=10.0)
    with socket.create_connection(hub.address) as s:  # a frame with no handshake at all
        s.sendall(frame)
        assert _closed_by_server(s, within=10.0)
    time.sleep(0.2)
    assert not marker.exists()
    assert hub.frames == []


def _bound(port: int) -> List[str]:
    """The local addresses of the listening sockets on `port` (from /proc/net/tcp*)."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as table:
            for row in table.read().splitlines()[1:]:
                parts = row.split()
                addr, p = parts[1].rsplit(":", 1)
                if parts[3] == "0A" and int(p, 16) == port:
                    found.append(addr)
    return found


def test_an_elastic_jobs_store_for_local_workers_listens_on_loopback_only():
    from distributor.elastic.rendezvous import start_store

    store = start_store("127.0.0.1")
    try:
        assert _bound(store.port) == ["0100007F"]  # 127.0.0.1, not every interface
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        del store
