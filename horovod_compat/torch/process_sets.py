"""Process sets: collectives over a subset of the job's ranks.

A ``ProcessSet`` maps onto two ``torch.distributed`` groups over the same ranks:

- the *data* group carries the tensors; ``torch_group(process_set)`` returns it so code that wants
  raw ``torch.distributed`` speed (``DistributedOptimizer``'s bucketed reductions) can use it directly;
- the *control* group (always gloo, CPU) carries the tiny negotiation messages of
  ``horovod_compat.torch.negotiation``, so they never queue behind a large transfer.

The global process set (id 0) spans every rank of the job (or the ``init(comm=[...])`` ranks); its
data group is torch's default group.  Sets passed to ``init(process_sets=[...])`` get ids 1, 2, ...
in order; with dynamic process sets enabled (``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or
``init(process_sets="dynamic")``) ``add_process_set`` / ``remove_process_set`` may be called at any
time -- collectively, by every rank of the job, in the same order, like ``torch.distributed.new_group``.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Union

import torch.distributed as dist

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "torch_group", "get_process_set_ids_and_ranks", "process_set_by_id"]

_lock = threading.RLock()


class ProcessSet:
    """A sorted set of global ranks that runs collectives together.

    ``ProcessSet([0, 2])`` or ``ProcessSet(mpi4py_comm)``.  Before registration (``init`` or
    ``add_process_set``) ``process_set_id`` is None and ``rank()``/``size()`` return None.
    """

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm: Any = None
        if isinstance(ranks_or_comm, (list, tuple, range, set, frozenset)):
            self.ranks: List[int] = sorted(int(r) for r in ranks_or_comm)
        else:
            self.mpi_comm = ranks_or_comm
            from mpi4py import MPI

            self.ranks = sorted(ranks_or_comm.Get_group().Translate_ranks(
                list(range(ranks_or_comm.Get_size())), MPI.COMM_WORLD.Get_group()))
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ProcessSet ranks must be distinct: {self.ranks}")
        # Runtime state, filled at registration.
        self._pg: Any = None            # data group (torch ProcessGroup) or None on non-members
        self._ctl: Any = None           # control group (gloo)
        self._my_index: int = -1        # this process's index in ``ranks`` (-1 if not included)
        self.negotiation: Any = None    # negotiation.SetState

    # -- Horovod's public methods -------------------------------------------------------------
    def _invalidate(self) -> None:
        if self.negotiation is not None:
            self.negotiation.close()
        self.process_set_id = None
        self._pg = self._ctl = None
        self._my_index = -1
        self.negotiation = None

    def size(self) -> Optional[int]:
        """Number of ranks in the set (None before registration)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> Optional[int]:
        """This process's rank inside the set; -1 if not included, None before registration."""
        return None if self.process_set_id is None else self._my_index

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set (None before registration)."""
        return None if self.process_set_id is None else self._my_index >= 0

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """The job-wide set; its ranks are known only after ``init``."""

    def __init__(self) -> None:
        super().__init__([])
        self.process_set_id = None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id=0, ranks={self.ranks or 'all'})"


global_process_set: ProcessSet = _GlobalProcessSet()
_sets: Dict[int, ProcessSet] = {}
_next_id = 1
_dynamic = False


def _register(ps: ProcessSet, ps_id: int, world_pg: bool = False) -> None:
    """Create the torch groups of ``ps`` (collective over the whole job) and give it ``ps_id``."""
    from . import negotiation

    me = dist.get_rank()
    world = dist.get_world_size()
    bad = [r for r in ps.ranks if r < 0 or r >= world]
    if bad:
        raise ValueError(f"Process set ranks {bad} are outside the job (size {world})")
    if world_pg:
        pg = dist.group.WORLD
    else:
        pg = dist.new_group(ps.ranks)
    ctl = dist.new_group(ps.ranks, backend="gloo")
    ps._my_index = ps.ranks.index(me) if me in ps.ranks else -1
    ps._pg = pg if ps._my_index >= 0 else None
    ps._ctl = ctl if ps._my_index >= 0 else None
    ps.process_set_id = ps_id
    ps.negotiation = negotiation.SetState(ps) if ps._my_index >= 0 else None
    _sets[ps_id] = ps


def _setup(comm_ranks: Optional[List[int]], initial: Sequence[ProcessSet], dynamic: bool) -> None:
    """Called by ``init``: register the global set and the initial sets."""
    global _next_id, _dynamic
    with _lock:
        _sets.clear()
        _next_id = 1
        _dynamic = dynamic
        world = dist.get_world_size()
        gps = global_process_set
        if comm_ranks is None or comm_ranks == list(range(world)):
            gps.ranks = list(range(world))
            _register(gps, 0, world_pg=True)
        else:
            gps.ranks = list(comm_ranks)
            _register(gps, 0)
            if gps._my_index < 0:
                raise ValueError(f"hvd.init(comm={comm_ranks}): rank {dist.get_rank()} is not part "
                                 "of comm")
        seen = {tuple(gps.ranks)}
        for ps in initial:
            if not isinstance(ps, ProcessSet):
                ps = ProcessSet(ps)
            if tuple(ps.ranks) in seen:
                raise ValueError(f"Duplicate process set: {ps.ranks}")
            seen.add(tuple(ps.ranks))
            _register(ps, _next_id)
            _next_id += 1


def _teardown() -> None:
    """Called by ``shutdown``: forget every set (their groups die with the default group)."""
    global _dynamic
    with _lock:
        for ps_id, ps in list(_sets.items()):
            if ps_id != 0 and ps._pg is not None and dist.is_initialized():
                try:
                    dist.destroy_process_group(ps._pg)
                except Exception:
                    pass
            ps._invalidate()
        _sets.clear()
        global_process_set.ranks = []
        _dynamic = False


def _require_dynamic(what: str) -> None:
    from . import lifecycle

    lifecycle._check()
    if not _dynamic:
        raise ValueError(f"{what} requires dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 "
                         "or call hvd.init(process_sets='dynamic')")


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a new process set (collective: every rank of the job calls it, same order).

    Returns the registered ``ProcessSet``; a set with the same ranks as a registered one is a
    ``ValueError``.
    """
    global _next_id
    _require_dynamic("add_process_set")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    with _lock:
        if ps.process_set_id is not None:
            raise ValueError(f"{ps} is already registered")
        for other in _sets.values():
            if other.ranks == ps.ranks:
                raise ValueError(f"A process set with ranks {ps.ranks} already exists "
                                 f"(id {other.process_set_id})")
        _register(ps, _next_id)
        _next_id += 1
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective).  Returns True if it was registered."""
    _require_dynamic("remove_process_set")
    with _lock:
        ps_id = process_set.process_set_id
        if ps_id == 0 or process_set is global_process_set:
            raise ValueError("The global process set cannot be removed")
        if ps_id is None or _sets.get(ps_id) is not process_set:
            return False
        del _sets[ps_id]
        pg = process_set._pg
        process_set._invalidate()
        dist.barrier()  # every rank stops using the set before its groups go away
        if pg is not None:
            try:
                dist.destroy_process_group(pg)
            except Exception:
                pass
    return True


def process_set_by_id(ps_id: int) -> ProcessSet:
    """The registered set with this id (ValueError if none)."""
    try:
        return _sets[ps_id]
    except KeyError:
        raise ValueError(f"No process set with id {ps_id}") from None


def get_process_set_ids_and_ranks() -> Dict[int, List[int]]:
    """``{id: ranks}`` of every registered set (as Horovod's helper of the same name)."""
    from . import lifecycle

    lifecycle._check()
    return {i: list(ps.ranks) for i, ps in sorted(_sets.items())}


def require_member(process_set: Optional[ProcessSet]) -> ProcessSet:
    """``process_set`` (None: the global set), checked to be registered and to include this rank."""
    torch_group(process_set)
    return global_process_set if process_set is None else process_set


def torch_group(process_set: ProcessSet = global_process_set) -> dist.ProcessGroup:
    """The ``torch.distributed`` group carrying ``process_set``'s tensors.

    Use it to run native ``torch.distributed`` collectives over exactly the set's ranks (ranks in
    ``torch.distributed`` calls stay global).  Raises ValueError before ``init``, for an
    unregistered set, or on a rank that is not part of the set.
    """
    from . import lifecycle

    lifecycle._check()
    if process_set is None:
        process_set = global_process_set
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered (hvd.init / hvd.add_process_set)")
    if process_set._pg is None:
        raise ValueError(f"Rank {dist.get_rank()} is not part of {process_set}")
    return process_set._pg
