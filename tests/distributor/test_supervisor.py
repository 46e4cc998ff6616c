"""The supervisor's stop: nothing a rank process started may outlive it."""
from __future__ import annotations

import os
import signal
import sys
import time

from distributor.supervisor import Supervisor
from procs import alive

# A launcher (mpirun) that starts a helper in a process group of its own (as mpirun does with
# its ssh to each host), writes the helper's PID, and waits.
_LAUNCHER = """\
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                          preexec_fn=lambda: os.setpgid(0, 0))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(helper.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


class _Sink:
    def on_output(self, rank, stream, line):
        pass

    def on_exit(self, rank, returncode):
        pass


def test_stop_also_ends_what_left_the_process_group_but_not_the_session(tmp_path):
    pidfile = tmp_path / "helper.pid"
    supervisor = Supervisor(_Sink())
    supervisor.start_group([0, 1], [sys.executable, "-c", _LAUNCHER, str(pidfile)], os.environ,
                           lambda stream, line: (None, stream, line))
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    helper = int(pidfile.read_text())
    assert os.getpgid(helper) == helper  # it left the launcher's process group
    try:
        supervisor.stop(grace=0.5)
        deadline = time.monotonic() + 10
        while alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(helper), "the launcher's helper outlived the stop"
    finally:
        if alive(helper):
            os.kill(helper, signal.SIGKILL)
