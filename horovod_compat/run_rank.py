"""Per-rank step of ``horovodrun`` in gloo mode: give the rank Horovod's ``HOROVOD_*`` slot variables.

Horovod's gloo launcher sets, in every rank, ``HOROVOD_RANK``, ``HOROVOD_SIZE``,
``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK``, ``HOROVOD_CROSS_SIZE`` and
``HOROVOD_HOSTNAME``.  Scripts (and Horovod's own test-suite) read them before or without
``hvd.init()``, e.g. to tell a gloo run from an MPI one.  Our engine gives each rank the torchrun
variables; this module derives the Horovod ones from them and then execs the user's command, so
the rank keeps its process (signals and exit status are the command's own).

    python -m horovod_compat.run_rank CMD [ARGS...]

(``horovodrun`` inserts this in front of the command; ``--mpi`` runs do not use it, as Horovod's
MPI launcher does not set these variables either.)  Function targets (``horovod.run``,
``horovod.spark.run``) get the same variables through `call_with_slot_env`.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence


def horovod_slot_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """Horovod's per-rank variables from the torchrun ones in `environ` ({} if those are missing)."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return {}
    size = int(environ["WORLD_SIZE"])
    local_size = int(environ.get("LOCAL_WORLD_SIZE", size))
    local_rank = int(environ.get("LOCAL_RANK", environ["RANK"]))
    cross_rank = int(environ.get("GROUP_RANK", environ.get("NODE_RANK", 0)))
    # Horovod's cross size: how many hosts have a rank with this local rank (all of them when every
    # host runs the same number of ranks, which is the only layout this launcher produces).
    cross_size = int(environ.get("GROUP_WORLD_SIZE", max(size // max(local_size, 1), 1)))
    return {
        "HOROVOD_RANK": str(int(environ["RANK"])),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(cross_rank),
        "HOROVOD_CROSS_SIZE": str(cross_size),
        "HOROVOD_HOSTNAME": environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
    }


def call_with_slot_env(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Inside a rank: set Horovod's slot variables, then return ``fn(*args, **kwargs)``."""
    os.environ.update(horovod_slot_env(os.environ))
    return fn(*args, **kwargs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("usage: python -m horovod_compat.run_rank CMD [ARGS...]", file=sys.stderr)
        return 2
    os.environ.update(horovod_slot_env(os.environ))
    os.execvp(command[0], command)
    return 127  # not reached: execvp raises OSError on failure


if __name__ == "__main__":
    sys.exit(main())
