"""Hosts placement: ranks on a list of machines, this one among them or not.

Two ways to start them, chosen by the launcher:

* `MpirunLauncher`: one mpirun reaches the other hosts over ssh (as Horovod's and Open MPI's own
  launchers do); the job's size is fixed.
* `PythonLauncher` (Horovod's gloo mode, and elastic jobs): each worker is its own process, on
  this machine when its host names this machine (`is_local`), else started with
  ``ssh -o BatchMode=yes HOST 'cd CWD && env VAR=... PYTHON -m distributor.rank_entry'`` (as
  Horovod's gloo launcher does: the driver's environment goes along, but for per-shell variables).
  Workers can then be added while the job runs (`add_worker`, on any host name, also one the job
  did not start on) and stopped one by one (`stop_worker`).

Ranks fill the hosts in order (host 0 gets the first ranks), so LOCAL_RANK counts per host and
NODE_RANK is the host's index. Before anything starts, every host that is not this machine must
answer one non-interactive ssh (BatchMode), so a typo or a missing key fails at once with ssh's
own words. That ssh runs `netif.probe` there (its source on stdin, the driver's Python or
``python3``): which interface the host's routes to the other hosts and to this machine take, and
whether they answer. `netplan.plan` checks every host reaches every other and picks the
interfaces for the ranks' transports and mpirun, as Horovod's driver does; interfaces the job is
pinned to (``GLOO_SOCKET_IFNAME``, from ``--network-interface``) must exist on every host. The driver hub
listens on every interface (it admits only peers that prove the job secret); ranks on other hosts
reach it at the address this machine uses towards them. The rendezvous (MASTER_ADDR/MASTER_PORT) is on the first host: its port is chosen on the
driver, so on another host it is one that was free here a moment ago.

The same Python (path), this project and the user's code must exist on every host, as for
Horovod; the working directory is mpirun's, or the driver's (direct processes).
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import netif
from ..errors import LaunchValidationError
from ..hub import routable_address
from ..launchers import PythonLauncher
from ..netif import INTERFACE_VARS, address_toward
from ..netplan import DRIVER, NetworkPlan, plan, targets_for
from ..rank_env import free_port, rank_environment, travels_to_other_hosts
from ..spec import LaunchRequest, RankSpec
from ..supervisor import Supervisor
from .base import (
    JobContext, Placement, PlacementCapabilities, added_worker_spec, host_plan, stop_in_background,
)
from .local import driver_side_env

#: Seconds each host's ssh check (with its network probe) may take.
SSH_CHECK_SECONDS = 30.0


def ssh_worker_command(env: Mapping[str, str], argv: Sequence[str], cwd: str) -> str:
    """The remote shell command that runs `argv` in `cwd` with `env` on another host."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in sorted(env.items())
                   if travels_to_other_hosts(name)]
    return (f"cd {shlex.quote(cwd)} && env {' '.join(assignments)} "
            f"{' '.join(shlex.quote(a) for a in argv)}")


