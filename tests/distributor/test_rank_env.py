"""`distributor.rank_env.free_port`: the port a later process binds (the job's store) is one that
outgoing connections never get as their local port."""
from __future__ import annotations

import os
import socket

import pytest

from distributor import rank_env


@pytest.mark.skipif(not os.path.exists(rank_env._EPHEMERAL_RANGE_FILE),
                    reason="Linux tells its ephemeral port range in /proc; elsewhere the port is the kernel's choice")
def test_the_port_is_below_the_ephemeral_range_and_free():
    low = rank_env._ephemeral_low()
    ports = {rank_env.free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), (sorted(ports), low)
    assert len(ports) > 1  # random, so that two jobs starting together rarely pick the same
    for port in ports:
        with socket.socket() as again:
            again.bind(("127.0.0.1", port))


def test_a_port_in_use_is_skipped(monkeypatch):
    with socket.socket() as busy, socket.socket() as other:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        other.bind(("127.0.0.1", 0))
        taken, free = busy.getsockname()[1], other.getsockname()[1]
        other.close()
        picks = iter([taken - 1024, free - 1024])  # the busy port first
        monkeypatch.setattr(rank_env, "_ephemeral_low", lambda: max(taken, free) + 1)
        monkeypatch.setattr(rank_env.secrets, "randbelow", lambda _n: next(picks))
        assert rank_env.free_port() == free


def test_without_a_known_range_the_kernel_chooses(monkeypatch, tmp_path):
    monkeypatch.setattr(rank_env, "_EPHEMERAL_RANGE_FILE", str(tmp_path / "missing"))
    port = rank_env.free_port()
    assert 0 < port < 65536
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))
