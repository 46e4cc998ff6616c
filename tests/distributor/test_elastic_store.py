"""`distributor.elastic.store.RoundStore`: the store a worker joins a round through. Its waits end
when the keys come, or -- once the driver named a lost member of the round -- with
`RoundLostError`, also when torch waits in it from C++ (gloo's rendezvous)."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from distributor.elastic.store import RoundLostError, RoundStore


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    yield store


def _round_store(server, lost):
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    return RoundStore(dist.PrefixStore("elastic/round1", client), 1,
                      lambda: lost[0] if lost else None)


def _later(seconds, fn):
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


def test_a_wait_returns_as_the_key_is_set_and_reads_through_the_prefix(server):
    store = _round_store(server, [])
    _later(0.2, lambda: server.set("elastic/round1/k", b"v"))
    started = time.monotonic()
    assert store.get("k") == b"v"
    assert time.monotonic() - started < 5
    store.set("mine", b"x")
    assert server.get("elastic/round1/mine") == b"x"
    assert store.add("n", 2) == 2 and store.check(["k", "n"]) and not store.check(["absent"])


def test_a_wait_raises_once_the_round_lost_a_member(server):
    lost: list = []
    store = _round_store(server, lost)
    _later(0.3, lambda: lost.append(2))
    started = time.monotonic()
    with pytest.raises(RoundLostError, match="rank 2 of round 1 failed while this worker joined"):
        store.wait(["never"])
    assert time.monotonic() - started < 5


def test_a_wait_without_news_times_out_as_a_store_does(server):
    store = _round_store(server, [])
    with pytest.raises(dist.DistStoreError, match="timed out after 0.3 s"):
        store.wait(["never"], timedelta(seconds=0.3))


def test_gloo_joining_a_round_through_it_ends_when_a_member_is_lost(server):
    """Rank 0 of a two-rank round whose rank 1 never comes: gloo's rendezvous waits from C++ in
    the store, and the driver's notice ends that wait with the same error."""
    lost: list = []
    store = _round_store(server, lost)
    _later(0.5, lambda: lost.append(1))
    started = time.monotonic()
    with pytest.raises(RoundLostError, match="rank 1 of round 1"):
        dist.ProcessGroupGloo(store, 0, 2, timedelta(seconds=60))
    assert time.monotonic() - started < 10
