"""A remote shell for `mpirun` that needs no ssh: `python -m distributor.launchers.remote_shell
HOST COMMAND...`.

Open MPI starts its per-host daemon (`prted`) through an rsh/ssh agent. On a Spark cluster the
"hosts" are the barrier tasks of the job (named `task0`, `task1`, ...), and this agent asks the
driver hub, over the job's authenticated connection, to have task N run the command; the daemon
and the ranks it starts then live inside that Spark task. The agent exits with the command's exit
status, as ssh would.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from .. import protocol
from ..protocol import Kind
from ..rank_env import HUB_ADDRESS_VAR, SECRET_VAR

TASK_HOST_PREFIX = "task"
#: Exit status when the driver cannot be asked or the task is gone, as ssh uses.
UNREACHABLE = 255


def task_host(index: int) -> str:
    """The host name mpirun is given for barrier task `index`."""
    return f"{TASK_HOST_PREFIX}{index}"


def task_index(host: str) -> int:
    """Inverse of `task_host`; ValueError for any other name."""
    if not host.startswith(TASK_HOST_PREFIX) or not host[len(TASK_HOST_PREFIX):].isdigit():
        raise ValueError(f"{host!r} is not a barrier task host name ({TASK_HOST_PREFIX}N)")
    return int(host[len(TASK_HOST_PREFIX):])


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2:
        print("usage: remote_shell HOST COMMAND...", file=sys.stderr)
        return UNREACHABLE
    try:
        index = task_index(argv[0])
        host, port = os.environ[HUB_ADDRESS_VAR].rsplit(":", 1)
        secret = bytes.fromhex(os.environ[SECRET_VAR])
        channel = protocol.connect((host, int(port)), secret)
    except (KeyError, ValueError, OSError) as exc:
        print(f"remote_shell: cannot reach the driver hub: {exc!r}", file=sys.stderr)
        return UNREACHABLE
    try:
        channel.send(Kind.SPAWN, (index, " ".join(argv[1:])))
        while True:
            kind, body = channel.recv()
            if kind == Kind.SPAWN_EXIT:
                return int(body)
            if kind == Kind.STOP:
                return UNREACHABLE
    except (ConnectionError, OSError):
        return UNREACHABLE
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
