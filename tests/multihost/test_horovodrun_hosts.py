"""Unchanged Horovod code across two simulated hosts (scripts/cluster.sh): horovodrun with -H
(its default launcher, --gloo and --mpi) and -hostfile, and horovod.run with hosts. Each host's
name resolves to 127.0.1.1 there, as Debian writes /etc/hosts, and nobody names an interface:
the job must find the one that reaches the other host. Every rank's results are checked against
the same program on this one host."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import horovod
from distributor import netif
from tiers import CI

TRAIN = textwrap.dedent("""\
    import json, os, socket
    import torch
    import horovod.torch as hvd
    from horovod_compat.common.collectives import transport_name

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(100 + hvd.rank())
    x = torch.randn(64, 8, generator=generator)
    y = x.sum(1, keepdim=True)
    for _ in range(20):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    gathered = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())))
    big = hvd.allreduce(torch.full((1 << 20,), float(hvd.rank())), op=hvd.Sum)
    print("RESULT " + json.dumps({
        "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
        "host": socket.gethostname(), "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "weights": model.weight.view(-1).tolist() + [model.bias.item()],
        "gathered": gathered.sum(0).tolist(), "gathered_rows": gathered.shape[0],
        "big": [big.min().item(), big.max().item()],
        "object": hvd.broadcast_object({"from": socket.gethostname()}, root_rank=0),
        "transport": transport_name(torch.ones(4), hvd.Sum, None),
    }), flush=True)
    """)


def _horovodrun(tmp_path, *args: str, timeout: float = 240,
                program: str = TRAIN) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(program)
    return subprocess.run([sys.executable, "-m", "horovod_compat.run", *args, sys.executable,
                           str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


def _results(done: subprocess.CompletedProcess) -> list:
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = sorted((json.loads(m) for m in re.findall(r"RESULT (\{.*\})", done.stdout)),
                   key=lambda r: r["rank"])
    assert [r["rank"] for r in found] == [0, 1, 2, 3], done.stdout[-4000:]
    return found


@pytest.fixture(scope="module")
def one_host_reference(tmp_path_factory):
    """The same program, 4 ranks on this machine: what the hosts must compute."""
    return _results(_horovodrun(tmp_path_factory.mktemp("reference"), "-np", "4", "-H", "localhost:4"))


def _check_across_hosts(found: list, reference: list, cluster, transport: str = "HOSTS") -> None:
    names = [name for name, _ in cluster.hosts]
    for r in found:
        assert r["transport"] == transport, "not the host-aware allreduce"
        rank = r["rank"]
        assert r["size"] == 4 and r["local_size"] == 2
        assert (r["host"], r["local_rank"], r["cross_rank"]) == (names[rank // 2], rank % 2, rank // 2)
        assert r["ifname"] == "eth0", "the rank did not pin gloo to the interface toward the others"
        assert r["gathered_rows"] == 10 and r["gathered"] == [20.0, 20.0]  # sum of k*(k+1)
        assert r["big"] == [6.0, 6.0]
        assert r["object"] == {"from": names[0]}
        assert r["weights"] == pytest.approx(reference[rank]["weights"], abs=1e-5)
    assert all(r["weights"] == found[0]["weights"] for r in found), "ranks disagree"


@pytest.fixture(scope="module")
def mpi_on_two_hosts(cluster, tmp_path_factory):
    """One ``horovodrun -np 4 -H hc1:2,hc2:2 --mpi`` of TRAIN and then SEMANTICS (below): two
    tests check it, each its own part (one launch across the hosts, not two alike)."""
    return _horovodrun(tmp_path_factory.mktemp("mpi-on-two-hosts"), "-np", "4", "-H",
                       cluster.spec(2), "--mpi", timeout=300, program=TRAIN + SEMANTICS)


# (without --gloo/--mpi, -H runs mpirun where it is installed: the hostfile, flat-ring and
# network-interface tests below run that default)
@pytest.mark.parametrize("mode", [["--gloo"], ["--mpi"]], ids=["gloo", "mpi"])
def test_horovodrun_on_two_hosts(cluster, tmp_path, one_host_reference, mode, request):
    if mode == ["--mpi"]:
        done = request.getfixturevalue("mpi_on_two_hosts")
    else:
        done = _horovodrun(tmp_path, "-np", "4", "-H", cluster.spec(2), *mode)
    _check_across_hosts(_results(done), one_host_reference, cluster)


def test_horovodrun_with_a_hostfile_and_a_network_interface_every_host_has(cluster, tmp_path,
                                                                          one_host_reference):
    """Two options in one launch: the ranks sit where the
    hostfile's slots say, and gloo is pinned to the named interface, eth0, which every host has
    (a name one host lacks stops the job before any rank starts: a test below)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{address} slots=2\n" for address in cluster.addresses))
    done = _horovodrun(tmp_path, "-np", "4", "-hostfile", str(hostfile), "--network-interface", "eth0")
    _check_across_hosts(_results(done), one_host_reference, cluster)


