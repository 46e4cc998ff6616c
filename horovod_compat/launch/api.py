"""``horovod.run(func, ...)``: Horovod 0.28.1's Python launcher, on this project's engine.

Same signature and deprecated aliases as Horovod's ``horovod.runner.run``. Every rank runs
``func(*args, **kwargs)``; the return values come back as a list in rank order. A failing rank
raises `distributor.RankFailedError` (a RuntimeError) on the caller with the rank's exception type,
message and traceback, after every other rank has been stopped.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .elastic import elastic_args
from .job import HorovodJob


def run(
    func: Callable[..., Any],
    args: Tuple[Any, ...] = (),
    kwargs: Optional[Dict[str, Any]] = None,
    num_proc: int = 1,
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    slots: Optional[int] = None,
    reset_limit: Optional[int] = None,
    cooldown_range: Optional[Sequence[int]] = None,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    host_discovery_script: Optional[str] = None,
    start_timeout: Optional[float] = None,
    ssh_port: Optional[int] = None,
    ssh_identity_file: Optional[str] = None,
    disable_cache: Optional[bool] = None,
    output_filename: Optional[str] = None,
    verbose: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    use_mpi: Optional[bool] = None,
    mpi_args: Optional[str] = None,
    network_interface: Optional[str] = None,
    network_interfaces: Optional[Sequence[str]] = None,
    executable: Optional[str] = None,
    np: Optional[int] = None,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
) -> List[Any]:
    """Run `func` on `num_proc` Horovod processes; return every process's value in rank order.

    `hosts` ("host1:2,host2:2") or `hostfile` ("host slots=N" lines) place the processes; the
    default is this host. Hosts other than this one are reached with mpirun over ssh
    (`ssh_port`, `ssh_identity_file`), or with `use_gloo=True` by one ssh per process. `use_mpi=True` starts the processes with mpirun, otherwise
    they are started directly (Horovod's gloo mode, with its HOROVOD_* variables).
    `output_filename` writes each rank's output to ``<dir>/rank.<rank>/stdout|stderr`` as well.
    `network_interfaces` pins the ranks' traffic to those NICs. `start_timeout` defaults to
    HOROVOD_START_TIMEOUT, else 120 s (Horovod: 30 s). `disable_cache` has no effect (no checks are cached).

    Elastic (as in Horovod, when `min_num_proc` or `host_discovery_script` is given): the job
    starts `num_proc` workers and goes on while at least `min_num_proc` (default `num_proc`) live;
    a failed worker is replaced on its host, hosts the discovery script adds get workers up to
    `max_num_proc`, and `reset_limit` bounds the resets. HOROVOD_ELASTIC_TIMEOUT (default
    600 s; Horovod's signature has no argument for it) bounds the wait for enough workers. The
    values returned are those of the workers that finished, in their last rank order. See
    `horovod_compat.launch.elastic`.
    """
    if network_interface:
        network_interfaces = network_interface.split(",")
        warnings.warn("network_interface is deprecated, use network_interfaces instead",
                      DeprecationWarning, stacklevel=2)
    for old, new in (("np", "num_proc"), ("min_np", "min_num_proc"), ("max_np", "max_num_proc")):
        value = locals()[old]
        if value is not None:
            warnings.warn(f"{old} is deprecated, use {new} instead", DeprecationWarning, stacklevel=2)
    num_proc = np if np is not None else num_proc
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    if not callable(func):
        raise TypeError(f"horovod.run: func must be callable, got {type(func).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"horovod.run: args must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"horovod.run: kwargs must be a dict, got {type(kwargs).__name__}")
    if isinstance(network_interfaces, str):
        network_interfaces = [network_interfaces]
    elastic = elastic_args(num_proc, min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                           slots=slots, reset_limit=reset_limit, cooldown_range=cooldown_range,
                           host_discovery_script=host_discovery_script)
    job = HorovodJob.create(
        num_proc, hosts=hosts, hostfile=hostfile, use_gloo=use_gloo, use_mpi=use_mpi,
        start_timeout=start_timeout, executable=executable, mpi_args=mpi_args,
        nics=network_interfaces, ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
        output_filename=output_filename, verbose=bool(verbose), elastic=elastic,
    )
    return job.run(job.function_target(func, args, kwargs or {}))
