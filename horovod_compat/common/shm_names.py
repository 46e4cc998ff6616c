"""The runtime's shared-memory segments in ``/dev/shm``: their names, and the removal of those whose
owner is gone.

A segment is named ``horovod_compat-<PID namespace>-<owner pid>-<random>`` (the owner's PID
namespace, so that a process never takes the pid of another namespace's process, sharing the same
``/dev/shm``, for its own: containers with a shared IPC namespace). Its owner unlinks it once every rank
of its set has mapped it, or once the set failed meanwhile (`_shm.map_segment`); only an owner
killed between creating it and that moment leaves it behind (a rank SIGKILLed inside
``hvd.init()``). Such a segment is removed by `remove_orphans`: after each job by the launcher on
its host (``horovodrun``, ``horovod.run``), and by the first segment a process creates (the next
job on a host, Spark executors and other hosts included). Only this user's segments whose owner
process no longer exists are removed.

No torch here: the launcher imports it.
"""
from __future__ import annotations

import os
import re
import uuid
from typing import List, Optional

from distributor import procfs

DIRECTORY = "/dev/shm"
PREFIX = "horovod_compat-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-[0-9a-f]{32}")


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of /proc/self/ns/pid; "0" where unknown)."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def new_segment_path() -> str:
    """A new segment's path, owned by this process."""
    return os.path.join(DIRECTORY, f"{PREFIX}{_pid_namespace()}-{os.getpid()}-{uuid.uuid4().hex}")


def owner(name: str) -> Optional[int]:
    """The owner pid in a segment's file name when the owner is in this PID namespace; None for
    another namespace's segment or a name that is not a segment's."""
    match = _NAME.fullmatch(name)
    if match is None or match.group(1) != _pid_namespace():
        return None
    return int(match.group(2))


def remove_orphans(directory: str = DIRECTORY) -> List[str]:
    """Unlink this user's segments in `directory` whose owner process no longer exists; return
    their names. A pid reused by a live process keeps its segment (removed once that one ends)."""
    try:
        names = os.listdir(directory)
    except OSError:  # no /dev/shm
        return []
    removed = []
    for name in names:
        pid = owner(name)
        if pid is None or procfs.alive(pid):
            continue
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
        except OSError:  # removed meanwhile, or not ours to remove
            continue
        removed.append(name)
    return removed
