"""``horovod.ray.utils``: the helpers Ray Train's Horovod backend imports.

Horovod probed the nodes for the interfaces they share; here a rank picks the interface of its
route to the rendezvous (``distributor.netif``) unless told, so ``detect_nics`` only passes on the
ones the settings name.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Set

__all__ = ["detect_nics", "nics_to_env_var", "map_blocking"]


def detect_nics(settings: Any, all_host_names: Optional[List[str]] = None,
                node_workers: Optional[List[Any]] = None) -> Optional[Set[str]]:
    """The interfaces the ranks must use: ``settings.nics`` when it names some, else None (each
    rank then takes the interface of its route to the rendezvous)."""
    nics = getattr(settings, "nics", None)
    return set(nics) if nics else None


def nics_to_env_var(nics: Optional[Iterable[str]]) -> Dict[str, str]:
    """The environment that pins the ranks' transports to `nics` ({} for None)."""
    if not nics:
        return {}
    names = ",".join(sorted(nics))
    return {"GLOO_SOCKET_IFNAME": names, "NCCL_SOCKET_IFNAME": names}


def map_blocking(fn: Callable[[Any], Any], collection: Iterable[Any]) -> List[Any]:
    """``ray.get`` of ``fn(item)`` (an ObjectRef) for every item."""
    import ray

    return ray.get([fn(item) for item in collection])
