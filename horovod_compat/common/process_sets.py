"""Process sets: collectives over a subset of the job's ranks, and the registry the runtime owns.

A ``ProcessSet`` maps onto two ``torch.distributed`` groups over the same ranks:

- the *data* group carries the tensors (``torch_group(process_set)`` returns it);
- the *control* group (always gloo, CPU) carries the coordinator's negotiation messages when the
  set's ranks are on several hosts (on one host they go through shared memory).

Each registered set on each member rank has a coordinator (``negotiation.SetState``), which owns the
set's transports.  The global process set (id 0) spans every rank of the job (or the
``init(comm=[...])`` ranks); its data group is torch's default group.  Sets passed to
``init(process_sets=[...])`` get ids 1, 2, ... in order; with dynamic process sets enabled
(``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or ``init(process_sets="dynamic")``) ``hvd.add_process_set`` /
``hvd.remove_process_set`` may be called at any time -- collectively, by every rank of the job, in
the same order, like ``torch.distributed.new_group``.

``Registry`` holds the registered sets of one init generation; the runtime (``runtime.Runtime``)
owns it, and ``close()`` releases every set's coordinator and groups.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Union

import torch.distributed as dist

from .exceptions import NOT_INITIALIZED
from .negotiation import SetState

__all__ = ["ProcessSet", "global_process_set", "torch_group"]  # Registry, require_member: internal


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
            from mpi4py import MPI  # only for sets built from a communicator

            self.ranks = sorted(ranks_or_comm.Get_group().Translate_ranks(
                list(range(ranks_or_comm.Get_size())), MPI.COMM_WORLD.Get_group()))
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ProcessSet ranks must be distinct: {self.ranks}")
        # filled at registration
        self._pg: Any = None            # data group (torch ProcessGroup) or None on non-members
        self._ctl: Any = None           # control group (gloo)
        self._my_index: int = -1        # this process's index in ``ranks`` (-1 if not included)
        self.negotiation: Optional[SetState] = None  # this rank's coordinator for the set

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

    def _release(self) -> None:
        """Close the coordinator and forget the registration (the set may be registered again)."""
        if self.negotiation is not None:
            self.negotiation.close()
        self.process_set_id = None
        self._pg = self._ctl = None
        self._my_index = -1
        self.negotiation = None


class _GlobalProcessSet(ProcessSet):
    """The job-wide set; its ranks are known only after ``init``."""

    def __init__(self) -> None:
        super().__init__([])

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id=0, ranks={self.ranks or 'all'})"


#: Horovod's module-level object (``hvd.global_process_set``); registered by every ``init``.
global_process_set: ProcessSet = _GlobalProcessSet()


class Registry:
    """The registered process sets of one init generation, by id."""

    def __init__(self, dynamic: bool) -> None:
        self.dynamic = dynamic
        self.sets: Dict[int, ProcessSet] = {}
        self.next_id = 1
        self.lock = threading.RLock()

    def _register(self, ps: ProcessSet, ps_id: int, world_pg: bool = False) -> None:
        """Create the torch groups and the coordinator of ``ps`` (collective over the whole job)."""
        me, world = dist.get_rank(), dist.get_world_size()
        bad = [r for r in ps.ranks if r < 0 or r >= world]
        if bad:
            raise ValueError(f"Process set ranks {bad} are outside the job (size {world})")
        pg = dist.group.WORLD if world_pg else dist.new_group(ps.ranks)
        ctl = dist.new_group(ps.ranks, backend="gloo")
        ps._my_index = ps.ranks.index(me) if me in ps.ranks else -1
        ps._pg = pg if ps._my_index >= 0 else None
        ps._ctl = ctl if ps._my_index >= 0 else None
        ps.process_set_id = ps_id
        ps.negotiation = (SetState(ps_id, ps.ranks, ps._my_index, pg, ctl)
                          if ps._my_index >= 0 else None)
        self.sets[ps_id] = ps

    def setup(self, comm_ranks: Optional[List[int]], initial: Sequence[ProcessSet]) -> None:
        """Register the global set and the initial sets (``init``)."""
        with self.lock:
            world = dist.get_world_size()
            gps = global_process_set
            if comm_ranks is None or comm_ranks == list(range(world)):
                gps.ranks = list(range(world))
                self._register(gps, 0, world_pg=True)
            else:
                gps.ranks = list(comm_ranks)
                self._register(gps, 0)
                if gps._my_index < 0:
                    raise ValueError(f"hvd.init(comm={comm_ranks}): rank {dist.get_rank()} is not "
                                     "part of comm")
            seen = {tuple(gps.ranks)}
            for ps in initial:
                if not isinstance(ps, ProcessSet):
                    ps = ProcessSet(ps)
                if tuple(ps.ranks) in seen:
                    raise ValueError(f"Duplicate process set: {ps.ranks}")
                seen.add(tuple(ps.ranks))
                self._register(ps, self.next_id)
                self.next_id += 1

    def coordinators(self) -> List[SetState]:
        """This rank's coordinators (sets it belongs to)."""
        return [ps.negotiation for ps in list(self.sets.values()) if ps.negotiation is not None]

    def _require_dynamic(self, what: str) -> None:
        if not self.dynamic:
            raise ValueError(f"{what} requires dynamic process sets: set "
                             "HOROVOD_DYNAMIC_PROCESS_SETS=1 or call hvd.init(process_sets='dynamic')")

    def add(self, process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
        self._require_dynamic("add_process_set")
        ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
        with self.lock:
            if ps.process_set_id is not None:
                raise ValueError(f"{ps} is already registered")
            for other in self.sets.values():
                if other.ranks == ps.ranks:
                    raise ValueError(f"A process set with ranks {ps.ranks} already exists "
                                     f"(id {other.process_set_id})")
            self._register(ps, self.next_id)
            self.next_id += 1
        return ps

    def remove(self, process_set: ProcessSet) -> bool:
        self._require_dynamic("remove_process_set")
        with self.lock:
            ps_id = process_set.process_set_id
            if ps_id == 0 or process_set is global_process_set:
                raise ValueError("The global process set cannot be removed")
            if ps_id is None or self.sets.get(ps_id) is not process_set:
                return False
            del self.sets[ps_id]
            pg = process_set._pg
            process_set._release()
            # every rank stops using the set before its groups go away
            if global_process_set.negotiation is not None:
                global_process_set.negotiation.barrier()
            if pg is not None:
                try:
                    dist.destroy_process_group(pg)
                except Exception:
                    pass
        return True

    def by_id(self, ps_id: int) -> ProcessSet:
        try:
            return self.sets[ps_id]
        except KeyError:
            raise ValueError(f"No process set with id {ps_id}") from None

    def ids_and_ranks(self) -> Dict[int, List[int]]:
        return {i: list(ps.ranks) for i, ps in sorted(self.sets.items())}

    def close(self) -> None:
        """Release every set: coordinators first (``SetState.close``), then the subsets' groups
        (the global set's dies with the default group)."""
        with self.lock:
            for ps_id, ps in sorted(self.sets.items(), reverse=True):
                pg = ps._pg
                ps._release()
                if ps_id != 0 and pg is not None and dist.is_initialized():
                    try:
                        dist.destroy_process_group(pg)
                    except Exception:
                        pass
            self.sets.clear()
            global_process_set.ranks = []


def require_member(process_set: Optional[ProcessSet]) -> ProcessSet:
    """``process_set`` (None: the global set), checked to be registered and to include this rank."""
    ps = global_process_set if process_set is None else process_set
    if ps.process_set_id is None:
        if ps is global_process_set:
            raise ValueError(NOT_INITIALIZED)
        raise ValueError(f"{ps} is not registered (hvd.init / hvd.add_process_set)")
    if ps._pg is None:
        raise ValueError(f"Rank {dist.get_rank()} is not part of {ps}")
    return ps


def torch_group(process_set: ProcessSet = global_process_set) -> dist.ProcessGroup:
    """The ``torch.distributed`` group carrying ``process_set``'s tensors.

    Use it to run native ``torch.distributed`` collectives over exactly the set's ranks (ranks in
    ``torch.distributed`` calls stay global); wait for this rank's outstanding hvd ops on the set
    first, since those run on the same group.  Raises ValueError before ``init``, for an
    unregistered set, or on a rank that is not part of the set.
    """
    return require_member(process_set)._pg
