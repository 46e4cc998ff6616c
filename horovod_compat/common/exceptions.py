"""Exceptions of the Horovod API (``horovod.common.exceptions``), shared by every framework binding.

``HorovodInternalError`` is what a failed collective raises (for example when ranks disagree on a
tensor's shape, or the job is being shut down); scripts and ``hvd.elastic`` catch it, so it must stay a
``RuntimeError`` subclass exactly as in Horovod.  ``HostsUpdatedInterrupt`` is raised by elastic jobs
when the host set changes; elastic ``State`` classes of every binding raise it.
"""
from __future__ import annotations

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "get_version_mismatch_message", "peer_failure",
           "TOO_MANY_BACKWARDS", "ZERO_GRAD_PENDING", "STEP_AFTER_SYNC", "NOT_INITIALIZED"]

# Horovod's messages, word for word (scripts and tests match on them).
NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
TOO_MANY_BACKWARDS = ("Gradients were computed more than backward_passes_per_step times before call "
                      "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
ZERO_GRAD_PENDING = ("optimizer.zero_grad() was called after loss.backward() but before "
                     "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                     "cause a race condition.")
STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                   "optimizer.synchronize(). This can cause training slowdown. You may want to "
                   "consider using optimizer.skip_synchronize() context if you use "
                   "optimizer.synchronize() in your code.")


class HorovodInternalError(RuntimeError):
    """A collective failed inside the Horovod layer (mismatch across ranks, stall shutdown, ...).

    ``knock_on`` is True when it failed because another rank did -- that rank (``peer``, its
    global rank, when known) died, left, or stopped making progress (``frozen``) -- rather than
    for a reason of this rank's own; the launchers use it to name the rank whose failure came
    first. Build such errors with :func:`peer_failure`.
    """

    knock_on: bool = False
    peer = None  # Optional[int]: the global rank that failed first, when known
    frozen: bool = False


def peer_failure(message: str, peer=None, frozen: bool = False) -> HorovodInternalError:
    """The ``HorovodInternalError`` of a collective that failed because global rank ``peer``
    died, left the job or (``frozen``) stopped making progress while this rank waited for it."""
    error = HorovodInternalError(message)
    error.knock_on, error.peer, error.frozen = True, peer, frozen
    return error


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
