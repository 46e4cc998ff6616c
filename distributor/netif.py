"""Network interfaces: which one a rank's traffic takes when its job spans hosts.

torch's gloo, NCCL and TensorPipe each pick an interface from the host's name unless
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` / ``TP_SOCKET_IFNAME`` name one. On many clusters
the host name resolves to a loopback address (Debian writes ``127.0.1.1 <hostname>`` into
/etc/hosts) or not at all, and a rank then advertises an address its peers cannot reach: gloo's
"connectFullMesh failed ... remote=[127.0.1.1]". So before the user's code runs, a rank whose
rendezvous host (``MASTER_ADDR``) is reached over a real network pins those libraries to the
interface its route to that host takes; the peers reach it there, as they reach the rendezvous.
Variables the user (or ``horovodrun --network-interface``) set are left as they are.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Dict, Mapping, Optional

#: The variables that pin torch.distributed's transports to an interface.
INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")

_SIOCGIFADDR = 0x8915


def address_toward(host: str) -> str:
    """This machine's address on the route to `host` (OSError when there is none)."""
    target = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(target)  # UDP: picks the route, sends nothing
        return probe.getsockname()[0]


def interface_address(name: str) -> str:
    """The IPv4 address of interface `name` (Linux ``SIOCGIFADDR``); OSError when it has none."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", name.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24])


def interface_of(address: str) -> Optional[str]:
    """The name of this host's interface that holds IPv4 `address`, or None."""
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == address:
                return name
        except OSError:
            continue
    return None


def interface_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The ``*_SOCKET_IFNAME`` variables to add to a rank's environment: the interface of its
    route to ``MASTER_ADDR``, for each of `INTERFACE_VARS` not set yet. Empty when the job has no
    rendezvous address, when it is on this host's loopback (a one-host job: nothing to choose),
    or when the route or its interface cannot be found (the libraries then choose as before)."""
    master = environ.get("MASTER_ADDR")
    missing = [name for name in INTERFACE_VARS if not environ.get(name)]
    if not master or not missing:
        return {}
    try:
        address = address_toward(master)
    except (OSError, UnicodeError):
        return {}
    if ipaddress.ip_address(address).is_loopback:
        return {}
    name = interface_of(address)
    return {var: name for var in missing} if name else {}
