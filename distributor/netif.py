"""Network interfaces: which one a rank's traffic takes when its job spans hosts.

torch's gloo, NCCL and TensorPipe each pick an interface from the host's name unless
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` / ``TP_SOCKET_IFNAME`` name one. On many clusters
the host name resolves to a loopback address (Debian writes ``127.0.1.1 <hostname>`` into
/etc/hosts) or not at all, and a rank then advertises an address its peers cannot reach: gloo's
"connectFullMesh failed ... remote=[127.0.1.1]". So before the user's code runs, a rank whose
rendezvous host (``MASTER_ADDR``) is reached over a real network pins those libraries to the
interface its route to that host takes; the peers reach it there, as they reach the rendezvous.
Variables the user (or ``horovodrun --network-interface``) set are left as they are.

Before a job starts on a host list, the driver runs this file on every host (its source, over
ssh, so it needs nothing but the standard library) as ``python - PORT TARGET...``: `probe` says
which interface the host's route to each other host takes and whether that host answers there
(``distributor.netplan`` turns the answers into the job's interfaces, as Horovod's driver does
with its task services).
"""
from __future__ import annotations

import errno
import ipaddress
import json
import socket
import struct
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

#: The variables that pin torch.distributed's transports to an interface.
INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")

_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
#: Seconds a probe waits for a TCP answer from another host.
PROBE_SECONDS = 3.0


def address_toward(host: str) -> str:
    """This machine's address on the route to `host` (OSError when there is none)."""
    target = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(target)  # UDP: picks the route, sends nothing
        return probe.getsockname()[0]


def _ioctl_address(name: str, request_code: int) -> str:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", name.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(probe.fileno(), request_code, request)[20:24])


def interface_address(name: str) -> str:
    """The IPv4 address of interface `name` (Linux ``SIOCGIFADDR``); OSError when it has none."""
    return _ioctl_address(name, _SIOCGIFADDR)


def interface_networks() -> Dict[str, str]:
    """{name: IPv4 network in CIDR notation, e.g. "10.78.0.0/24"} of this host's interfaces
    that have an IPv4 address."""
    found = {}
    for _, name in socket.if_nameindex():
        try:
            address = interface_address(name)
            mask = _ioctl_address(name, _SIOCGIFNETMASK)
        except OSError:
            continue
        found[name] = str(ipaddress.ip_network(f"{address}/{mask}", strict=False))
    return found


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


def loopback_listener(host: str, port: int) -> Optional[socket.socket]:
    """A TCP socket listening on `host`:`port` when `host` is a loopback address (a job whose
    ranks all run on this machine), else None. torch's c10d ``TCPStore`` listens on every
    interface whatever host it is given; handed this socket (``master_listen_fd``, which it then
    owns: pass ``sock.detach()``) it listens on loopback only, out of other machines' reach."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: leave it to torch
    if not address.is_loopback:
        return None
    sock = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _answers(target: str, port: int, timeout: float) -> Optional[str]:
    """None when `target` answers a TCP connection to `port` (accepted or refused: either way
    the packets went there and back), else why not."""
    try:
        with socket.create_connection((target, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return None
    except socket.timeout:
        return f"no answer within {timeout:g}s (a firewall, or a host that is down)"
    except OSError as exc:
        return exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))


def probe(targets: Sequence[str], port: int, timeout: float = PROBE_SECONDS) -> Dict[str, Any]:
    """What this host sees of a job's network: its interfaces (every name, and the IPv4 network
    of each that has an address), and for each target address the interface and address its
    route takes and whether the target answers on TCP `port` (``error`` None: it does)."""
    routes: Dict[str, Dict[str, Optional[str]]] = {}

    def look(target: str) -> None:
        try:
            source = address_toward(target)
        except (OSError, UnicodeError) as exc:
            routes[target] = {"interface": None, "address": None,
                              "error": f"no route ({getattr(exc, 'strerror', None) or exc})"}
            return
        routes[target] = {"interface": interface_of(source), "address": source,
                          "error": _answers(target, port, timeout)}

    threads = [threading.Thread(target=look, args=(t,), daemon=True) for t in dict.fromkeys(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    names: List[str] = sorted(name for _, name in socket.if_nameindex())
    return {"host": socket.gethostname(), "interfaces": names,
            "networks": interface_networks(), "routes": routes}


if __name__ == "__main__":  # python - PORT TARGET...  (source sent over ssh by the driver)
    print(json.dumps(probe(sys.argv[2:], int(sys.argv[1]))))