@pytest.mark.skipif(CI, reason=(
    "the long round's: CI runs the TCP ring on one host (torch/test_mesh.py's ring allreduce) and "
    "every other horovodrun option across the hosts"))
def test_flat_ring_when_hierarchical_allreduce_is_off(cluster, tmp_path, one_host_reference):
    done = _horovodrun(tmp_path, "-np", "4", "-H", cluster.spec(2),
                       "--no-hierarchical-allreduce")
    _check_across_hosts(_results(done), one_host_reference, cluster, transport="TCP")


def test_network_interface_a_host_lacks_fails_before_any_rank_starts(cluster, tmp_path):
    done = _horovodrun(tmp_path, "-np", "4", "-H", cluster.spec(2), "--network-interface", "eth9")
    assert done.returncode != 0
    for address in cluster.addresses:
        assert f"{address}: no eth9 (it has eth0, lo)" in done.stderr, done.stderr
    assert "[rank" not in done.stdout + done.stderr, "a rank started"


@pytest.mark.parametrize("mode", [
    pytest.param(["--gloo"], id="gloo", marks=pytest.mark.skipif(CI, reason=(
        "the long round's: CI runs --mpi, whose ranks pick their interfaces the same way and whose "
        "mpirun also gets the network; --gloo across the hosts runs in test_horovodrun_on_two_hosts"))),
    pytest.param(["--mpi"], id="mpi")])
def test_this_machine_and_a_host_whose_interfaces_have_other_names(
        cluster, tmp_path, one_host_reference, mode):
    """This machine reaches the hosts over the cluster's bridge, they over their eth0: no name is
    common, so each rank takes its route's interface and mpirun gets the network (CIDR)."""
    host_name, address = cluster.hosts[0]
    done = _horovodrun(tmp_path, "-np", "4", "-H", f"localhost:2,{address}:2", "--verbose", *mode)
    found = _results(done)
    here = netif.interface_of(netif.address_toward(address))
    assert here and here != "eth0"
    assert (f"network: this machine {here}, {address} eth0; ranks use the interface of their "
            "route, mpirun 10.78.0.0/24") in done.stderr, done.stderr
    for r in found:
        remote = r["rank"] >= 2
        assert r["host"] == (host_name if remote else socket.gethostname())
        assert r["ifname"] == ("eth0" if remote else here)
        assert (r["local_rank"], r["cross_rank"]) == (r["rank"] % 2, r["rank"] // 2)
        assert r["weights"] == pytest.approx(one_host_reference[r["rank"]]["weights"], abs=1e-5)
        assert r["big"] == [6.0, 6.0] and r["transport"] == "HOSTS"


def test_a_host_that_cannot_reach_another_fails_before_any_rank_starts(cluster, tmp_path):
    (first, a), (_, b) = cluster.hosts[:2]
    route = ["ip", "netns", "exec", first, "ip", "route"]
    subprocess.run([*route, "add", "unreachable", f"{b}/32"], check=True)
    try:
        done = _horovodrun(tmp_path, "-np", "2", "-H", cluster.spec(1), timeout=120)
    finally:
        subprocess.run([*route, "del", "unreachable", f"{b}/32"], check=True)
    assert done.returncode != 0
    assert "Not every host of the job reaches the others" in done.stderr, done.stderr
    assert f"{a} -> {b}: no route (No route to host)" in done.stderr
    assert f"{b} -> {a} over eth0 ({b}): no answer within" in done.stderr  # replies go nowhere
    assert "[rank" not in done.stdout + done.stderr, "a rank started"


def _where():
    import os
    import socket

    import horovod.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch_tensor(hvd.rank()), op=hvd.Sum)
    return hvd.rank(), hvd.local_rank(), socket.gethostname(), os.getpid(), total


def torch_tensor(value):
    import torch

    return torch.tensor([float(value)])


