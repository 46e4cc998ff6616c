"""Horovod's runtime knobs (horovodrun flags, ``--config-file`` keys) and what each becomes here.

Every knob Horovod's launcher accepts is listed once in `KNOBS`: the environment variable it sets
for the ranks when this project has the same knob (the ``horovod.torch`` shim or torch.distributed
reads it), or the one-line reason it has no effect here. `horovodrun` builds its tuning flags
from this table, and `--config-file` maps Horovod's YAML sections onto the same names.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


@dataclass(frozen=True)
class Knob:
    """One Horovod knob: `dest` is horovodrun's argparse name (and the config-file key)."""

    dest: str
    flags: Tuple[str, ...]
    kind: Any  # int, float, str, or bool for a switch
    help: str
    env: Optional[Callable[[Any], Dict[str, str]]] = None  # None: no effect here
    no_effect: str = ""  # why, when env is None
    negation: Optional[str] = None  # --no-... flag of a switch


def _set(name: str, convert: Callable[[Any], Any] = str) -> Callable[[Any], Dict[str, str]]:
    return lambda value: {name: str(convert(value))}


def _flag(value: bool) -> int:
    return 1 if value else 0


def _log_level_env(level: str) -> Dict[str, str]:
    """Horovod's backend log level → torch.distributed's C++ log level (our backend)."""
    level = level.upper()
    env = {"HOROVOD_LOG_LEVEL": level,
           "TORCH_CPP_LOG_LEVEL": {"TRACE": "INFO", "DEBUG": "INFO"}.get(level, level)}
    if level in ("TRACE", "DEBUG"):
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL" if level == "TRACE" else "INFO"
    return env


def _gloo_timeout_env(seconds: int) -> Dict[str, str]:
    return {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(seconds), "HOROVOD_COMPAT_OP_TIMEOUT": str(seconds)}


_ALGORITHMS = "torch.distributed (gloo, NCCL) chooses its own collective algorithms"

