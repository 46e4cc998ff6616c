"""Horovod's elastic launch arguments: checked here, carried out by the elastic work (not yet).

`horovod.run`, `horovodrun` and `horovod.spark.run_elastic` accept Horovod's elastic arguments
with their spelling and validate them before anything starts; an elastic launch then stops with
`ElasticLaunchNotAvailable`, which says so plainly, instead of silently running a fixed-size job.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

#: Where the elastic launch is being built (the project's issue tracker).
ELASTIC_ISSUE = "issue 16 (elastic training and fault tolerance)"


class ElasticLaunchNotAvailable(NotImplementedError):
    """An elastic launch was asked for; this version runs fixed-size jobs only."""


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


def refuse_elastic(entry_point: str) -> None:
    """Raise `ElasticLaunchNotAvailable` for `entry_point` (e.g. 'horovod.run')."""
    raise ElasticLaunchNotAvailable(
        f"{entry_point}: elastic launches (min_num_proc / host_discovery_script) are not "
        f"available in this version of horovod-compat; they come with {ELASTIC_ISSUE}. Run a "
        "fixed-size job (num_proc only) for now; hvd.elastic.run inside the training function "
        "still retries after a failed collective.")
