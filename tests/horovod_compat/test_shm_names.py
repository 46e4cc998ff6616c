"""horovod_compat.common.shm_names: segment names carry their owner's pid, and the segments of an
owner that no longer exists are removed (those of live owners, other names, are not)."""
from __future__ import annotations

import os
import subprocess
import sys

from horovod_compat.common import shm_names


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_new_segment_is_named_after_its_owner():
    path = shm_names.new_segment_path()
    assert os.path.dirname(path) == shm_names.DIRECTORY
    assert shm_names.owner(os.path.basename(path)) == os.getpid()
    assert shm_names.owner("horovod_compat-" + "a" * 32) is None  # the old names: no owner
    assert shm_names.owner("other-123-" + "a" * 32) is None
    ns = os.path.basename(path).split("-")[1]
    other_ns = str(int(ns) + 1)
    assert shm_names.owner(f"horovod_compat-{other_ns}-{os.getpid()}-{'a' * 32}") is None


def test_only_the_segments_of_owners_that_are_gone_are_removed(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    ns = os.path.basename(shm_names.new_segment_path()).split("-")[1]
    names = {
        "dead": f"horovod_compat-{ns}-{dead}-{'a' * 32}",
        "alive": f"horovod_compat-{ns}-{alive}-{'b' * 32}",
        "another PID namespace's": f"horovod_compat-{int(ns) + 1}-{dead}-{'e' * 32}",
        "not ours": f"something-{ns}-{dead}-{'c' * 32}",
        "no owner": f"horovod_compat-{'d' * 32}",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert shm_names.remove_orphans(str(tmp_path)) == [names["dead"]]
    assert sorted(os.listdir(tmp_path)) == sorted(n for k, n in names.items() if k != "dead")


def test_no_directory_removes_nothing(tmp_path):
    assert shm_names.remove_orphans(str(tmp_path / "missing")) == []