KNOBS: Tuple[Knob, ...] = (
    Knob("fusion_threshold_mb", ("--fusion-threshold-mb",), int,
         "fusion buffer size in MB; DistributedOptimizer's gradient buckets (HOROVOD_FUSION_THRESHOLD)",
         env=_set("HOROVOD_FUSION_THRESHOLD", lambda mb: int(mb) * 1024 * 1024)),
    Knob("cycle_time_ms", ("--cycle-time-ms",), float,
         "how long async ops gather before the coordinator negotiates them (HOROVOD_CYCLE_TIME)",
         env=_set("HOROVOD_CYCLE_TIME", lambda ms: float(ms))),
    Knob("cache_capacity", ("--cache-capacity",), int,
         "the coordinator's response cache size (HOROVOD_CACHE_CAPACITY)",
         env=_set("HOROVOD_CACHE_CAPACITY", lambda n: int(n))),
    Knob("hierarchical_allreduce", ("--hierarchical-allreduce",), bool,
         "host-aware allreduce across hosts (shared memory in each host, rings across them); on "
         "unless --no-hierarchical-allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE)",
         env=_set("HOROVOD_HIERARCHICAL_ALLREDUCE", _flag), negation="--no-hierarchical-allreduce"),
    Knob("hierarchical_allgather", ("--hierarchical-allgather",), bool, "hierarchical allgather",
         no_effect=_ALGORITHMS, negation="--no-hierarchical-allgather"),
    Knob("torus_allreduce", ("--torus-allreduce",), bool, "2D torus allreduce",
         no_effect=_ALGORITHMS, negation="--no-torus-allreduce"),
    Knob("autotune", ("--autotune",), bool, "Horovod's autotuner",
         no_effect="there is no autotuner; set --fusion-threshold-mb yourself", negation="--no-autotune"),
    Knob("autotune_log_file", ("--autotune-log-file",), str, "autotuner log",
         no_effect="there is no autotuner"),
    Knob("autotune_warmup_samples", ("--autotune-warmup-samples",), int, "autotuner warm-up",
         no_effect="there is no autotuner"),
    Knob("autotune_steps_per_sample", ("--autotune-steps-per-sample",), int, "autotuner steps",
         no_effect="there is no autotuner"),
    Knob("autotune_bayes_opt_max_samples", ("--autotune-bayes-opt-max-samples",), int,
         "autotuner samples", no_effect="there is no autotuner"),
    Knob("autotune_gaussian_process_noise", ("--autotune-gaussian-process-noise",), float,
         "autotuner noise", no_effect="there is no autotuner"),
    Knob("timeline_filename", ("--timeline-filename",), str,
         "record a Horovod timeline (Chrome trace) to this file (HOROVOD_TIMELINE)",
         env=_set("HOROVOD_TIMELINE", os.path.abspath)),
    Knob("timeline_mark_cycles", ("--timeline-mark-cycles",), bool,
         "mark cycles in the timeline (HOROVOD_TIMELINE_MARK_CYCLES)",
         env=_set("HOROVOD_TIMELINE_MARK_CYCLES", _flag), negation="--no-timeline-mark-cycles"),
    Knob("no_stall_check", ("--no-stall-check",), bool,
         "disable the stall inspector (HOROVOD_STALL_CHECK_DISABLE)",
         env=_set("HOROVOD_STALL_CHECK_DISABLE", _flag), negation="--stall-check"),
    Knob("stall_check_warning_time_seconds", ("--stall-check-warning-time-seconds",), int,
         "seconds until the stall warning (HOROVOD_STALL_CHECK_TIME_SECONDS)",
         env=_set("HOROVOD_STALL_CHECK_TIME_SECONDS")),
    Knob("stall_check_shutdown_time_seconds", ("--stall-check-shutdown-time-seconds",), int,
         "seconds until a stalled job is shut down (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)",
         env=_set("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")),
    Knob("mpi_threads_disable", ("--mpi-threads-disable",), bool, "MPI threading",
         no_effect="collectives run on torch.distributed, not on MPI",
         negation="--no-mpi-threads-disable"),
    Knob("num_nccl_streams", ("--num-nccl-streams",), int, "NCCL streams",
         no_effect="torch.distributed's NCCL backend manages its own streams"),
    Knob("thread_affinity", ("--thread-affinity",), int, "background thread affinity",
         no_effect="there is no Horovod background thread to pin"),
    Knob("gloo_timeout_seconds", ("--gloo-timeout-seconds",), int,
         "seconds a collective may take before it fails (HOROVOD_COMPAT_OP_TIMEOUT)",
         env=_gloo_timeout_env),
    Knob("log_level", ("--log-level",), str,
         "log level of the ranks' communication backend (torch.distributed: TORCH_CPP_LOG_LEVEL; "
         "DEBUG/TRACE also set TORCH_DISTRIBUTED_DEBUG) and of this launcher",
         env=_log_level_env),
    Knob("log_with_timestamp", ("--log-with-timestamp",), bool, "timestamps in Horovod's log",
         no_effect="there is no Horovod C++ log; see --prefix-output-with-timestamp",
         negation="--log-without-timestamp"),
)

BY_DEST: Dict[str, Knob] = {knob.dest: knob for knob in KNOBS}

#: Horovod's --config-file sections → {key in the section: knob dest}.
CONFIG_SECTIONS: Dict[str, Dict[str, str]] = {
    "params": {k: k for k in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                              "hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce")},
    "autotune": {"enabled": "autotune", "log_file": "autotune_log_file",
                 "warmup_samples": "autotune_warmup_samples",
                 "steps_per_sample": "autotune_steps_per_sample",
                 "bayes_opt_max_samples": "autotune_bayes_opt_max_samples",
                 "gaussian_process_noise": "autotune_gaussian_process_noise"},
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {"enabled": "no_stall_check",
                    "warning_time_seconds": "stall_check_warning_time_seconds",
                    "shutdown_time_seconds": "stall_check_shutdown_time_seconds"},
    "library_options": {k: k for k in ("mpi_threads_disable", "num_nccl_streams",
                                       "thread_affinity", "gloo_timeout_seconds")},
    "logging": {"level": "log_level", "with_timestamp": "log_with_timestamp"},
}


