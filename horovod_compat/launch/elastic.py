"""Horovod's elastic launch arguments: checked, then turned into the engine's `ElasticPolicy`.

`horovod.run` and `horovodrun` accept Horovod 0.28.1's elastic arguments with their spelling and
defaults, validate them before anything starts, and run an elastic job (`distributor.elastic`):

* a job is elastic when it has a host discovery script or a minimum size (Horovod's rule);
* ``min_num_proc`` defaults to ``num_proc``; ``max_num_proc`` unset means no maximum;
* ``elastic_timeout`` defaults to HOROVOD_ELASTIC_TIMEOUT, else 600 s;
* the hosts are the discovery script's (`discovery.DiscoveryScript`), else the fixed ``hosts`` /
  ``hostfile`` / ``localhost:num_proc`` (Horovod 0.28.1 refuses fewer than two fixed hosts; here
  one host is fine: a failed worker is replaced on the same host);
* every worker gets HOROVOD_ELASTIC=1, as from Horovod's gloo launcher; elastic jobs run in
  Horovod's gloo mode, never under mpirun.

`horovod.spark.run_elastic` checks its own arguments (`horovod_compat.spark.runner`) and runs on the
elastic Spark placement.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from distributor.elastic.policy import ElasticPolicy

from .discovery import DiscoveryScript, HostDiscoveryError

#: ``max_num_proc`` unset: Horovod puts no bound on the number of workers.
UNBOUNDED_WORKERS = 2 ** 31 - 1
#: Horovod's default of ``--elastic-timeout`` (seconds), unless HOROVOD_ELASTIC_TIMEOUT says otherwise.
DEFAULT_ELASTIC_TIMEOUT = 600
#: Variable Horovod's elastic launcher sets in every worker.
ELASTIC_ENV = {"HOROVOD_ELASTIC": "1"}

def _positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_elastic_args(
    num_proc: Optional[int],
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    slots: Optional[int] = None,
    reset_limit: Optional[int] = None,
    cooldown_range: Optional[Sequence[int]] = None,
    host_discovery_script: Optional[str] = None,
    elastic_timeout: Optional[int] = None,
) -> bool:
    """Validate Horovod's elastic arguments (ValueError naming the bad one); return True when
    they ask for an elastic job (a discovery script or a minimum size, as Horovod decides)."""
    if min_num_proc is not None:
        _positive_int("min_num_proc", min_num_proc)
    if max_num_proc is not None:
        _positive_int("max_num_proc", max_num_proc)
    if min_num_proc is not None and max_num_proc is not None and min_num_proc > max_num_proc:
        raise ValueError(f"min_num_proc={min_num_proc} is larger than max_num_proc={max_num_proc}")
    if num_proc is not None and max_num_proc is not None and num_proc > max_num_proc:
        raise ValueError(f"num_proc={num_proc} is larger than max_num_proc={max_num_proc}")
    if num_proc is not None and min_num_proc is not None and num_proc < min_num_proc:
        raise ValueError(f"num_proc={num_proc} is smaller than min_num_proc={min_num_proc}")
    if slots is not None:
        _positive_int("slots", slots)
    if reset_limit is not None:
        _positive_int("reset_limit", reset_limit, minimum=0)
    if elastic_timeout is not None:
        _positive_int("elastic_timeout", elastic_timeout)
    if cooldown_range is not None:
        if (len(cooldown_range) != 2 or not all(isinstance(v, int) and v >= 0 for v in cooldown_range)
                or cooldown_range[0] > cooldown_range[1]):
            raise ValueError(f"cooldown_range must be (min_seconds, max_seconds) with "
                             f"0 <= min <= max, got {cooldown_range!r}")
    if host_discovery_script is not None:
        if not os.path.isfile(host_discovery_script):
            raise ValueError(f"host_discovery_script {host_discovery_script!r} does not exist")
        if not os.access(host_discovery_script, os.X_OK):
            raise ValueError(f"host_discovery_script {host_discovery_script!r} is not executable; "
                             f"chmod +x it")
    return host_discovery_script is not None or min_num_proc is not None


@dataclass(frozen=True)
class ElasticArgs:
    """Horovod's elastic arguments after `check_elastic_args`."""

    min_num_proc: Optional[int] = None
    max_num_proc: Optional[int] = None
    slots: Optional[int] = None
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Sequence[int]] = None
    host_discovery_script: Optional[str] = None
    elastic_timeout: Optional[int] = None

    def timeout(self) -> float:
        """`elastic_timeout`, else HOROVOD_ELASTIC_TIMEOUT, else 600 s."""
        if self.elastic_timeout is not None:
            return float(self.elastic_timeout)
        raw = os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "").strip()
        if not raw:
            return float(DEFAULT_ELASTIC_TIMEOUT)
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value <= 0:
            raise ValueError(f"HOROVOD_ELASTIC_TIMEOUT={raw!r} is not a positive number of seconds")
        return value

    def discovery_script(self) -> Optional[DiscoveryScript]:
        if self.host_discovery_script is None:
            return None
        return DiscoveryScript(os.path.abspath(self.host_discovery_script), self.slots)

    def policy(self, num_proc: int, discovery: Callable[[], Mapping[str, int]]) -> ElasticPolicy:
        """The engine's policy for a job that starts with `num_proc` workers."""
        return ElasticPolicy(
            min_workers=self.min_num_proc or num_proc,
            max_workers=self.max_num_proc or UNBOUNDED_WORKERS,
            reset_limit=self.reset_limit,
            elastic_timeout=self.timeout(),
            cooldown_range=tuple(self.cooldown_range) if self.cooldown_range else None,
            discovery=discovery,
        )


