"""Suite-wide checks: no test may leave a process it started behind.  Suite-wide set-up: one
cache of the TensorFlow binding's compiled op for the whole run (see ``pytest_configure``), the
order and grouping of the files on the workers (tests/scheduling.py), and the time table
(``--time-table``, tests/timetable.py).  docs/testing.md says how the suite is run."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

import procs
import scheduling
from horovod_compat.launch import job as horovod_job
from horovod_compat.launch import output as horovod_output
from timetable import configure as configure_time_table, pytest_addoption  # noqa: F401


def child_pids(parent: int) -> list[int]:
    """PIDs whose parent is `parent` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = set(child_pids(os.getpid()))
    yield
    deadline = time.monotonic() + 10
    while True:
        left = set(child_pids(os.getpid())) - before
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"test left child processes behind: {sorted(left)}"


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hooks: a run without xdist has none)
def pytest_xdist_make_scheduler(config, log):
    """scripts/test.sh's ``--dist loadfile``: one file, or one group of files that share a
    resource, at a time per worker, costliest first (tests/scheduling.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    return scheduling.make_scheduler(config, log)


def pytest_collection_modifyitems(config, items):
    scheduling.order(items)


CACHE_VARIABLE = "HOROVOD_COMPAT_CACHE_DIR"
_cache_dir = pytest.StashKey[str]()
_warm_dir = pytest.StashKey[str]()
_tracebacks_dir = pytest.StashKey[str]()


def pytest_configure(config):
    """The TensorFlow binding compiles its op into ``$HOROVOD_COMPAT_CACHE_DIR`` (default under
    ``$HOME``) on first use.  Many tests give their jobs a HOME of their own (Keras' offline MNIST
    is found there), and each of their ranks then compiled the op again (~10-20 s of CPU each on a
    2-core machine); so every process of the run gets one cache, made fresh for the run (as on a
    fresh machine: the first TensorFlow job of the run compiles, the others load) and removed after
    it.  The xdist workers, started after this, inherit it with the environment.  Tests of the
    cache itself set their own.  A cache chosen outside the suite is kept.  Failed Horovod jobs
    keep their full tracebacks in files (horovod_compat/launch/output.py): the run's go to one
    directory made for it and removed after it, not to the user's.  Also registers the time table
    when ``--time-table`` asks for it (tests/timetable.py)."""
    configure_time_table(config)
    config.addinivalue_line("markers", "shares(name): the files marked with one name run one after "
                                       "another on one worker (tests/scheduling.py)")
    if not os.environ.get(horovod_job.WARM_DIR_VAR):
        path = tempfile.mkdtemp(prefix="horovod_compat-test-warm-")
        config.stash[_warm_dir] = path
        os.environ[horovod_job.WARM_DIR_VAR] = path
        # the run's launches share warm fork servers; one the run stops waiting for goes sooner
        os.environ.setdefault(horovod_job.WARM_SECONDS_VAR, "60")
    if not os.environ.get(horovod_output.TRACEBACKS_DIR_VAR):
        path = tempfile.mkdtemp(prefix="horovod_compat-test-tracebacks-")
        config.stash[_tracebacks_dir] = path
        os.environ[horovod_output.TRACEBACKS_DIR_VAR] = path
    if os.environ.get(CACHE_VARIABLE):
        return
    path = tempfile.mkdtemp(prefix="horovod_compat-test-cache-")
    config.stash[_cache_dir] = path
    os.environ[CACHE_VARIABLE] = path


def pytest_unconfigure(config):
    for key in (_cache_dir, _tracebacks_dir):
        path = config.stash.get(key, None)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
    warm = config.stash.get(_warm_dir, None)
    if warm is not None and not hasattr(config, "workerinput"):  # the controller, after the workers
        procs.stop_warm_servers_in(warm)
        shutil.rmtree(warm, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, config):
    """How many warm fork servers (one per environment) the run's launches used."""
    warm = config.stash.get(_warm_dir, None)
    if warm is not None and os.path.isdir(warm):
        keys = sum(name.endswith(".lock") for name in os.listdir(warm))
        terminalreporter.write_line(f"warm fork servers: launches in {keys} environment(s) used one")