class HostsPlacement(Placement):
    """Ranks on `hosts` [(name, slots)], this machine's among them or not.

    `local_hosts` are names that mean this machine (no ssh check, local processes); `is_local`,
    when given, decides that for host names the job adds later. `ssh_port` and
    `ssh_identity_file` go to every ssh command; `verbose` prints the network plan. The launcher is `MpirunLauncher` (one mpirun
    across the hosts) or `PythonLauncher` (one process per worker; the job may add workers).

    The driver hub (and an elastic job's store) listens on loopback only when every host is this
    machine and no other machine can join: `discovers_hosts` says whether one can (by default:
    in an elastic job, whose discovery may offer any host; pass False when it offers only these
    hosts); else on every interface.
    """

    capabilities = PlacementCapabilities(adds_workers=True)  # with a PythonLauncher

    def __init__(
        self,
        hosts: Sequence[Tuple[str, int]],
        local_hosts: Sequence[str] = (),
        ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None,
        is_local: Optional[Callable[[str], bool]] = None,
        verbose: bool = False,
        discovers_hosts: Optional[bool] = None,
    ) -> None:
        if not hosts or any(slots < 1 for _, slots in hosts):
            raise LaunchValidationError(f"hosts must list (name, slots >= 1) pairs, got {list(hosts)!r}")
        self.hosts = [(str(h), int(s)) for h, s in hosts]
        self.local_hosts = set(local_hosts)
        self._is_local = is_local or self.local_hosts.__contains__
        self.verbose = verbose
        self.discovers_hosts = discovers_hosts
        self._elastic = False  # the request's, once `validate` saw it
        self.ssh_args: List[str] = []
        if ssh_port is not None:
            self.ssh_args += ["-p", str(ssh_port)]
        if ssh_identity_file is not None:
            self.ssh_args += ["-i", ssh_identity_file]
        self._supervisor: Optional[Supervisor] = None
        self._job: Optional[JobContext] = None
        self._master: Tuple[str, int] = ("127.0.0.1", 0)
        #: the interfaces chosen by `validate` (None: every host is this machine)
        self.network: Optional[NetworkPlan] = None

    @property
    def hub_bind_host(self) -> str:  # type: ignore[override]
        """Loopback when nothing outside this machine needs to reach the driver: every host is
        this machine and host discovery cannot add another; else every interface (the hub admits
        only peers that prove the job secret)."""
        return "127.0.0.1" if self._loopback_only() else "0.0.0.0"

    def _loopback_only(self, elastic: Optional[bool] = None) -> bool:
        """Whether nothing outside this machine takes part: every host is this machine and no
        other can join (`elastic`: whether the job is elastic, if `validate` has not said)."""
        if self.remote_hosts:
            return False
        if self.discovers_hosts is not None:
            return not self.discovers_hosts
        return not (self._elastic if elastic is None else elastic)

    @property
    def remote_hosts(self) -> List[str]:
        return [h for h, _ in self.hosts if not self.is_local(h)]

    def is_local(self, host: str) -> bool:
        """True when `host` names this machine: its workers are local processes."""
        return host in self.local_hosts or self._is_local(host)

    def _check_slots(self, request: LaunchRequest, what: str = "the hosts",
                     fix: str = "Add slots or hosts.") -> None:
        self._elastic = request.elastic is not None
        total = sum(slots for _, slots in self.hosts)
        if request.num_processes > total:
            raise LaunchValidationError(
                f"num_processes={request.num_processes} but {what} offer {total} slot(s) "
                f"({','.join(f'{h}:{s}' for h, s in self.hosts)}). {fix}")

    def validate(self, request: LaunchRequest) -> None:
        self._check_slots(request)
        if request.use_gpu:
            raise LaunchValidationError(
                "use_gpu=True is not supported on a host list; the ranks pick cuda:LOCAL_RANK "
                "themselves (pass use_gpu=False).")
        if not self.remote_hosts:
            return
        addresses = self._resolved()
        reports, failures = self._probe_hosts(addresses)
        if failures:
            lines = "\n".join(f"  {host}: {why}" for host, why in failures.items())
            raise LaunchValidationError(
                f"Could not reach these hosts with ssh (BatchMode, no password prompt):\n{lines}\n"
                "Check the host names, the ssh port (-p) and the identity file (-i), and that "
                "`ssh <host> true` works from this machine without a prompt.")
        self._check_interfaces(request, {h: r["interfaces"] for h, r in reports.items()})
        rank_hosts = [DRIVER if self.is_local(h) else h for h, _ in self.hosts]
        self.network = plan(addresses, reports, rank_hosts)
        if self.verbose:
            print(f"horovod-compat: {self.network.describe()}", file=sys.stderr, flush=True)

    def _check_interfaces(self, request: LaunchRequest, interfaces: Dict[str, List[str]]) -> None:
        """Every interface the job pins its traffic to (GLOO_SOCKET_IFNAME, ...) must exist on
        every host, or no rank starts: say which host lacks which, and what it has."""
        wanted = sorted({name.strip() for var in INTERFACE_VARS
                         for name in request.env.get(var, "").split(",") if name.strip()})
        if not wanted:
            return
        local = sorted(name for _, name in socket.if_nameindex())
        lacking = []
        for host, _ in self.hosts:
            present = local if self.is_local(host) else interfaces.get(host, [])
            missing = [name for name in wanted if name not in present]
            if missing:
                lacking.append(f"  {host}: no {', '.join(missing)} (it has {', '.join(present)})")
        if lacking:
            raise LaunchValidationError(
                f"The job's traffic is pinned to network interface(s) {', '.join(wanted)} "
                f"({', '.join(v for v in INTERFACE_VARS if request.env.get(v))}, e.g. from "
                "horovodrun --network-interface), but not every host has them:\n"
                + "\n".join(lacking) + "\nName interfaces that every host has, or leave them "
                "out: each rank then takes the interface of its route to the rendezvous host.")

    def _resolved(self) -> Dict[str, str]:
        """{remote host: its IPv4 address as this machine resolves it}; a name only ssh knows
        (an alias in its config) is left out of the reachability checks."""
        found = {}
        for host in self.remote_hosts:
            try:
                found[host] = socket.gethostbyname(host)
            except OSError:
                continue
        return found

    def _probe_hosts(self, addresses: Mapping[str, str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
        """({host: its `netif.probe` report}, {host: why ssh failed}): one non-interactive ssh
        per remote host, in parallel, and this machine's own probe (key `DRIVER`)."""
        failures: Dict[str, str] = {}
        reports: Dict[str, Any] = {}
        port = int(self.ssh_args[self.ssh_args.index("-p") + 1]) if "-p" in self.ssh_args else 22
        toward = {host: self._address_toward(host) for host in self.remote_hosts}
        with open(netif.__file__, encoding="utf-8") as f:
            source = f.read()
        python = shlex.quote(sys.executable)

        def probe(host: str) -> None:
            targets = targets_for(host, addresses, toward)
            remote = (f'P={python}; [ -x "$P" ] || P=python3; exec "$P" - {port} '
                      + " ".join(shlex.quote(t) for t in targets))
            argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *self.ssh_args,
                    host, remote]
            try:
                done = subprocess.run(argv, input=source, capture_output=True, text=True,
                                      timeout=SSH_CHECK_SECONDS)
            except FileNotFoundError:
                failures[host] = "no ssh client on this machine's PATH"
                return
            except subprocess.TimeoutExpired:
                failures[host] = f"ssh did not answer within {SSH_CHECK_SECONDS:g}s"
                return
            if done.returncode != 0:
                said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                failures[host] = said
                return
            try:
                reports[host] = json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                failures[host] = (f"the network probe printed no report (the same Python as here, "
                                  f"{sys.executable}, or python3 must exist there): "
                                  f"{(done.stdout + done.stderr).strip()[-300:]!r}")

        threads = [threading.Thread(target=probe, args=(h,), daemon=True) for h in self.remote_hosts]
        for thread in threads:
            thread.start()
        reports[DRIVER] = netif.probe(list(addresses.values()), port)
        for thread in threads:
            thread.join()
        return reports, failures

    def _driver_address(self, elastic: Optional[bool] = None) -> str:
        """The address of this machine on the route to the first other host it has one to
        (loopback when every host is this machine and no other can join)."""
        if self._loopback_only(elastic):
            return "127.0.0.1"
        for host in self.remote_hosts:
            try:
                return address_toward(host)
            except OSError:
                continue
        return routable_address()

    def store_host(self) -> str:
        """Where workers reach the elastic job's store on the driver: this machine's address
        toward the other hosts (its routable address can be one they have no route to)."""
        # asked before `validate`, and only by an elastic job
        return self._driver_address(elastic=True)

    @staticmethod
    def _address_toward(host: str) -> str:
        """This machine's address on the route to `host`, else its routable address."""
        try:
            return address_toward(host)
        except OSError:
            return routable_address()

    def worker_hosts(self, request: LaunchRequest) -> List[str]:
        return [self.hosts[spec.node_rank][0] for spec in host_plan(self.hosts, request.num_processes)]

    def start(self, job: JobContext) -> None:
        request = job.request
        specs = host_plan(self.hosts, request.num_processes)
        used = [(host, sum(1 for s in specs if s.node_rank == i))
                for i, (host, _) in enumerate(self.hosts[:specs[-1].node_rank + 1])]
        driver = self._driver_address()
        first = used[0][0]
        master_addr = driver if self.is_local(first) else first
        self._master = (master_addr, free_port(self.hub_bind_host))
        self._job = job
        self._supervisor = Supervisor(job.sink)
        if isinstance(job.launcher, PythonLauncher):
            if request.elastic is not None:  # replacements on this machine fork from a warm server
                job.launcher.keep_warm(self._env(specs[0], f"127.0.0.1:{job.hub_address[1]}"))
            for spec in specs:
                self._start_worker(used[spec.node_rank][0], spec)
            return
        start_on_hosts = getattr(job.launcher, "start_on_hosts", None)
        if start_on_hosts is None:
            raise LaunchValidationError(
                f"{type(job.launcher).__name__} cannot start ranks on other hosts; use "
                "MpirunLauncher or PythonLauncher with a host list.")
        hub = f"{driver}:{job.hub_address[1]}"
        networks = self.network.mpi_include if self.network is not None else ()
        start_on_hosts(specs, used, self.ssh_args, lambda spec: self._env(spec, hub),
                       self._supervisor, networks=networks)

    def _env(self, spec: RankSpec, hub: str) -> Dict[str, str]:
        assert self._job is not None
        env = rank_environment(spec, *self._master, self._job.run_id, self._job.request.env)
        env.update(driver_side_env(self._job, spec, hub))
        common = self.network.common if self.network is not None else None
        for var in INTERFACE_VARS:  # the interface every rank host shares, unless one is set
            if common and not env.get(var) and not os.environ.get(var):
                env[var] = common
        return env

    def _start_worker(self, host: str, spec: RankSpec) -> None:
        """One worker process on `host`: a local process, or one started over ssh."""
        job, supervisor = self._job, self._supervisor
        assert job is not None and supervisor is not None and isinstance(job.launcher, PythonLauncher)
        port = job.hub_address[1]
        if self.is_local(host):
            job.launcher.start([spec], lambda s: self._env(s, f"127.0.0.1:{port}"), supervisor)
            return
        env = self._env(spec, f"{self._address_toward(host)}:{port}")
        remote = ssh_worker_command(env, job.launcher.command(), os.getcwd())
        supervisor.start(spec.rank, ["ssh", "-o", "BatchMode=yes", *self.ssh_args, host, remote],
                         os.environ)

    def add_worker(self, worker_id: int, host: str) -> None:
        if self._job is None or not isinstance(self._job.launcher, PythonLauncher):
            raise RuntimeError("add_worker needs a job started with a PythonLauncher")
        if self._loopback_only() and not self.is_local(host):
            raise LaunchValidationError(
                f"cannot start a worker on {host}, another machine: every host of this job was "
                "this machine, so its driver listens on loopback only. Pass "
                "HostsPlacement(..., discovers_hosts=True) when host discovery may add other "
                "machines.")
        self._start_worker(host, added_worker_spec(worker_id))

    def stop_worker(self, worker_id: int) -> None:
        stop_in_background(self._supervisor, worker_id)

    def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()

    def close(self) -> None:
        if self._job is not None:
            self._job.launcher.release()
