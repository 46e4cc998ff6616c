"""A Ray cluster over the simulated hosts of scripts/cluster.sh, as on a real one: the head in this
process (``ray.init``, no CPUs: the driver's), and a Ray node on each host, joined with
``ray start --block`` over ssh.

    with ray_on_hosts([("hc1", "10.78.0.1"), ...], cpus=2, logs=Path(...), stop_host=...):
        ...  # RayExecutor(num_hosts=2, ...) places its actors on the hosts

Used by tests/multihost/test_ray_hosts.py and benchmarks/ray_allreduce.py. ``stop_host(name)``
ends every process on a host (its Ray node) when the cluster is taken down; the ssh clients are
stopped after it, the head last, and Ray's note of this head's address is removed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence, Tuple

DRIVER = "10.78.0.254"  # this machine on the hosts' bridge (scripts/cluster.sh)


def alive_nodes() -> list:
    import ray

    return [node for node in ray.nodes() if node.get("Alive")]


@contextlib.contextmanager
def ray_on_hosts(hosts: Sequence[Tuple[str, str]], cpus: int, logs: Path,
                 stop_host: Callable[[str], None]) -> Iterator[None]:
    import ray

    ray.init(address="local", _node_ip_address=DRIVER, num_cpus=0, include_dashboard=False,
             configure_logging=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    nodes, temps = [], []
    try:
        address = ray.get_runtime_context().gcs_address
        ray_cli = str(Path(sys.executable).with_name("ray"))
        # the head (ray.init) turned Ray's token authentication on; a joining node must use it too
        token = os.path.expanduser("~/.ray/auth_token")
        auth = f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token} " if os.path.exists(token) else ""
        for name, host in hosts:
            # a temporary directory per node: the hosts share this machine's file system, and a
            # node's sockets there would clash with the others' (Ray allows one per node)
            temp = tempfile.mkdtemp(prefix=f"ray-{name}-")  # short: Ray's socket paths are long
            temps.append(temp)
            command = (f"exec env {auth}{ray_cli} start --block --address={address} "
                       f"--node-ip-address={host} --num-cpus={cpus} --disable-usage-stats "
                       f"--temp-dir={temp}")
            nodes.append(subprocess.Popen(["ssh", "-o", "BatchMode=yes", host, command],
                                          stdout=open(logs / f"{name}.log", "wb"),
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 120
        while len(alive_nodes()) < 1 + len(hosts):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the hosts' Ray nodes did not join: {[n['NodeManagerAddress'] for n in alive_nodes()]}; "
                    + " | ".join((logs / f"{name}.log").read_text()[-1500:] for name, _ in hosts))
            time.sleep(0.5)
        yield
    finally:
        for name, _ in hosts:  # the Ray node's processes, by PID
            stop_host(name)
        for proc in nodes:
            proc.terminate()
            proc.wait(timeout=30)
        ray.shutdown()
        current = Path("/tmp/ray/ray_current_cluster")  # Ray leaves this head's address there
        if current.exists() and current.read_text().startswith(DRIVER + ":"):
            current.unlink()
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
