"""Host-aware allreduce: for a process set across hosts with several of its ranks on each host.

A flat ring over every rank sends each host's share of the data over its link more than once
(2 hosts x 2 ranks: 1.5x the bytes a host must move, ``benchmarks/multihost_allreduce.py``).
Here each host first reduces through its own shared memory, the hosts then reduce across their
links, and each host spreads the result through shared memory again:

1. the ranks of a host run ``_shm``'s allreduce among themselves; in its step 3, local rank j
   holds part j of the host's sum;
2. before publishing it, local rank j reduces that part across hosts, by a ring over local rank j
   of every host on the set's TCP mesh (``Mesh.ring_allreduce``): k rings in parallel, one per
   local rank, so every rank's connection carries a share and each host's link moves
   2(h-1)/h of the tensor, the bound, both ways;
3. the shared-memory allreduce publishes the parts, now reduced over every host, and every local
   rank copies the others.

A small tensor (``_mesh.Mesh.gathers``) skips all three: one ``gather_allreduce`` over the set's
mesh, each rank combining every rank's bytes in rank order.

Every rank ends with the same bytes (each part is reduced once, by its ring, and copied).  It
applies when the set spans at least 2 hosts with the same number k >= 2 of its ranks on each,
shared memory works on every host and the mesh carries data (``HOROVOD_COMPAT_SHM_DATA=0``,
``HOROVOD_COMPAT_TCP_DATA=0`` or ``HOROVOD_HIERARCHICAL_ALLREDUCE=0`` turn it off: the flat ring,
or gloo, carry the data then).  Hosts are told apart by host name.

Failure: the ring raises ``HorovodInternalError`` as the mesh does (and breaks it); the rank then
marks its shared-memory transport left, so its host's peers waiting at a barrier raise too rather
than wait for it; a peer that died is noticed by the barrier's watch.  Either way the transport is
broken for good, as the flat paths are.
"""
from __future__ import annotations

import os
import socket
import warnings
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from . import _mesh, _shm
from .exceptions import HorovodInternalError

__all__ = ["HostAwareAllreduce", "create", "enabled"]


def enabled() -> bool:
    """Whether this rank lets allreduce data take the host-aware path (Horovod's
    ``HOROVOD_HIERARCHICAL_ALLREDUCE``; here on unless it is ``0``)."""
    return os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", "1") != "0" and _shm.data_enabled()


class HostAwareAllreduce:
    """What a process set across hosts holds: this host's shared-memory reducer and the ring of
    this rank's local index across the hosts, driven by the set's coordinator thread."""

    def __init__(self, local: _shm.SharedMemoryAllreduce, mesh: _mesh.Mesh, ring: List[int]) -> None:
        self.local, self.mesh, self.ring = local, mesh, ring

    def allreduce(self, pairs: List[tuple], op: int) -> List[Any]:
        """``dst = op(src over every rank of the set)`` for each pair, now, in this thread."""
        def across(part: torch.Tensor) -> None:
            try:
                self.mesh.ring_allreduce(part, op, self.ring)
            except HorovodInternalError:
                self.local.abort()
                raise

        for src, dst in pairs:
            if self.mesh.gathers(src):  # a few bytes: one step over the whole set beats
                try:                    # two barriers and a ring across the hosts
                    self.mesh.gather_allreduce(src, dst, op)
                except HorovodInternalError:
                    self.local.abort()
                    raise
                continue
            self.local.allreduce(src, dst, op, across)
        return []

    def leave(self) -> None:
        """This rank shuts down: its host's peers waiting for it raise."""
        self.local.abort()

    def close(self) -> None:
        self.local.close()


def create(st: Any, mesh: Optional[_mesh.Mesh]) -> Optional[HostAwareAllreduce]:
    """The host-aware transport of set ``st`` (collective over its control group), or None where
    it does not apply (see the module docstring).  ``mesh`` is None on every rank of the set or
    on none (``_exchange.create`` decides it from what all of them said)."""
    if mesh is None:
        return None
    info: List[Any] = [None] * st.n
    dist.all_gather_object(info, (socket.gethostname(), os.getpid(), enabled(), _shm.slot_bytes()),
                           group=st.ctl)
    if not all(i[2] for i in info):
        return None
    hosts: Dict[str, List[int]] = {}
    for index, (host, *_rest) in enumerate(info):
        hosts.setdefault(host, []).append(index)
    members = list(hosts.values())
    k = len(members[0])
    if len(members) < 2 or k < 2 or any(len(m) != k for m in members):
        return None
    mine = hosts[info[st.me][0]]
    local_index = mine.index(st.me)
    owners = [0] * st.n
    for group in members:
        for index in group:
            owners[index] = group[0]
    slot = info[0][3]  # the set's first rank decides: every host lays its segment out alike
    try:
        mm = _shm.map_segment(st, _shm.header_bytes(k) + 2 * k * slot, owners)
    except OSError as exc:
        warnings.warn(f"horovod_compat: {exc}; allreduce data takes the flat ring over the hosts")
        return None
    local = _shm.SharedMemoryAllreduce(mm, k, local_index, [info[i][1] for i in mine], slot)
    local.watch.attach(getattr(st, "watch", None), index=mine)  # the set's beats, by set index
    return HostAwareAllreduce(local, mesh, [group[local_index] for group in members])
