"""The runtime: everything ``hvd.init()`` creates, owned by one object per process.

``Runtime`` holds the job's topology, the rendezvous store of this init generation, the registry of
process sets (each with its coordinator and transports, see ``process_sets`` and ``negotiation``),
the table of async handles, the timeline session (``timeline.Session``) and the stall inspector.
``hvd.init()`` (``lifecycle``) builds one and makes it *active*; ``hvd.shutdown()`` closes it and
clears the active slot, so ``init -> shutdown -> init`` starts from nothing -- except a PAUSED
env-started timeline, which ``lifecycle`` hands to the next init's runtime so that it goes on in
the same file.

``Runtime.close`` releases in this order, so that no thread ever touches something already gone:

1. the timeline session ends (or pauses: ``Session.on_shutdown``), so no event of the teardown
   below reaches it;
2. the stall inspector stops (it reads the coordinators' tables);
3. every process set's coordinator leaves: peers waiting for this rank raise, this rank's pending
   ops fail with ``HorovodInternalError``, its background thread stops, and only then its
   shared-memory segments are unmapped and its TCP mesh closed (``negotiation.SetState.close``);
4. the process sets' torch groups are destroyed, then the async-handle table is cleared;
5. torch's default group, if ``init`` created it, and with it every group: ``release_groups``
   also drops the references torch keeps to them by accident, so that their gloo threads end
   here, while Python is still whole.
"""
from __future__ import annotations

import itertools
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch.distributed as dist

from .exceptions import NOT_INITIALIZED
from .process_sets import Registry
from .timeline import Session

__all__ = ["Topology", "HandleTable", "Runtime", "active", "current", "activate", "deactivate"]


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job (``hvd.rank()``, ``hvd.local_size()`` ...)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    source: str        # which launcher's environment described the job
    mpi: bool          # started by mpirun (whatever translated its variables)


class HandleTable:
    """The ints ``X_async`` returns, mapped to what ``poll``/``synchronize`` wait on."""

    def __init__(self) -> None:
        self._items: Dict[int, Any] = {}
        self._ids = itertools.count(1)

    def add(self, item: Any) -> int:
        hid = next(self._ids)
        self._items[hid] = item
        return hid

    def get(self, hid: int) -> Any:
        try:
            return self._items[hid]
        except KeyError:
            raise ValueError(f"Handle {hid} was not created or has been cleared.") from None

    def pop(self, hid: int) -> Any:
        try:
            return self._items.pop(hid)
        except KeyError:
            raise ValueError(f"Handle {hid} was not created or has been cleared.") from None

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class Runtime:
    """One init generation of Horovod in this process (see the module docstring)."""

    def __init__(self, topology: Topology, store: Optional[dist.Store], owns_default_pg: bool,
                 generation: int, dynamic_process_sets: bool) -> None:
        self.topology = topology
        self.store = store
        self.owns_default_pg = owns_default_pg
        self.generation = generation
        self.registry = Registry(dynamic_process_sets)
        self.handles = HandleTable()
        self.timeline = Session()  # lifecycle passes on a PAUSED one from the previous init
        self.inspector: Any = None
        self.closed = False

    def control_store(self) -> Optional[dist.Store]:
        """A store shared by the job's ranks for small control data (the stall inspector's posts)."""
        if self.store is not None:
            # this init's own store: its key prefix already belongs to this generation (or, in an
            # elastic job, to the round, which survivors and replacements share whatever their
            # own init counts)
            return dist.PrefixStore("horovod_compat/stall/", self.store)
        if not dist.is_initialized():
            return None
        try:  # the user's own process group: its store, under this generation's prefix
            base = dist.distributed_c10d._get_default_store()
        except Exception:
            return None
        return dist.PrefixStore(f"horovod_compat/stall/{self.generation}/", base)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.timeline.on_shutdown()
        if self.inspector is not None:
            self.inspector.stop()
            self.inspector = None
        self.registry.close()
        self.handles.clear()
        if self.owns_default_pg and dist.is_initialized():
            release_groups()


def release_groups() -> None:
    """Destroy torch's default group and every other group, so that they are gone now.

    Some torch functions take ``group=group.WORLD`` as a default argument, evaluated once when
    their module is imported (``torch.distributed.nn.functional``, which ``torch._dynamo`` imports
    when a program builds its first optimizer, usually after ``hvd.init()``). Such a default keeps
    the group alive after ``destroy_process_group``, and with it the group's gloo worker threads
    until the interpreter exits. A worker that drops the last reference to a finished
    collective's tensor while Python finalizes cannot take the GIL and aborts the process
    ("terminate called without an active exception") after the program succeeded. So defaults
    that are one of the destroyed groups become None again, what they are when the module is
    imported before init (the default group at call time, and no stale group after a re-init).
    Freed here, a group joins its threads with the GIL released (torch's no-GIL destructor).
    """
    groups = {id(g): g for g in dist.distributed_c10d._world.pg_map}
    dist.destroy_process_group()
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torch.distributed" or name.startswith("torch.distributed.")):
            continue
        # type(), not isinstance(): a module's deprecated objects warn when their __class__ is read
        for value in list(vars(module).values()):
            if type(value) is types.FunctionType:
                _forget_in_defaults(value, groups)
            elif issubclass(type(value), type) and value.__module__ == name:
                for attr in list(vars(value).values()):
                    if type(attr) in (staticmethod, classmethod):
                        attr = attr.__func__
                    _forget_in_defaults(attr, groups)


def _forget_in_defaults(fn: Any, groups: Dict[int, Any]) -> None:
    if type(fn) is not types.FunctionType:
        return
    if fn.__defaults__ and any(id(v) in groups for v in fn.__defaults__):
        fn.__defaults__ = tuple(None if id(v) in groups else v for v in fn.__defaults__)
    if fn.__kwdefaults__ and any(id(v) in groups for v in fn.__kwdefaults__.values()):
        fn.__kwdefaults__ = {k: None if id(v) in groups else v for k, v in fn.__kwdefaults__.items()}


_lock = threading.RLock()
_active: Optional[Runtime] = None


def active() -> Optional[Runtime]:
    """The active runtime, or None outside ``init``/``shutdown``."""
    return _active


def current() -> Runtime:
    """The active runtime; Horovod's ``ValueError`` when ``hvd.init()`` has not run."""
    rt = _active
    if rt is None:
        raise ValueError(NOT_INITIALIZED)
    return rt


def activate(rt: Runtime) -> None:
    global _active
    with _lock:
        _active = rt


def deactivate() -> Optional[Runtime]:
    """Clear the active slot; returns the runtime that was active (the caller closes it)."""
    global _active
    with _lock:
        rt, _active = _active, None
    return rt
