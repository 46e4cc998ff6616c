"""Exceptions of the ``horovod.torch`` API.

``HorovodInternalError`` is what a failed collective raises (for example when ranks disagree on a
tensor's shape, or the job is being shut down); scripts and ``hvd.elastic`` catch it, so it must stay a
``RuntimeError`` subclass exactly as in Horovod.  ``HostsUpdatedInterrupt`` is raised by elastic jobs
when the host set changes; it is defined here so ``horovod.common.exceptions`` can re-export it.
"""
from __future__ import annotations

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "get_version_mismatch_message"]


class HorovodInternalError(RuntimeError):
    """A collective failed inside the Horovod layer (mismatch across ranks, stall shutdown, ...)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Elastic: the set of hosts changed; the training loop should re-synchronise its state.

    ``skip_sync`` tells ``hvd.elastic.run`` that the state need not be restored/synced (only hosts
    were added).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


def get_version_mismatch_message(name: str, version: str, installed_version: str) -> str:
    """Horovod's helper used by some integrations to explain a framework version mismatch."""
    return (f"Framework {name} installed with version {installed_version} but found version "
            f"{version}.\n             This can result in unexpected behavior including runtime "
            f"errors.\n             Reinstall Horovod using `pip install --no-cache-dir` to build "
            f"with the new version.")
