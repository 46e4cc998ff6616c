"""Horovod's host notation: ``-H host1:2,host2:4``, host files (``host slots=N``) and which hosts
are this machine."""
from __future__ import annotations

import os
import re
import socket
from typing import List, Optional, Sequence, Tuple

HostSlots = Tuple[str, int]

_HOST_ENTRY = re.compile(r"^([\w.-]+)(?::(\d+))?$")


def parse_hosts(spec: str) -> List[HostSlots]:
    """``host:slots,host:slots`` → [(host, slots)]; a missing slot count means 1 (as mpirun)."""
    hosts: List[HostSlots] = []
    for item in spec.split(","):
        match = _HOST_ENTRY.match(item.strip())
        if match is None:
            raise ValueError(
                f"bad host entry {item.strip()!r} in {spec!r}: expected host:slots, e.g. "
                "worker-0:2,worker-1:2")
        slots = int(match.group(2) or 1)
        if slots < 1:
            raise ValueError(f"host entry {item.strip()!r} offers no slots; give at least 1")
        hosts.append((match.group(1), slots))
    _check_unique(hosts, spec)
    return hosts


def parse_hostfile(path: str) -> List[HostSlots]:
    """A host file: one ``hostname slots=N`` per line (``#`` comments and blank lines ignored)."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the host file {path!r}: {exc.strerror}") from None
    hosts: List[HostSlots] = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^([\w.-]+)(?:\s+slots\s*=\s*(\d+))?$", line)
        if match is None:
            raise ValueError(
                f"{path}:{number}: {raw.strip()!r} is not a host line; write 'hostname slots=N'")
        hosts.append((match.group(1), int(match.group(2) or 1)))
    if not hosts:
        raise ValueError(f"the host file {path!r} lists no host; write one 'hostname slots=N' per line")
    _check_unique(hosts, path)
    return hosts


def _check_unique(hosts: Sequence[HostSlots], where: str) -> None:
    names = [name for name, _ in hosts]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{where} lists {repeated} more than once; give each host once with its "
                         "total slot count")


def local_addresses() -> set:
    """Names and addresses that mean this machine."""
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), os.uname().nodename}
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


def is_local(host: str, local: Optional[set] = None) -> bool:
    """True if `host` names this machine (by name, or by resolving to a loopback/own address)."""
    local = local_addresses() if local is None else local
    if host in local:
        return True
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    return address.startswith("127.") or address in local


def slots_for(hosts: Sequence[HostSlots], num_proc: int) -> List[HostSlots]:
    """The hosts that `num_proc` ranks fill, in order, each with the ranks it gets (as Horovod
    assigns: host by host, as many as fit); ValueError if the slots do not suffice."""
    total = sum(slots for _, slots in hosts)
    if total < num_proc:
        listed = ",".join(f"{h}:{s}" for h, s in hosts)
        raise ValueError(f"{num_proc} processes were requested but the hosts ({listed}) offer only "
                         f"{total} slot(s); raise the slot counts or lower the number of processes")
    used: List[HostSlots] = []
    left = num_proc
    for host, slots in hosts:
        if left == 0:
            break
        take = min(slots, left)
        used.append((host, take))
        left -= take
    return used
