"""netif.probe on this machine (also run as ssh runs it: its source on a Python's stdin) and
netplan.plan on reports of hosts that route over the same, or differently named, interfaces."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from distributor import netif
from distributor.errors import LaunchValidationError
from distributor.netplan import DRIVER, plan, targets_for


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free again once closed: a connection is refused


def test_probe_says_which_interface_a_route_takes_and_that_a_refusal_is_an_answer():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        report = netif.probe(["127.0.0.1"], listener.getsockname()[1], timeout=2)
    assert report["host"] == socket.gethostname()
    assert report["routes"]["127.0.0.1"] == {"interface": "lo", "address": "127.0.0.1", "error": None}
    assert report["networks"]["lo"] == "127.0.0.0/8" and "lo" in report["interfaces"]
    refused = netif.probe(["127.0.0.1"], _closed_port(), timeout=2)
    assert refused["routes"]["127.0.0.1"]["error"] is None  # the host answered (RST): reachable


def test_probe_runs_from_its_source_on_stdin_as_the_driver_sends_it_over_ssh():
    with open(netif.__file__, encoding="utf-8") as f:
        source = f.read()
    done = subprocess.run([sys.executable, "-", str(_closed_port()), "127.0.0.1"], input=source,
                          capture_output=True, text=True, timeout=30, cwd="/")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["routes"]["127.0.0.1"]["interface"] == "lo"


def _report(networks, routes):
    return {"host": "h", "interfaces": sorted(networks) + ["lo"], "networks": networks,
            "routes": {t: {"interface": i, "address": a, "error": e} for t, (i, a, e) in routes.items()}}


ADDRESSES = {"a": "10.1.0.1", "b": "10.1.0.2"}


def test_hosts_on_the_same_interface_name_share_it_and_mpirun_gets_the_names():
    reports = {
        "a": _report({"eth0": "10.1.0.0/24"}, {"10.1.0.2": ("eth0", "10.1.0.1", None),
                                                "10.1.0.9": ("eth0", "10.1.0.1", None)}),
        "b": _report({"eth0": "10.1.0.0/24"}, {"10.1.0.1": ("eth0", "10.1.0.2", None),
                                                "10.1.0.9": ("eth0", "10.1.0.2", None)}),
        DRIVER: _report({"eth0": "10.1.0.0/24"}, {"10.1.0.1": ("eth0", "10.1.0.9", None),
                                                   "10.1.0.2": ("eth0", "10.1.0.9", None)}),
    }
    chosen = plan(ADDRESSES, reports, ["a", "b"])
    assert chosen.common == "eth0" and chosen.mpi_include == ("eth0",)
    assert dict(chosen.interfaces) == {"a": ("eth0",), "b": ("eth0",), DRIVER: ("eth0",)}


def test_different_names_give_mpirun_the_networks_and_the_ranks_their_own_routes():
    reports = {
        "a": _report({"ens5": "10.1.0.0/24", "docker0": "172.17.0.0/16"},
                     {"10.1.0.2": ("ens5", "10.1.0.1", None), "10.1.0.9": ("ens5", "10.1.0.1", None)}),
        "b": _report({"eth0": "10.1.0.0/24"}, {"10.1.0.1": ("eth0", "10.1.0.2", None),
                                                "10.1.0.9": ("eth0", "10.1.0.2", None)}),
        DRIVER: _report({"br0": "10.1.0.0/24"}, {"10.1.0.1": ("br0", "10.1.0.9", None),
                                                  "10.1.0.2": ("br0", "10.1.0.9", None)}),
    }
    chosen = plan(ADDRESSES, reports, ["a", "b"])
    assert chosen.common is None and chosen.mpi_include == ("10.1.0.0/24",)
    assert "ranks use the interface of their route, mpirun 10.1.0.0/24" in chosen.describe()


def test_the_driver_among_the_rank_hosts_must_share_the_name_too():
    reports = {
        "b": _report({"eth0": "10.1.0.0/24"}, {"10.1.0.9": ("eth0", "10.1.0.2", None)}),
        DRIVER: _report({"br0": "10.1.0.0/24"}, {"10.1.0.2": ("br0", "10.1.0.9", None)}),
    }
    assert plan({"b": "10.1.0.2"}, reports, [DRIVER, "b"]).common is None
    assert plan({"b": "10.1.0.2"}, reports, ["b"]).common == "eth0"


def test_a_pair_of_hosts_that_do_not_reach_each_other_is_named_with_the_interface():
    reports = {
        "a": _report({"eth0": "10.1.0.0/24"}, {"10.1.0.2": (None, None, "no route (No route to host)")}),
        "b": _report({"eth0": "10.1.0.0/24"}, {"10.1.0.1": ("eth0", "10.1.0.2", "no answer within 3s"),
                                                "10.1.0.9": ("eth0", "10.1.0.2", None)}),
    }
    with pytest.raises(LaunchValidationError) as info:
        plan({"a": "10.1.0.1", "b": "10.1.0.2"}, reports, ["a", "b"])
    text = str(info.value)
    assert "a -> b (10.1.0.2): no route (No route to host)" in text
    assert "b -> a (10.1.0.1) over eth0 (10.1.0.2): no answer within 3s" in text
    assert "--network-interface" in text


def test_each_host_probes_the_others_and_the_driver_toward_it():
    toward = {"a": "10.1.0.9", "b": "10.1.0.9"}
    assert targets_for("a", ADDRESSES, toward) == ["10.1.0.2", "10.1.0.9"]
    assert targets_for(DRIVER, ADDRESSES, {}) == ["10.1.0.1", "10.1.0.2"]
