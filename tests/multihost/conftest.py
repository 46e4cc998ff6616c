"""The multi-host tier: simulated hosts made by scripts/cluster.sh (network namespaces on a
bridge, each with its own address, host name, /dev/shm and a real sshd), brought up once for the
session and taken down at its end, also when a test failed.

Traffic goes only to the addresses of the hosts this fixture made and found up. Where network
namespaces cannot be made (not root, no `ip`, a sandbox that forbids them) every test here skips
and says why; a cluster script that fails on a machine that permits them is a failure.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

import procs

ROOT = Path(__file__).parents[2]
CLUSTER = ROOT / "scripts" / "cluster.sh"
STATE = Path(os.environ.get("HOROVOD_COMPAT_CLUSTER_DIR", "/run/horovod-compat-cluster"))
#: Held (flock) by the test run whose session fixture owns the simulated hosts. The namespaces,
#: their bridge and STATE belong to the whole machine: a second run on it (another clone's suite,
#: an engineer's tier run) would take the first one's hosts down under its running tests.
LOCK = STATE.with_name(STATE.name + ".lock")
HOSTS = 2


@dataclass
class Cluster:
    hosts: Tuple[Tuple[str, str], ...]  # (host name, address)
    #: True while a module's services live on the hosts (Spark workers and their executors, Ray
    #: nodes: they stay between tests; that module checks the hosts when it stops them)
    services_running: bool = False

    @property
    def addresses(self) -> List[str]:
        return [address for _, address in self.hosts]

    def spec(self, slots: int) -> str:
        """A horovodrun -H value: every host with `slots` slots."""
        return ",".join(f"{address}:{slots}" for address in self.addresses)

    def ssh(self, address: str, command: str) -> str:
        assert address in self.addresses, f"{address} is not a host of this cluster"
        return subprocess.run(["ssh", "-o", "BatchMode=yes", address, command], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def processes(self, name: str) -> List[int]:
        """PIDs in host `name`'s namespaces, its sshd listener left out."""
        listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        sshd = int((STATE / f"{name}.sshd.pid").read_text())
        return [int(pid) for pid in listed.split() if int(pid) != sshd]


    def commands(self, name: str) -> Dict[int, str]:
        """{pid: command line} of the processes on host `name`, its sshd listener left out."""
        return procs.commands(self.processes(name))

    def stop_spark_workers(self, timeout: float = 60) -> Dict[str, Dict[int, str]]:
        """SIGTERM each host's Spark worker JVM (it stops its executors and their Python
        workers), wait for the hosts to empty, and return what is still there by host."""
        for name, _ in self.hosts:
            for pid, command in self.commands(name).items():
                if "org.apache.spark.deploy.worker.Worker" in command:
                    os.kill(pid, 15)
        deadline = time.monotonic() + timeout
        while True:
            left = {name: self.commands(name) for name, _ in self.hosts}
            if not any(left.values()) or time.monotonic() > deadline:
                return {name: found for name, found in left.items() if found}
            time.sleep(0.2)

    def kill_all(self, name: str) -> None:
        """SIGKILL every process on host `name` but its sshd listener, and wait for them to go."""
        for pid in self.processes(name):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self.processes(name) and time.monotonic() < deadline:
            time.sleep(0.1)


def _why_not_permitted() -> Optional[str]:
    if os.geteuid() != 0:
        return "the simulated hosts need root (network namespaces, a bridge, sshd); CI runs as root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on this machine: apt-get install iproute2"
    probe = subprocess.run(["ip", "netns", "add", "hcprobe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this machine does not permit network namespaces: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "hcprobe"], check=True)
    return None


def _own_the_hosts():
    """The machine's simulated hosts for this run: LOCK, held until the run's end (released when
    the process ends, however it ends). Another run that holds it is waited for."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    held = open(LOCK, "a")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"\nmultihost: another test run on this machine holds its simulated hosts ({LOCK}); "
              "waiting for it to end", file=sys.stderr, flush=True)
        fcntl.flock(held, fcntl.LOCK_EX)
    return held


@pytest.fixture(scope="session")
def cluster():
    reason = _why_not_permitted()
    if reason:
        pytest.skip(reason)
    with _own_the_hosts():
        yield from _cluster()


def _cluster():
    subprocess.run(["bash", str(CLUSTER), "down"], check=True, timeout=120)  # an earlier run's
    up = subprocess.run(["bash", str(CLUSTER), "up", str(HOSTS)], capture_output=True, text=True,
                        timeout=600)
    try:
        assert up.returncode == 0, f"scripts/cluster.sh up {HOSTS} failed:\n{up.stderr}"
        hosts = tuple(tuple(line.split()) for line in up.stdout.split("\n") if line.strip())
        assert [name for name, _ in hosts] == [f"hc{i + 1}" for i in range(HOSTS)], up.stdout
        made = Cluster(hosts)
        for name, address in hosts:  # up, and the host it claims to be
            assert made.ssh(address, "hostname").strip() == name
        yield made
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], check=True, timeout=120)


@pytest.fixture(autouse=True)
def nothing_left_on_the_hosts(request):
    """No test may leave a process on a simulated host (ranks, prted, ...)."""
    yield
    if "cluster" not in request.fixturenames:
        return
    made = request.getfixturevalue("cluster")
    if made.services_running:
        return  # checked when the module stops its services
    deadline = time.monotonic() + 10
    while True:
        left = {name: made.processes(name) for name, _ in made.hosts}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not any(left.values()), f"processes left on the simulated hosts: {left}"
