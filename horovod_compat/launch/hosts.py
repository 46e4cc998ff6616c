"""Horovod's host notation: ``-H host1:2,host2:4``, host files (``host slots=N``) and which hosts
are this machine."""
from __future__ import annotations

import os
import re
import socket
from typing import List, Optional, Sequence, Tuple

HostSlots = Tuple[str, int]

_HOST_NAME = re.compile(r"^[\w.-]+$")
#: The syntax of each source, quoted in every message about it.
HOSTS_SYNTAX = "host:slots entries joined by commas, e.g. -H host1:2,host2:2"
HOSTFILE_SYNTAX = "one 'hostname slots=N' line per host, e.g. 'host1 slots=2'"


def _slot_count(text: str, what: str, syntax: str) -> int:
    """The slot count `text` of `what`: a whole number of at least 1 (ValueError otherwise)."""
    if not text.isdecimal():
        raise ValueError(f"{what}: the slot count {text!r} is not a whole number; write {syntax}")
    if int(text) < 1:
        raise ValueError(f"{what}: {text} slots; give at least 1 ({syntax})")
    return int(text)


def _host_entry(item: str, spec: str) -> HostSlots:
    """One ``host[:slots]`` entry of an -H list; a missing slot count means 1 (as mpirun)."""
    what = f"bad host entry {item!r}" + (f" in -H {spec!r}" if spec.strip() != item else "")
    if not item:
        raise ValueError(f"{what}: an empty entry (a stray comma, or a space after a comma); "
                         f"write {HOSTS_SYNTAX} (no spaces)")
    name, colon, slots = item.partition(":")
    if not _HOST_NAME.match(name) or (colon and ":" in slots):
        raise ValueError(f"{what}: expected {HOSTS_SYNTAX}")
    return name, _slot_count(slots, what, HOSTS_SYNTAX) if colon else 1


def parse_hosts(spec: str) -> List[HostSlots]:
    """``host:slots,host:slots`` → [(host, slots)]; a missing slot count means 1 (as mpirun)."""
    hosts = [_host_entry(item.strip(), spec) for item in spec.split(",")]
    _check_unique(hosts, f"-H {spec!r}")
    return hosts


def _hostfile_line(line: str, where: str) -> HostSlots:
    """One ``hostname [slots=N]`` line of a host file; a missing slot count means 1 (as mpirun)."""
    match = re.match(r"^([\w.-]+)(?:\s+slots\s*=\s*(\S*))?$", line)
    if match is None:
        entry = re.match(r"^([\w.-]+):(\d+)$", line)  # -H notation in a host file
        hint = (f"write it as '{entry.group(1)} slots={entry.group(2)}' (host:slots is -H's notation)"
                if entry else f"write {HOSTFILE_SYNTAX}")
        raise ValueError(f"{where}: {line!r} is not a host line; {hint}")
    what = f"{where}: {line!r}"
    slots = match.group(2)
    return match.group(1), 1 if slots is None else _slot_count(slots, what, HOSTFILE_SYNTAX)


def parse_hostfile(path: str) -> List[HostSlots]:
    """A host file: one ``hostname slots=N`` per line (``#`` comments and blank lines ignored)."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the host file {path!r}: {exc.strerror}; "
                         f"give a file with {HOSTFILE_SYNTAX}") from None
    hosts: List[HostSlots] = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.append(_hostfile_line(line, f"{path}:{number}"))
    if not hosts:
        raise ValueError(f"the host file {path!r} lists no host; write {HOSTFILE_SYNTAX}")
    _check_unique(hosts, f"the host file {path!r}")
    return hosts


def _check_unique(hosts: Sequence[HostSlots], where: str) -> None:
    names = [name for name, _ in hosts]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{where} lists {', '.join(repeated)} more than once; give each host once "
                         "with its total slot count")


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
        more = [*hosts[:-1], (hosts[-1][0], hosts[-1][1] + num_proc - total)] if hosts else []
        bigger = ",".join(f"{h}:{s}" for h, s in more)
        raise ValueError(f"{num_proc} processes were requested but the hosts ({listed}) offer only "
                         f"{total} slot(s); lower -np to {total} or give the hosts more slots, "
                         f"e.g. -H {bigger}")
    used: List[HostSlots] = []
    left = num_proc
    for host, slots in hosts:
        if left == 0:
            break
        take = min(slots, left)
        used.append((host, take))
        left -= take
    return used
