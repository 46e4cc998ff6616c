"""Test helper: a launcher whose ranks fork from the run's warm fork servers
(`distributor.forkserver_daemon`), the way ``horovodrun`` and ``horovod.run`` start ranks by
default (``HOROVOD_COMPAT_WARM_SECONDS``; tests/conftest.py gives the run its own server
directory and stops its servers at the end).

The tests of Horovod's API on a few ranks (collectives, optimizer, negotiation) and of migrated
programs launch through it: their ranks then fork with torch imported, where each would import it
(about 2 CPU-s a rank, most of a short launch). What a warm rank sees is checked by
tests/distributor/test_forkserver_daemon.py and tests/horovod_compat/test_horovodrun_warm.py;
the tests of the engine's own process handling keep plain processes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

from distributor import forkserver_daemon, run_function, run_script
from distributor.launchers import PythonLauncher
from horovod_compat.launch import job as horovod_job


def warm_launcher(script: Optional[str] = None, expect: Sequence[str] = ("torch",)) -> PythonLauncher:
    """A new launcher (one per launch) forking from the warm server of the launch's environment,
    which imports `expect` before it forks the first ranks. A `script` that sets environment
    variables itself may mean them for an import, so its ranks start as processes of their own,
    as horovodrun's would; so do all ranks where the run turned warm servers off."""
    settings = horovod_job.warm_settings_from(os.environ)
    if settings is None or (script is not None and forkserver_daemon.sets_environment(script)):
        return PythonLauncher()
    return PythonLauncher(across_launches=dataclasses.replace(settings, expect=tuple(expect)))


def run_function_warm(fn, *args, **kwargs):
    """`distributor.run_function` through `warm_launcher`."""
    return run_function(fn, *args, launcher=warm_launcher(), **kwargs)


def run_script_warm(path: str, *args, **kwargs):
    """`distributor.run_script` through `warm_launcher` (for `path`)."""
    return run_script(path, *args, launcher=warm_launcher(path), **kwargs)
