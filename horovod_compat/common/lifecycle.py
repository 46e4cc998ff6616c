"""Lifecycle and topology: ``hvd.init``/``shutdown``, ``rank``/``size``..., capability queries.

Where rank and size come from (first match wins):

1. ``torch.distributed`` already initialised by the user: its default group is used as is.
2. horovodrun (gloo mode): ``HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE``; the
   rendezvous is ``MASTER_ADDR/MASTER_PORT`` if set, else ``HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT``.
3. torchrun and our own engine: ``RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK`` with
   ``MASTER_ADDR/MASTER_PORT`` (under torchrun the elastic agent's store is reused).
4. mpirun: ``OMPI_COMM_WORLD_*`` or ``PMI_RANK/PMI_SIZE``.  Without ``MASTER_ADDR``, rank 0 picks its
   address and a free port and sends them to every rank through mpi4py.
5. nothing: a size-1 job.

In a worker of an elastic job (``distributor.worker.is_elastic()``) none of these is read: ``init``
asks the driver for this worker's place in the next rendezvous round (``worker.join_world``) and
joins that round's process group through the job's store, under the round's key prefix.  So a
re-init after a failed collective (``hvd.elastic.run``'s reset) is a re-join, and a replacement
process meets the survivors in the same round: everything ranks must agree on comes from the round
(its store prefix, rank 0's broadcasts), never from this process's own init count.

Re-initialisation (``init -> shutdown -> init``, which Horovod's own test-suite does for every test)
needs care on ``torch.distributed``: gloo's full-mesh connect cannot reuse the keys of a previous
group in the same store.  We keep one rendezvous store per process and give every init generation
its own key prefix, so a re-init costs no new rendezvous and never collides with an old one.

The backend is gloo for CPU tensors and, when CUDA and NCCL are present, ``cpu:gloo,cuda:nccl`` so a
GPU job keeps working for CPU tensors too.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import os
import socket
import threading
from datetime import timedelta
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from distributor import failure_report as _failure_report
from distributor import netif as _netif
from distributor import rank_env as _rank_env
from distributor import worker as _worker
from distributor.elastic.store import RoundStore

from . import runtime, stall
from .exceptions import HorovodInternalError
from .timeline import Session, State
from .process_sets import ProcessSet, global_process_set

__all__ = [
    "init", "shutdown", "is_initialized", "add_process_set", "remove_process_set",
    "get_process_set_ids_and_ranks", "process_set_by_id", "size", "rank", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "sycl_built", "cuda_built", "rocm_built", "start_timeline",
    "stop_timeline", "is_homogeneous",
]


# Process-wide, outliving every init generation: the rendezvous store (re-init reuses it with a
# fresh key prefix) and the generation counter.  Everything an init creates lives in its
# ``runtime.Runtime``.
_lock = threading.RLock()
_elastic_log = logging.getLogger("horovod_compat.elastic")
#: Seconds a worker whose joining of a round failed waits for the driver to name a lost member
#: before it takes the failure for something else (and raises it).
LOST_WAIT_SECONDS = 5.0
#: Seconds a worker may stay inside the set-up of a round that the driver said lost a member
#: (such a round can never form) before it exits, to be replaced (`_leave_a_lost_round`).
LOST_ROUND_EXIT_SECONDS = float(os.environ.get("HOROVOD_COMPAT_LOST_ROUND_EXIT_SECONDS", "15"))
_generation = 0
_base_store: Optional[dist.Store] = None
_base_store_key: Optional[tuple] = None
_malloc_tuned = False
_atexit_registered = False
#: an env-started timeline paused by shutdown(), handed to the next init's runtime
_paused_timeline: Optional[Session] = None
#: elastic jobs: one client of the job's store per process, reused by every round
_elastic_client: Optional[dist.Store] = None
_elastic_client_addr: Optional[tuple] = None
#: Horovod's variables, rewritten to each new round's place when the launcher had set them
_HOROVOD_VARS = {"HOROVOD_RANK": "rank", "HOROVOD_SIZE": "size", "HOROVOD_LOCAL_RANK": "local_rank",
                 "HOROVOD_LOCAL_SIZE": "local_size", "HOROVOD_CROSS_RANK": "cross_rank",
                 "HOROVOD_CROSS_SIZE": "cross_size"}


def _env_int(*names: str, environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    for n in names:
        v = (os.environ if environ is None else environ).get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                pass
    return None


def discover(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """This process's place in the job, read from the launcher's variables in ``environ``
    (default ``os.environ``): horovodrun's, torchrun's (and our engine's), Open MPI's or MPICH's.
    ``source`` says which; ``"none"`` (rank 0 of 1) when no launcher set any."""
    e = os.environ if environ is None else environ

    def num(*names: str) -> Optional[int]:
        return _env_int(*names, environ=e)

    if num("HOROVOD_RANK") is not None and num("HOROVOD_SIZE") is not None:
        size = num("HOROVOD_SIZE")
        return dict(source="horovodrun", rank=num("HOROVOD_RANK"), size=size,
                    local_rank=num("HOROVOD_LOCAL_RANK", "LOCAL_RANK"),
                    local_size=num("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"),
                    cross_rank=num("HOROVOD_CROSS_RANK", "GROUP_RANK", "NODE_RANK"),
                    cross_size=num("HOROVOD_CROSS_SIZE"),
                    addr=e.get("MASTER_ADDR") or e.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
                    port=num("MASTER_PORT", "HOROVOD_GLOO_RENDEZVOUS_PORT"))
    if num("RANK") is not None and num("WORLD_SIZE") is not None:
        local_size = num("LOCAL_WORLD_SIZE")
        size = num("WORLD_SIZE")
        return dict(source="torchrun", rank=num("RANK"), size=size,
                    local_rank=num("LOCAL_RANK"), local_size=local_size,
                    cross_rank=num("GROUP_RANK", "NODE_RANK"),
                    cross_size=num("GROUP_WORLD_SIZE"),
                    addr=e.get("MASTER_ADDR"), port=num("MASTER_PORT"))
    if num("OMPI_COMM_WORLD_SIZE") is not None:
        return dict(source="mpirun", rank=num("OMPI_COMM_WORLD_RANK"),
                    size=num("OMPI_COMM_WORLD_SIZE"),
                    local_rank=num("OMPI_COMM_WORLD_LOCAL_RANK"),
                    local_size=num("OMPI_COMM_WORLD_LOCAL_SIZE"),
                    cross_rank=None, cross_size=None,  # OMPI's NODE_RANK is node-local: exchange
                    addr=e.get("MASTER_ADDR"), port=num("MASTER_PORT"))
    if num("PMI_SIZE") is not None and num("PMI_RANK") is not None:
        return dict(source="mpirun", rank=num("PMI_RANK"), size=num("PMI_SIZE"),
                    local_rank=num("MPI_LOCALRANKID"), local_size=num("MPI_LOCALNRANKS"),
                    cross_rank=None, cross_size=None,
                    addr=e.get("MASTER_ADDR"), port=num("MASTER_PORT"))
    return dict(source="none", rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                cross_size=1, addr=None, port=None)


def _elastic_timeout() -> float:
    """Seconds a worker waits for a round to form (Horovod's ``HOROVOD_ELASTIC_TIMEOUT``)."""
    value = os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "").strip()
    try:
        return float(value) if value else 600.0
    except ValueError:
        raise ValueError(f"HOROVOD_ELASTIC_TIMEOUT={value!r} is not a number of seconds; "
                         "unset it or give e.g. 600") from None


def _join_round() -> tuple:
    """Elastic jobs: this worker's place in the next round, and the round's store.

    The store is ``PrefixStore(world.store_prefix, client)`` over one client of the job's
    ``TCPStore`` per process (the driver hosts the store; membership came over the hub)."""
    global _elastic_client, _elastic_client_addr
    world = _worker.join_world(timeout=_elastic_timeout())
    addr = (world.store_host, world.store_port)
    if _elastic_client is None or _elastic_client_addr != addr:
        timeout = timedelta(seconds=float(os.environ.get("HOROVOD_COMPAT_INIT_TIMEOUT", "300")))
        _elastic_client = dist.TCPStore(world.store_host, world.store_port, is_master=False,
                                        timeout=timeout)
        _elastic_client_addr = addr
    info = dict(source="elastic", rank=world.rank, size=world.size, local_rank=world.local_rank,
                local_size=world.local_size, cross_rank=world.cross_rank,
                cross_size=world.cross_size, addr=world.store_host, port=world.store_port,
                round=world.round)
    for var, field in _HOROVOD_VARS.items():
        if var in os.environ:
            os.environ[var] = str(info[field])
    # PrefixStore puts its own "/" between prefix and key; waits end if a member fails meanwhile
    store = dist.PrefixStore(world.store_prefix.rstrip("/"), _elastic_client)
    return info, RoundStore(store, world.round, lambda: _worker.lost_member(world.round))


def _leave_a_lost_round(round_number: int, connected: threading.Event) -> None:
    """Watch this worker's set-up of round `round_number` (``init_process_group``) from a thread.

    A round that lost a member while it formed can never form, and `RoundStore` ends the store
    waits of its set-up. But gloo's ``connectFullMesh`` also waits on peer sockets, in C++, for the
    group's timeout (minutes), and nothing in Python can interrupt it. A member stuck there never
    re-joins, and the next round waits for every live member of this one. So once the driver has
    named a lost member and the set-up still has not ended `LOST_ROUND_EXIT_SECONDS` later, the
    worker exits; the driver starts a replacement, and the next round forms without it."""
    while not connected.is_set():
        rank = _worker.lost_member(round_number, wait=1.0)
        if rank is None:
            continue
        if connected.wait(LOST_ROUND_EXIT_SECONDS):
            return
        _elastic_log.error(
            "hvd.init(): rank %s of round %s failed while this worker connected to the round, and "
            "the connection did not end within %g s (gloo's connect cannot be interrupted): this "
            "worker exits and the elastic job starts a replacement", rank, round_number,
            LOST_ROUND_EXIT_SECONDS)
        for handler in logging.getLogger().handlers + _elastic_log.handlers:
            handler.flush()
        os._exit(1)


def _forget_failed_init() -> None:
    """Leave torch.distributed as it was before an ``init_process_group`` that raised.

    torch names the default group by a counter that ``init_process_group`` advances before it
    connects, and that only ``destroy_process_group`` sets back to 0. After a failed init this
    worker's next one would name its group "1" and put its keys under "1/" of the round's store,
    while a member that never failed uses "0/": each would wait for keys the other never writes,
    until the group's timeout (the elastic init hang of issue 41: a survivor whose
    ``connectFullMesh`` failed in one round, then a replacement, in the next)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        dist.distributed_c10d._world.group_count = 0


def _mpi_rendezvous(info: Dict[str, Any]) -> None:
    """Under mpirun without MASTER_ADDR: rank 0's address and a free port, sent by MPI_Bcast."""
    from distributor.extras import require

    require("mpi", "hvd.init() under mpirun (without MASTER_ADDR set)")
    from mpi4py import MPI  # imported only here: importing it initialises MPI

    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        all_local = info.get("local_size") == info["size"]
        addr = "127.0.0.1" if all_local else socket.gethostbyname(socket.gethostname())
        payload = (addr, _rank_env.free_port("0.0.0.0"))
    else:
        payload = None
    info["addr"], info["port"] = comm.bcast(payload, root=0)


def _store_for(info: Dict[str, Any]) -> dist.Store:
    """The process-wide rendezvous store (created once, reused by every init generation)."""
    global _base_store, _base_store_key
    key = (info["source"], info["addr"], info["port"], info["rank"], info["size"])
    if _base_store is not None and _base_store_key == key:
        return _base_store
    timeout = timedelta(seconds=float(os.environ.get("HOROVOD_COMPAT_INIT_TIMEOUT", "300")))
    under_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    if ((info["source"] == "torchrun" or under_agent)
            and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        # env:// honours TORCHELASTIC_USE_AGENT_STORE, i.e. reuses torchrun's agent store (which
        # owns MASTER_PORT: under torchrun that is the store, whatever other variables say).
        store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    else:
        store = _loopback_store(info, timeout)
        if store is None:
            url = f"tcp://{info['addr']}:{info['port']}?rank={info['rank']}&world_size={info['size']}"
            store, _, _ = next(dist.rendezvous(url, timeout=timeout))
    _base_store, _base_store_key = store, key
    return store


def _loopback_store(info: Dict[str, Any], timeout: timedelta) -> Optional[dist.Store]:
    """On rank 0, when the rendezvous address is a loopback address (every rank runs on this
    host), the store ``tcp://`` would create, listening on loopback only: torch's listens on
    every interface. None otherwise (or when the port cannot be bound: torch then says why)."""
    if info["rank"] != 0:
        return None
    try:
        listener = _netif.loopback_listener(str(info["addr"]), int(info["port"]))
    except OSError:
        return None
    if listener is None:
        return None
    return dist.TCPStore(str(info["addr"]), int(info["port"]), info["size"], True, timeout,
                         multi_tenant=True, master_listen_fd=listener.detach())


def _tune_malloc() -> None:
    """Keep freed blocks up to 32 MiB in glibc's heap so out-of-place collectives do not page-fault.

    A fresh multi-MB output buffer costs page faults on every ``hvd.allreduce`` when glibc serves it
    with mmap; raising the mmap/trim thresholds makes it reuse freed blocks (larger buffers are
    recycled by ``collectives._OutputPool``).  Opt out with ``HOROVOD_COMPAT_MALLOC_TUNING=0``.
    """
    global _malloc_tuned
    if _malloc_tuned or os.environ.get("HOROVOD_COMPAT_MALLOC_TUNING", "1") == "0":
        return
    _malloc_tuned = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (32 MiB is glibc's maximum)
        libc.mallopt(-1, 1 << 30)   # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _backend_name() -> str:
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _fill_topology(info: Dict[str, Any], store: Optional[dist.Store], prefix: str) -> None:
    """Complete local/cross rank and size; exchange hostnames through the store if the launcher
    did not say."""
    if None not in (info["local_rank"], info["local_size"], info["cross_rank"], info["cross_size"]):
        return
    if info["local_rank"] is not None and info["local_size"] and info["cross_rank"] is not None:
        info["cross_size"] = max(1, info["size"] // info["local_size"])
        return
    if store is None or info["size"] == 1:
        info.update(local_rank=0, local_size=1, cross_rank=0, cross_size=1)
        return
    host = socket.gethostname()
    store.set(f"{prefix}host/{info['rank']}", host)
    hosts = [store.get(f"{prefix}host/{r}").decode() for r in range(info["size"])]
    mine = [r for r, h in enumerate(hosts) if h == host]
    order = list(dict.fromkeys(hosts))
    info["local_rank"], info["local_size"] = mine.index(info["rank"]), len(mine)
    info["cross_rank"], info["cross_size"] = order.index(host), len(order)


def _resolve_comm(comm: Any, world_size: int) -> Optional[List[int]]:
    """``init(comm=...)``: a list of global ranks, or an mpi4py communicator."""
    if comm is None:
        return None
    if isinstance(comm, (list, tuple)):
        ranks = sorted(int(r) for r in comm)
    else:  # mpi4py communicator: translate its ranks to COMM_WORLD ranks
        from mpi4py import MPI

        ranks = sorted(comm.Get_group().Translate_ranks(list(range(comm.Get_size())),
                                                        MPI.COMM_WORLD.Get_group()))
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= world_size:
        raise ValueError(f"init(comm=...): invalid ranks {ranks} for a job of size {world_size}")
    return ranks


def init(comm: Any = None, process_sets: Union[None, str, Sequence[ProcessSet]] = None) -> None:
    """Initialise Horovod: join the job's process group and register process sets.

    Safe to call again while initialised (a no-op).  ``comm`` restricts the job to a list of global
    ranks (or an mpi4py communicator's ranks); ``process_sets`` is a list of ``ProcessSet`` to
    register now, or ``"dynamic"`` to allow ``add_process_set``/``remove_process_set`` later (as does
    ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

    In an elastic job, a round that loses a member while this worker joins it cannot form: the
    worker joins the next one instead (the driver names the member it lost), so a worker's first
    ``hvd.init()``, outside ``hvd.elastic.run``, survives a peer's death too.
    """
    while True:
        try:
            return _init(comm, process_sets)
        except HorovodInternalError as exc:
            if not _worker.is_elastic() or dist.is_initialized() or _worker.lost_member(
                    _worker.last_round(), wait=LOST_WAIT_SECONDS) is None:
                raise
            _elastic_log.warning("%s; joining the next round", exc)


def _init(comm: Any, process_sets: Union[None, str, Sequence[ProcessSet]]) -> None:
    global _generation, _atexit_registered
    with _lock:
        if runtime.active() is not None:
            return
        _tune_malloc()
        # the driver names the rank whose failure came first, and the job ends soon after it
        _failure_report.install_excepthook()
        elastic = not dist.is_initialized() and _worker.is_elastic()
        info, store = _join_round() if elastic else (discover(), None)
        owns = False
        prefix = f"horovod_compat/{_generation}/"
        if dist.is_available() and dist.is_initialized():
            info.update(rank=dist.get_rank(), size=dist.get_world_size())
            if info["source"] == "none":
                info["source"] = "torch.distributed"
                info.update(local_rank=None, local_size=None, cross_rank=None, cross_size=None)
        else:
            if store is not None:
                pass  # elastic: the round's store (_join_round)
            elif info["size"] == 1 and not (info["addr"] and info["port"]):
                store = dist.HashStore()
            else:
                if info["source"] == "mpirun" and (not info["addr"] or not info["port"]):
                    _mpi_rendezvous(info)
                if not info["addr"] or not info["port"]:
                    raise ValueError(
                        f"hvd.init(): a {info['size']}-rank job ({info['source']}) needs a rendezvous "
                        "address: set MASTER_ADDR and MASTER_PORT")
                store = dist.PrefixStore(prefix, _store_for(info))
            seconds = float(os.environ.get("HOROVOD_COMPAT_OP_TIMEOUT", "1800"))
            connected = threading.Event()
            if elastic:
                threading.Thread(target=_leave_a_lost_round, args=(info["round"], connected),
                                 name="hvd-round-watch", daemon=True).start()
            try:
                dist.init_process_group(_backend_name(), store=store, rank=info["rank"],
                                        world_size=info["size"],
                                        timeout=timedelta(seconds=min(seconds, _elastic_timeout())
                                                          if elastic else seconds))
            except Exception as exc:
                if not elastic:
                    raise
                _forget_failed_init()
                # a member of the round died before it joined: hvd.elastic.run re-joins
                raise HorovodInternalError(f"hvd.init(): joining round {info['round']} of the elastic "
                                           f"job failed: {exc}") from exc
            finally:
                connected.set()  # (ends the round's watcher: the set-up is over, one way or the other)
            owns = True
        _generation += 1
        dynamic = process_sets == "dynamic" or os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1"
        rt = None
        try:
            _fill_topology(info, store, "topo/")
            ranks = _resolve_comm(comm, info["size"])
            initial = [] if process_sets in (None, "dynamic") else list(process_sets)
            # started by mpirun even when a launcher (HorovodRunner's engine) translated MPI's
            # variables into torchrun's
            mpi = info["source"] == "mpirun" or _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") is not None
            rt = runtime.Runtime(None, store, owns, _generation, dynamic)  # type: ignore[arg-type]
            rt.registry.setup(ranks, initial)
            gps = global_process_set
            rt.topology = runtime.Topology(
                rank=gps.rank() if ranks is not None else info["rank"],
                size=gps.size() if ranks is not None else info["size"],
                local_rank=info["local_rank"], local_size=info["local_size"],
                cross_rank=info["cross_rank"], cross_size=info["cross_size"],
                source=info["source"], mpi=mpi)
        except BaseException as exc:
            if rt is not None:
                rt.close()
            elif owns:
                dist.destroy_process_group()
            if elastic and isinstance(exc, (RuntimeError, OSError)) and not isinstance(exc, HorovodInternalError):
                # a member of the round died while the process sets were set up: re-join
                raise HorovodInternalError(f"hvd.init(): setting up round {info['round']} of the "
                                           f"elastic job failed: {exc}") from exc
            raise
        runtime.activate(rt)
        if not _atexit_registered:
            # As Horovod does: leave the job before the interpreter finalizes. A gloo worker
            # thread that still holds a tensor when Python is torn down aborts the process
            # ("terminate called without an active exception") after the script succeeded.
            atexit.register(shutdown)
            _atexit_registered = True
        rt.inspector = stall.start(rt.control_store(), dist.get_rank(), dist.get_world_size(),
                                   rt.registry.coordinators)
        global _paused_timeline
        if _paused_timeline is not None:
            rt.timeline, _paused_timeline = _paused_timeline, None
        rt.timeline.on_init(dist.get_rank(), dist.get_world_size())


def shutdown() -> None:
    """Leave the job; ``init()`` may be called again afterwards.

    Order: ``runtime.Runtime.close`` (timeline session, stall inspector, coordinators and their
    transports, process groups).  An env-started timeline only pauses: it is kept for the next init.
    """
    global _paused_timeline
    with _lock:
        rt = runtime.deactivate()
        if rt is None:
            return
        rt.close()
        if rt.timeline.state is State.PAUSED:
            _paused_timeline = rt.timeline


def control_store() -> Optional[dist.Store]:
    """A store shared by the job's ranks for small control data (the stall inspector's posts)."""
    return runtime.current().control_store()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return runtime.active() is not None


def _check() -> "runtime.Topology":
    return runtime.current().topology


def size() -> int:
    """Number of ranks in the job (of the ``init(comm=...)`` set, if given)."""
    return _check().size


def rank() -> int:
    """This process's rank in the job."""
    return _check().rank


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return _check().local_rank


def local_size() -> int:
    """Number of ranks on this host."""
    return _check().local_size


def cross_rank() -> int:
    """Index of this host among the job's hosts (rank among ranks with the same local rank)."""
    return _check().cross_rank


def cross_size() -> int:
    """Number of hosts in the job."""
    return _check().cross_size


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    s = _check()
    return s.local_size * s.cross_size == s.size


# ----------------------------------------------------------------------------- capabilities

def mpi_built() -> bool:
    """True when MPI is usable from Python (mpi4py importable without initialising MPI)."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """True when this job was launched by mpirun and MPI is available."""
    rt = runtime.active()
    return rt is not None and rt.topology.mpi and mpi_built()


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (False when MPI is not in use)."""
    _check()
    if not mpi_enabled():
        return False
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def gloo_built() -> bool:
    """Gloo is always available through torch.distributed."""
    return dist.is_available() and dist.is_gloo_available()


def gloo_enabled() -> bool:
    """Gloo carries the collectives of CPU tensors in every job (also mpirun-launched ones)."""
    return gloo_built()


def nccl_built() -> int:
    """NCCL version code (e.g. 21803 for 2.18.3) when torch has CUDA and NCCL, else 0."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return 0
    try:
        v = torch.cuda.nccl.version()
        major, minor, patch = (v + (0, 0, 0))[:3] if isinstance(v, tuple) else (v // 1000, v // 100 % 10, v % 100)
        return int(major) * 10000 + int(minor) * 100 + int(patch)
    except Exception:
        return 0


def ddl_built() -> bool:
    """IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """oneCCL is not supported."""
    return False


def sycl_built() -> bool:
    """SYCL (Intel GPUs) is not supported.  Intel's Horovod fork added this query; scripts written
    for that fork call it."""
    return False


def cuda_built() -> bool:
    """True when torch was built with CUDA."""
    return torch.backends.cuda.is_built() and torch.version.cuda is not None


def rocm_built() -> bool:
    """True when torch was built with ROCm."""
    return getattr(torch.version, "hip", None) is not None


# ----------------------------------------------------------------------------- timeline

def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a Chrome-trace timeline of every collective into ``file_path``
    (``HOROVOD_TIMELINE=DYNAMIC`` must be set, as in Horovod)."""
    _check()
    runtime.current().timeline.start(file_path, mark_cycles, dist.get_rank(), dist.get_world_size())


def stop_timeline() -> None:
    """Stop a timeline started by ``start_timeline`` (a no-op when none is recording)."""
    _check()
    runtime.current().timeline.stop()


# ----------------------------------------------------------------------------- process sets

def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a new process set (collective: every rank of the job calls it, same order).

    Returns the registered ``ProcessSet``; a set with the same ranks as a registered one is a
    ``ValueError``."""
    return runtime.current().registry.add(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective).  Returns True if it was registered."""
    return runtime.current().registry.remove(process_set)


def process_set_by_id(ps_id: int) -> ProcessSet:
    """The registered set with this id (ValueError if none)."""
    return runtime.current().registry.by_id(ps_id)


def get_process_set_ids_and_ranks() -> Dict[int, List[int]]:
    """``{id: ranks}`` of every registered set (as Horovod's helper of the same name)."""
    return runtime.current().registry.ids_and_ranks()