def elastic_args(num_proc: Optional[int], **args: Any) -> Optional[ElasticArgs]:
    """`check_elastic_args(num_proc, **args)`; the arguments when the job is elastic, else None."""
    return ElasticArgs(**args) if check_elastic_args(num_proc, **args) else None


class FixedHosts:
    """Discovery for an elastic job without a script: the hosts it was given, always."""

    def __init__(self, hosts: Sequence[Tuple[str, int]]) -> None:
        self.hosts = list(hosts)

    def __call__(self) -> Dict[str, int]:
        return dict(self.hosts)

    def __repr__(self) -> str:
        return f"FixedHosts({self.hosts!r})"


def wait_for_slots(discover: Callable[[], Dict[str, int]], need: int, timeout: float,
                   waiting: Callable[[Dict[str, int]], str], too_few: Callable[[Dict[str, int]], str],
                   poll: float = 1.0) -> Dict[str, int]:
    """``discover()``'s hosts once they offer `need` slots (as Horovod waits before it starts the
    first workers: the cluster may be growing). Prints ``waiting(hosts)`` once if it has to wait,
    and raises ValueError(too_few(hosts)) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        hosts = discover()
        if sum(hosts.values()) >= need:
            return hosts
        if time.monotonic() >= deadline:
            raise ValueError(too_few(hosts))
        if not said:
            print(waiting(hosts), file=sys.stderr, flush=True)
            said = True
        time.sleep(poll)


def wait_for_script_slots(discovery: DiscoveryScript, num_proc: int, timeout: float) -> List[Tuple[str, int]]:
    """The discovery script's hosts once they offer `num_proc` slots; ValueError after `timeout`
    seconds saying what the script printed."""
    def discover() -> Dict[str, int]:
        try:
            return discovery()
        except HostDiscoveryError as exc:
            raise ValueError(str(exc)) from None

    def too_few(hosts: Dict[str, int]) -> str:
        listed = ",".join(f"{h}:{s}" for h, s in hosts.items()) or "no host"
        return (f"the host discovery script {discovery.path!r} offered {listed} "
                f"({sum(hosts.values())} slot(s)) for {timeout:g}s, fewer than the {num_proc} "
                "processes to start; lower -np/num_proc or make the script list more hosts/slots")

    hosts = wait_for_slots(discover, num_proc, timeout,
                           lambda _: (f"horovod-compat: waiting up to {timeout:g}s for the discovery "
                                      f"script to offer {num_proc} slots"), too_few)
    return [(host, slots) for host, slots in hosts.items() if slots > 0]

