"""``TF_CONFIG`` for ``tf.distribute.MultiWorkerMirroredStrategy`` from what our launchers give a rank.

MWMS needs, before the strategy is created, every worker's ``host:port`` (where its gRPC server
will listen) and the worker's own index, in the ``TF_CONFIG`` environment variable::

    {"cluster": {"worker": ["10.0.0.1:12345", "10.0.0.2:12345"]},
     "task": {"type": "worker", "index": 0}}

Two ways to get it, both for the ranks that ``horovodrun``, ``horovod.run``, ``HorovodRunner``,
``TorchDistributor`` / ``distributor.run_function`` or ``torchrun`` start (one MWMS worker per
rank, the worker index is the rank):

* `agree_tf_config` -- the rank has called ``hvd.init()`` (any binding: ``horovod.tensorflow``,
  ``horovod.torch``, ...): each rank takes a free port, the ranks exchange ``host:port`` with one
  ``allgather_object``, and ``TF_CONFIG`` is exported.  Nothing to configure, works across hosts;
  the launcher and ``hvd.init()`` stay until you drop them.
* `tf_config_for` -- no runtime needed: built from the rank (``HOROVOD_RANK`` / ``RANK``, ...)
  and a list of worker hosts that you know in advance, with fixed ports from ``base_port``.

Neither runs a TensorFlow op (importing TensorFlow, which this package does, is fine), so
``TF_CONFIG`` is in place before the strategy configures TensorFlow's collectives -- MWMS must be
created before the program runs other TensorFlow ops.  See migration_guide/tensorflow.md.
"""
from __future__ import annotations

import json
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from horovod_compat.common.lifecycle import discover

__all__ = ["DEFAULT_BASE_PORT", "rank_and_size", "tf_config_for", "agree_tf_config", "export"]

#: First port of `tf_config_for`'s fixed ports (worker k on a host gets base_port + k).
DEFAULT_BASE_PORT = 12345

def rank_and_size(environ: Mapping[str, str] = os.environ) -> Tuple[int, int]:
    """This process's (rank, size) from the launcher's variables (the runtime's reader,
    ``horovod_compat.common.lifecycle.discover``: horovodrun's, torchrun's, Open MPI's, MPICH's)."""
    info = discover(environ)
    if info["source"] == "none":
        raise RuntimeError("no launcher variables found (HOROVOD_RANK/HOROVOD_SIZE, RANK/WORLD_SIZE, "
                           "OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE): start this process with "
                           "horovodrun, torchrun, TorchDistributor or mpirun, or pass rank=")
    return int(info["rank"]), int(info["size"])


def _worker_addresses(hosts: Sequence[str], base_port: int) -> List[str]:
    """One ``host:port`` per entry of `hosts`; an entry without a port gets ``base_port + k``,
    k counting the earlier port-less entries of the same host (two workers on one host differ)."""
    seen: Dict[str, int] = {}
    out = []
    for entry in hosts:
        entry = str(entry).strip()
        host, sep, port = entry.rpartition(":")
        if sep and port.isdigit() and not host.endswith(":"):  # "host:port"
            out.append(entry)
            continue
        k = seen.get(entry, 0)
        seen[entry] = k + 1
        out.append(f"{entry}:{base_port + k}")
    return out


def tf_config_for(rank: Optional[int] = None, hosts: Optional[Sequence[str]] = None,
                  base_port: int = DEFAULT_BASE_PORT, task_type: str = "worker",
                  environ: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """The ``TF_CONFIG`` dict of worker `rank` in a job of one MWMS worker per rank.

    `rank`: default, the launcher's (`rank_and_size`).  `hosts`: one entry per worker in rank
    order, ``"host"`` or ``"host:port"`` (default: ``127.0.0.1`` for every rank of the launcher's
    size -- all workers on this machine); a port-less entry gets ``base_port`` + how many
    port-less entries of the same host come before it, so ``["a", "a", "b", "b"]`` gives
    ``a:12345, a:12346, b:12345, b:12346``.  The ports must be free on their hosts."""
    if rank is None or hosts is None:
        env_rank, env_size = rank_and_size(environ)
        rank = env_rank if rank is None else rank
        hosts = ["127.0.0.1"] * env_size if hosts is None else hosts
    workers = _worker_addresses(hosts, base_port)
    if not 0 <= int(rank) < len(workers):
        raise ValueError(f"rank {rank} is not one of the {len(workers)} workers {workers}")
    return {"cluster": {task_type: workers}, "task": {"type": task_type, "index": int(rank)}}


def _reachable_address(environ: Mapping[str, str]) -> str:
    """The address other hosts reach this one at: the route toward the rendezvous host."""
    master = environ.get("MASTER_ADDR") or environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    if master:
        try:
            from distributor.netif import address_toward

            address = address_toward(master)
            if not address.startswith("127."):
                return address
        except (ImportError, OSError):
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def agree_tf_config(host: Optional[str] = None, port: int = 0, task_type: str = "worker",
                    export_env: bool = True, process_set: Any = None) -> Dict[str, Any]:
    """After ``hvd.init()``: agree every worker's ``host:port`` across the ranks, export
    ``TF_CONFIG`` (unless ``export_env=False``) and return it.  Worker index = Horovod rank.

    `host`: the address the others reach this rank at.  Default: ``127.0.0.1`` when every rank
    runs on this host (the ranks compare ``socket.gethostname()``), else this host's address on
    the route toward the rendezvous host (``MASTER_ADDR``), as the launcher's own traffic goes.
    `port`: 0 (default) takes a port that is free now on every interface (MWMS's gRPC server binds
    them all); it is held during the exchange and released before this returns, so create the
    strategy right after (another process could take it in between: rare, and MWMS
    then fails at start-up with "address in use" -- run again).  Every rank must call this (it is
    a collective).  `process_set`: Horovod's (default: all ranks)."""
    from horovod_compat.common import objects
    from horovod_compat.common.process_sets import global_process_set

    process_set = global_process_set if process_set is None else process_set
    address = host or _reachable_address(os.environ)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # held while the ranks exchange ports, so two ranks of one host never announce the same
        probe.bind(("", int(port)))
        mine = (socket.gethostname(), address, probe.getsockname()[1])
        everyone = objects.allgather_object(mine, name="horovod_compat.tf_config",
                                            process_set=process_set)
    if host is None and len({name for name, _, _ in everyone}) == 1:
        everyone = [(name, "127.0.0.1", p) for name, _, p in everyone]  # one host: loopback
    config = {"cluster": {task_type: [f"{h}:{p}" for _, h, p in everyone]},
              "task": {"type": task_type, "index": int(process_set.rank())}}
    if export_env:
        export(config)
    return config


def export(config: Mapping[str, Any]) -> str:
    """Put `config` into ``os.environ["TF_CONFIG"]`` (JSON) and return the JSON."""
    text = json.dumps(config)
    os.environ["TF_CONFIG"] = text
    return text