def validate(values: Mapping[str, Any]) -> None:
    """Horovod's range checks on knob values; ValueError naming the knob."""
    for dest, value in values.items():
        knob = BY_DEST.get(dest)
        if knob is None or value is None:
            continue
        if knob.kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{dest} must be a number, got {value!r}")
        if knob.kind in (int, float) and value < 0:
            raise ValueError(f"{dest}={value} must be >= 0")
    noise = values.get("autotune_gaussian_process_noise")
    if noise is not None and not 0 <= noise <= 1:
        raise ValueError(f"autotune_gaussian_process_noise={noise} must be in [0, 1]")
    level = values.get("log_level")
    if level is not None and str(level).upper() not in LOG_LEVELS:
        raise ValueError(f"log_level={level!r} must be one of {', '.join(LOG_LEVELS)}")


def environment(values: Mapping[str, Any]) -> Tuple[Dict[str, str], List[str]]:
    """(variables for the ranks, one note per set knob that has no effect here)."""
    env: Dict[str, str] = {}
    notes: List[str] = []
    for knob in KNOBS:
        value = values.get(knob.dest)
        if value is None or (knob.kind is bool and knob.dest == "timeline_mark_cycles"
                             and not values.get("timeline_filename")):
            continue
        if knob.env is not None:
            env.update(knob.env(value))
        else:
            notes.append(f"{knob.flags[0]} has no effect here: {knob.no_effect}.")
    return env, notes


def from_config(config: Mapping[str, Any], given: Iterable[str]) -> Dict[str, Any]:
    """Knob values from Horovod's YAML config layout, skipping knobs set on the command line
    (`given`); ValueError for an unknown section or key."""
    if not isinstance(config, Mapping):
        raise ValueError("the config file must hold a YAML mapping of sections (params, timeline, ...)")
    given = set(given)
    values: Dict[str, Any] = {}
    for section, body in config.items():
        if section == "controller":
            continue  # handled by the caller: it picks the launcher
        keys = CONFIG_SECTIONS.get(section)
        if keys is None:
            raise ValueError(f"unknown config section {section!r}; Horovod's sections are "
                             f"controller, {', '.join(CONFIG_SECTIONS)}")
        if not isinstance(body, Mapping):
            raise ValueError(f"config section {section!r} must be a mapping of keys to values")
        for key, value in body.items():
            dest = keys.get(key)
            if dest is None:
                raise ValueError(f"unknown key {key!r} in config section {section!r}; known: "
                                 f"{', '.join(keys)}")
            if dest in given:
                continue
            if section == "stall_check" and key == "enabled":
                value = not value  # the knob is "no stall check"
            values[dest] = value
    return values


def nic_environment(nics: Iterable[str]) -> Dict[str, str]:
    """Variables that pin the ranks' traffic to `nics` (torch's gloo, NCCL, Horovod's own)."""
    names = sorted(set(nics))
    return {"GLOO_SOCKET_IFNAME": ",".join(names), "NCCL_SOCKET_IFNAME": ",".join(names),
            "HOROVOD_GLOO_IFACE": names[0]}


def check_local_nics(nics: Iterable[str]) -> None:
    """ValueError naming the interfaces this host does not have."""
    present = {name for _, name in socket.if_nameindex()}
    missing = sorted(set(nics) - present)
    if missing:
        raise ValueError(f"network interface(s) {missing} do not exist on this host; it has "
                         f"{sorted(present)}")
