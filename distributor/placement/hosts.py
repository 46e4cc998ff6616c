"""Hosts placement: ranks on a list of machines, started by one mpirun that reaches the other
hosts over ssh (as Horovod's and Open MPI's own launchers do).

Ranks fill the hosts in order (host 0 gets the first ranks), so LOCAL_RANK counts per host and
NODE_RANK is the host's index. Before anything starts, every host that is not this machine must
answer `ssh <host> true` non-interactively (BatchMode), so a typo or a missing key fails at once
with ssh's own words. The driver hub listens on every interface (it admits only peers that prove
the job secret); ranks on other hosts reach it at the address this machine uses towards the first
of them. The rendezvous (MASTER_ADDR/MASTER_PORT) is on the first host: its port is chosen on the
driver, so on another host it is one that was free here a moment ago.

The same Python (path), this project and the user's code must exist on every host, as for
Horovod; the working directory is mpirun's.
"""
from __future__ import annotations

import subprocess
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import LaunchValidationError
from ..hub import address_toward, routable_address
from ..rank_env import free_port, rank_environment
from ..spec import LaunchRequest, RankSpec
from ..supervisor import Supervisor
from .base import JobContext, Placement, host_plan
from .local import driver_side_env

#: Seconds each `ssh <host> true` check may take.
SSH_CHECK_SECONDS = 30.0


class HostsPlacement(Placement):
    """Ranks on `hosts` [(name, slots)], this machine's among them or not.

    `local_hosts` are names that mean this machine (no ssh check). `ssh_port` and
    `ssh_identity_file` go to every ssh command. The launcher must be able to span hosts (`MpirunLauncher`).
    """

    hub_bind_host = "0.0.0.0"

    def __init__(
        self,
        hosts: Sequence[Tuple[str, int]],
        local_hosts: Sequence[str] = (),
        ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None,
    ) -> None:
        if not hosts or any(slots < 1 for _, slots in hosts):
            raise LaunchValidationError(f"hosts must list (name, slots >= 1) pairs, got {list(hosts)!r}")
        self.hosts = [(str(h), int(s)) for h, s in hosts]
        self.local_hosts = set(local_hosts)
        self.ssh_args: List[str] = []
        if ssh_port is not None:
            self.ssh_args += ["-p", str(ssh_port)]
        if ssh_identity_file is not None:
            self.ssh_args += ["-i", ssh_identity_file]
        self._supervisor: Optional[Supervisor] = None

    @property
    def remote_hosts(self) -> List[str]:
        return [h for h, _ in self.hosts if h not in self.local_hosts]

    def validate(self, request: LaunchRequest) -> None:
        total = sum(slots for _, slots in self.hosts)
        if request.num_processes > total:
            raise LaunchValidationError(
                f"num_processes={request.num_processes} but the hosts offer {total} slot(s) "
                f"({','.join(f'{h}:{s}' for h, s in self.hosts)}). Add slots or hosts.")
        if request.use_gpu:
            raise LaunchValidationError(
                "use_gpu=True is not supported on a host list; the ranks pick cuda:LOCAL_RANK "
                "themselves (pass use_gpu=False).")
        failures = self._check_ssh()
        if failures:
            lines = "\n".join(f"  {host}: {why}" for host, why in failures.items())
            raise LaunchValidationError(
                f"Could not reach these hosts with ssh (BatchMode, no password prompt):\n{lines}\n"
                "Check the host names, the ssh port (-p) and the identity file (-i), and that "
                "`ssh <host> true` works from this machine without a prompt.")

    def _check_ssh(self) -> Dict[str, str]:
        failures: Dict[str, str] = {}

        def probe(host: str) -> None:
            argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *self.ssh_args,
                    host, "true"]
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=SSH_CHECK_SECONDS)
            except FileNotFoundError:
                failures[host] = "no ssh client on this machine's PATH"
                return
            except subprocess.TimeoutExpired:
                failures[host] = f"ssh did not answer within {SSH_CHECK_SECONDS:g}s"
                return
            if done.returncode != 0:
                said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                failures[host] = said

        threads = [threading.Thread(target=probe, args=(h,), daemon=True) for h in self.remote_hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return failures

    def _driver_address(self) -> str:
        """The address of this machine on the route to the first other host."""
        for host in self.remote_hosts:
            try:
                return address_toward(host)
            except OSError:
                continue
        return routable_address()

    def start(self, job: JobContext) -> None:
        request = job.request
        start_on_hosts = getattr(job.launcher, "start_on_hosts", None)
        if start_on_hosts is None:
            raise LaunchValidationError(
                f"{type(job.launcher).__name__} cannot start ranks on other hosts; use "
                "MpirunLauncher with a host list.")
        specs = host_plan(self.hosts, request.num_processes)
        used = [(host, sum(1 for s in specs if s.node_rank == i))
                for i, (host, _) in enumerate(self.hosts[:specs[-1].node_rank + 1])]
        driver = self._driver_address()
        first = used[0][0]
        master_addr = driver if first in self.local_hosts else first
        master_port = free_port("0.0.0.0")
        hub = f"{driver}:{job.hub_address[1]}"

        def env_for(spec: RankSpec) -> dict:
            env = rank_environment(spec, master_addr, master_port, job.run_id, request.env)
            env.update(driver_side_env(job, spec, hub))
            return env

        self._supervisor = Supervisor(job.sink)
        start_on_hosts(specs, used, self.ssh_args, env_for, self._supervisor)

    def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()
