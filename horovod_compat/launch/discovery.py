"""Horovod's host discovery script, as the elastic engine's `ElasticPolicy.discovery`.

The script (``--host-discovery-script`` / ``host_discovery_script=``) prints the hosts that may
run workers now, one per line: ``hostname:slots``, or ``hostname`` alone when ``--slots`` says how
many slots every host has. Blank lines are ignored; an empty output means no host is available at
the moment (Horovod 0.28.1 reads it the same way). It is run again every time the driver polls.

Unlike Horovod, a line that is not a host entry, a host without a slot count when ``--slots`` is
not given, one host listed with two different counts, a non-zero exit status and a script that
runs longer than `timeout` seconds are errors that name the script and, where there is one, the
bad line.
"""
from __future__ import annotations

import re
import subprocess
from typing import Dict, Optional

#: Seconds one run of the discovery script may take.
DISCOVERY_TIMEOUT_SECONDS = 60.0

_LINE = re.compile(r"^([\w.-]+)(?::(\d+))?$")


class HostDiscoveryError(RuntimeError):
    """The host discovery script failed, hung, or printed something that is not a host list."""


class DiscoveryScript:
    """Calling it runs `path` and returns {host: slots} in the order the script printed them."""

    def __init__(self, path: str, default_slots: Optional[int] = None,
                 timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> None:
        self.path = path
        self.default_slots = default_slots
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"DiscoveryScript({self.path!r}, default_slots={self.default_slots})"

    def __call__(self) -> Dict[str, int]:
        try:
            done = subprocess.run([self.path], stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise HostDiscoveryError(
                f"host discovery script {self.path!r} did not finish within {self.timeout:g}s; it "
                "must print the available hosts and exit") from None
        except OSError as exc:
            raise HostDiscoveryError(
                f"cannot run host discovery script {self.path!r}: {exc.strerror}") from None
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-5:]
            detail = (":\n  " + "\n  ".join(said)) if said else ""
            raise HostDiscoveryError(
                f"host discovery script {self.path!r} exited with status {done.returncode}{detail}")
        return self.parse(done.stdout)

    def parse(self, output: str) -> Dict[str, int]:
        """The host list in `output` (the script's stdout)."""
        hosts: Dict[str, int] = {}
        for number, raw in enumerate(output.splitlines(), 1):
            line = raw.strip()
            if not line:
                continue
            match = _LINE.match(line)
            if match is None:
                raise HostDiscoveryError(
                    f"host discovery script {self.path!r}, output line {number}: {raw!r} is not "
                    "'hostname:slots' or 'hostname'")
            host, slots = match.group(1), match.group(2)
            if slots is None:
                if self.default_slots is None:
                    raise HostDiscoveryError(
                        f"host discovery script {self.path!r}, output line {number}: {raw!r} "
                        "gives no slot count; print 'hostname:slots' or pass --slots "
                        "(slots=) for hosts listed without one")
                count = self.default_slots
            else:
                count = int(slots)
            if hosts.get(host, count) != count:
                raise HostDiscoveryError(
                    f"host discovery script {self.path!r} lists {host!r} twice with different "
                    f"slot counts ({hosts[host]} and {count}); list each host once")
            hosts[host] = count
        return hosts
