"""distributor.worker: what a rank of an elastic job hears from the driver."""
from __future__ import annotations

from distributor import worker
from distributor.protocol import Kind
from distributor.worker import HostUpdate


def test_a_host_notice_before_any_listener_reaches_the_first_one_added(monkeypatch):
    # the round formed inside hvd.init(); a replacement asked to join before the program's
    # hvd.elastic.run registered its state: the state must still hear of it (else the newcomer
    # waits for the whole job while the round trains without it)
    monkeypatch.setattr(worker, "_listeners", [])
    monkeypatch.setattr(worker, "_notices", [])
    monkeypatch.setattr(worker, "_round_formed_at", 100.0)
    worker.deliver(Kind.HOSTS_UPDATED, (99.0, int(HostUpdate.REMOVED)))  # about an earlier round
    worker.deliver(Kind.HOSTS_UPDATED, (101.0, int(HostUpdate.ADDED)))
    heard = []
    worker.add_hosts_listener(lambda stamp, update: heard.append((stamp, update)))
    assert heard == [(101.0, HostUpdate.ADDED)]
    worker.deliver(Kind.HOSTS_UPDATED, (102.0, int(HostUpdate.REMOVED)))  # live, once
    assert heard == [(101.0, HostUpdate.ADDED), (102.0, HostUpdate.REMOVED)]
    monkeypatch.setattr(worker, "_round_formed_at", 200.0)  # the next round: those are old news
    later = []
    worker.add_hosts_listener(lambda stamp, update: later.append((stamp, update)))
    assert later == []
