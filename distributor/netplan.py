"""The interfaces a job across hosts uses, from what every host sees (`netif.probe`).

Horovod's driver starts a task service on every host, has each one try the others' addresses
and hands the interfaces that worked to gloo, NCCL and mpirun. Here the driver runs
`netif.probe` on every host (over the ssh it checks the hosts with anyway) and on itself, then
`plan` decides, before any rank starts:

- every host must reach every other host and the driver (on the route its kernel picks); a pair
  that does not is an error naming both hosts, the interface and why;
- the ranks' transports (gloo, NCCL, TensorPipe: ``*_SOCKET_IFNAME``) get the interface every
  rank host routes the others over, when they all use the same name; when the names differ each
  rank keeps choosing the interface of its route to the rendezvous host (`netif.interface_env`);
- mpirun (``btl_tcp_if_include`` for the ranks, ``oob_tcp_if_include`` for its daemons, which
  include the driver's) gets those interface names, or the networks they are on in CIDR
  notation when the names differ, so no host's loopback or unrelated interface is tried.

Pure: no I/O, tested without hosts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .errors import LaunchValidationError

#: How the driver is named in messages and in the reports' keys.
DRIVER = "this machine"


@dataclass(frozen=True)
class NetworkPlan:
    """The interfaces chosen for one job (see the module docstring)."""

    #: host -> the interface(s) its routes to the other hosts take
    interfaces: Mapping[str, Tuple[str, ...]]
    #: a name every rank host routes the others over, else None
    common: Optional[str]
    #: what mpirun's ``*_tcp_if_include`` gets: interface names, or CIDR networks
    mpi_include: Tuple[str, ...]

    def describe(self) -> str:
        """One line for ``--verbose``."""
        where = ", ".join(f"{host} {'+'.join(names)}" for host, names in self.interfaces.items())
        return (f"network: {where}; ranks use {self.common or 'the interface of their route'}, "
                f"mpirun {','.join(self.mpi_include) or 'its own choice'}")


def targets_for(host: str, addresses: Mapping[str, str], driver_toward: Mapping[str, str]) -> List[str]:
    """The addresses `host` must reach: every other host's, and the driver's toward it."""
    wanted = [address for other, address in addresses.items() if other != host]
    if host in driver_toward:
        wanted.append(driver_toward[host])
    return list(dict.fromkeys(wanted))


def plan(
    addresses: Mapping[str, str],
    reports: Mapping[str, Mapping[str, Any]],
    rank_hosts: Sequence[str],
) -> NetworkPlan:
    """Check the reports and choose the interfaces.

    `addresses`: {host as the user named it: the address the driver resolved}; `reports`: the
    `netif.probe` answer of every host in `addresses` and of the driver (key `DRIVER`), each
    probed toward `targets_for` it; `rank_hosts`: the hosts that run ranks (the driver is one
    where it is among the hosts). Raises `LaunchValidationError` when some host does not reach
    another."""
    broken = []
    interfaces: Dict[str, Tuple[str, ...]] = {}
    for host, report in reports.items():
        names: List[str] = []
        for target, route in report["routes"].items():
            name = route.get("interface")
            if route.get("error"):
                over = f" over {name} ({route.get('address')})" if name else ""
                broken.append(f"  {host} -> {_named(target, addresses)}{over}: {route['error']}")
                continue
            if name and name != "lo" and name not in names:
                names.append(name)
        interfaces[host] = tuple(names)
    if broken:
        raise LaunchValidationError(
            "Not every host of the job reaches the others (each must reach every other host "
            "and this machine, which runs the driver):\n" + "\n".join(broken) + "\nFix the "
            "routes or firewall between them, or name an interface that connects them all "
            "with --network-interface (horovodrun) / GLOO_SOCKET_IFNAME.")
    shared = _in_all(interfaces.get(h, ()) for h in rank_hosts)
    common = sorted(shared)[0] if shared else None
    same_everywhere = _in_all(interfaces.values())
    include = tuple(sorted(same_everywhere or {
        reports[host]["networks"].get(name, "") for host, names in interfaces.items() for name in names
    } - {""}))
    return NetworkPlan(interfaces, common, include)


def _in_all(name_lists: Iterable[Sequence[str]]) -> Set[str]:
    """The names in every non-empty list (none when there is no such list)."""
    sets = [set(names) for names in name_lists if names]
    return set.intersection(*sets) if sets else set()


def _named(target: str, addresses: Mapping[str, str]) -> str:
    for host, address in addresses.items():
        if address == target:
            return host if host == address else f"{host} ({address})"
    return f"{DRIVER} ({target})"