def test_horovod_run_with_hosts(cluster):
    results = horovod.run(_where, num_proc=4, hosts=cluster.spec(2))
    names = [name for name, _ in cluster.hosts]
    assert [(rank, local, host) for rank, local, host, _, _ in results] == [
        (0, 0, names[0]), (1, 1, names[0]), (2, 0, names[1]), (3, 1, names[1])]
    assert all(total.item() == 6.0 for *_, total in results)


def test_the_hosts_are_apart(cluster):
    """What the tier relies on: each host has its own name (resolving to loopback, as Debian
    writes it), its own /dev/shm, and reaches the other by address."""
    (first, a), (second, b) = cluster.hosts
    assert cluster.ssh(a, f"getent hosts {first}").split()[0] == "127.0.1.1"
    cluster.ssh(a, "touch /dev/shm/horovod-compat-apart")
    try:
        assert cluster.ssh(b, "ls /dev/shm").split() == []
        assert "horovod-compat-apart" in cluster.ssh(a, "ls /dev/shm").split()
    finally:
        cluster.ssh(a, "rm -f /dev/shm/horovod-compat-apart")
    reach = f"import socket; socket.create_connection(('{a}', 22), 5).close(); print('reached')"
    assert cluster.ssh(b, f'{sys.executable} -c "{reach}"').strip() == "reached"


SEMANTICS = textwrap.dedent("""\
    import json
    import torch
    import horovod.torch as hvd
    from horovod_compat.common.collectives import transport_name

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    checked = 0
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        for numel in (1, 17, 1000, (3 << 20) // 4 + 5):  # below, around and above a 1 MiB slot
            x = (torch.arange(numel) % 7 + r + 1).to(dtype)
            every = [(torch.arange(numel) % 7 + k + 1).to(dtype) for k in range(n)]
            want = {hvd.Sum: sum(every[1:], every[0]), hvd.Min: every[0], hvd.Max: every[-1]}
            if numel <= 1000:
                prod = every[0].clone()
                for e in every[1:]:
                    prod = prod * e
                want[hvd.Product] = prod
            for op, expected in want.items():
                assert transport_name(x, op, None) == "HOSTS", transport_name(x, op, None)
                got = hvd.allreduce(x, op=op, name=f"{dtype}-{numel}-{op}")
                assert torch.equal(got, expected), (dtype, numel, op)
                checked += 1
    avg = hvd.allreduce(torch.full((5,), float(r)), op=hvd.Average)
    assert torch.allclose(avg, torch.full((5,), (n - 1) / 2))
    grouped = hvd.grouped_allreduce([torch.full((3,), float(r)), torch.full((2 << 20,), 1.0)],
                                    op=hvd.Sum)
    assert grouped[0].tolist() == [float(sum(range(n)))] * 3 and grouped[1][0].item() == n
    # uneven data: rank r takes r + 2 steps, then joins; the others' allreduces go on
    for step in range(r + 2):
        total = hvd.allreduce(torch.ones(4096), op=hvd.Sum, name="uneven")
        assert total[0].item() == sum(1 for k in range(n) if step < k + 2), (step, total[0])
    last = hvd.join()
    assert last == n - 1, last
    print("SEMANTICS " + json.dumps({"rank": r, "checked": checked}), flush=True)
    """)


def test_host_aware_allreduce_keeps_every_guarantee(cluster, mpi_on_two_hosts):
    """Every reduce op and dtype (sizes below, around and above a shared-memory slot), Average,
    a grouped allreduce and hvd.join with uneven steps, all on the host-aware path, each result
    checked exactly against what every rank computes locally (in the same job as the --mpi case
    of test_horovodrun_on_two_hosts, after its TRAIN)."""
    done = mpi_on_two_hosts
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    found = sorted(json.loads(m)["rank"] for m in re.findall(r"SEMANTICS (\{.*\})", done.stdout))
    assert found == [0, 1, 2, 3], done.stdout[-3000:]


FAILING = textwrap.dedent("""\
    import os, time
    import torch
    import horovod.torch as hvd

    hvd.init()
    x = torch.ones(1 << 20)
    for step in range(1000):
        if hvd.rank() == 3 and step == 5:
            os._exit(9)  # a rank of the second host dies between two allreduces
        hvd.allreduce(x, op=hvd.Sum, name="step")
    """)


def test_a_rank_dying_on_the_host_aware_path_ends_the_job_naming_it(cluster, tmp_path):
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "horovod_compat.run", "-np", "4", "-H",
                           cluster.spec(2), "--gloo", sys.executable, str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "Rank 3 failed (exit status 9)" in done.stderr, done.stderr[-3000:]
    assert time.monotonic() - started < 120, "the other ranks did not stop within seconds"
