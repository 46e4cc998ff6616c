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

`command_problem` says, in one line with the fix, why a command cannot be started the way
``os.execvp`` starts it (not on PATH, a file without execute permission, a directory, no ``#!``
line...).  ``horovodrun`` asks it on the driver before any rank starts (for this host's ranks);
a rank whose exec fails anyway (on another host) prints the same line and exits 127 or 126, as a
shell does, instead of a traceback.
"""
from __future__ import annotations

import difflib
import errno
import os
import shlex
import shutil
import socket
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

#: Renders a corrected command for a message (the driver shows a whole ``horovodrun`` line).
Suggest = Callable[[List[str]], str]


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
    __tracebackhide__ = True  # noqa: F841 - the rank's traceback starts at the user's code
    os.environ.update(horovod_slot_env(os.environ))
    return fn(*args, **kwargs)


# ---- why a command cannot start ---------------------------------------------------------------
def python_word() -> str:
    """How to name this Python in advice: ``python`` when that is it on PATH, else its path."""
    found = shutil.which("python")
    if found and os.path.dirname(os.path.abspath(found)) == os.path.dirname(sys.executable):
        return "python"
    return sys.executable


def _similar_path(name: str, extra: Sequence[str] = ()) -> Optional[str]:
    """The entry of `name`'s folder (or one of `extra`) closest to `name`, if one is close."""
    folder, base = os.path.split(name)
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        entries = []
    match = difflib.get_close_matches(base, [*entries, *extra], n=1, cutoff=0.75)
    if not match:
        return None
    return match[0] if match[0] in extra else os.path.join(folder, match[0])


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(256)
    except OSError:
        return b""


def _is_python_file(path: str) -> bool:
    head = _head(path)
    return path.endswith(".py") or (head.startswith(b"#!") and b"python" in head.split(b"\n")[0])


def _run_with_python(path: str, command: Sequence[str], suggest: Suggest) -> str:
    """Advice for a file that cannot run as a command: its interpreter, or execute permission."""
    if _is_python_file(path):
        return f"to run a Python script, use: {suggest([python_word(), path, *command[1:]])}"
    if path.endswith(".sh") or _head(path).startswith(b"#!/bin/"):
        return f"to run a shell script, use: {suggest(['bash', path, *command[1:]])}"
    return f"make it executable (chmod +x {shlex.quote(path)}) or run it with its interpreter"


def _directory_problem(name: str, command: Sequence[str], suggest: Suggest) -> str:
    if os.path.isfile(os.path.join(name, "__main__.py")):
        return (f"{name} is a directory, not an executable command; to run its __main__.py, "
                f"use: {suggest([python_word(), name, *command[1:]])}")
    return (f"{name} is a directory, not an executable command; give the program to run, "
            f"e.g. {suggest([python_word(), os.path.join(name, 'SCRIPT.py')])}")


def _format_problem(path: str, command: Sequence[str], suggest: Suggest) -> Optional[str]:
    """An executable file execve cannot start: a text file without ``#!``, or whose ``#!``
    interpreter is missing."""
    head = _head(path)
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n")[0].split()
        interpreter = os.fsdecode(words[0]) if words else ""
        if interpreter and not os.access(interpreter, os.X_OK):
            return (f"{command[0]} starts with '#!{interpreter}', which does not exist on this host;"
                    f" fix that line, or {_run_with_python(path, command, suggest)}")
        return None
    if head.startswith(b"\x7fELF") or b"\0" in head:
        return None  # a program (or a format the kernel may know): let exec decide
    return (f"{command[0]} has no '#!' line naming its interpreter, so it cannot run as a command; "
            f"{_run_with_python(path, command, suggest)}")


def _file_problem(path: str, command: Sequence[str], suggest: Suggest) -> Optional[str]:
    """What is wrong with running the existing path `path` as `command[0]`, if anything."""
    if os.path.isdir(path):
        return _directory_problem(command[0], command, suggest)
    if not os.access(path, os.X_OK):
        return (f"{command[0]} is not an executable command (it is a file without execute "
                f"permission); {_run_with_python(path, command, suggest)}")
    return _format_problem(path, command, suggest)


def _runnable(command: List[str]) -> List[str]:
    """`command` with its first word made runnable where the fix is clear: a Python interpreter
    for a Python script, ``./name`` for an executable file in this directory."""
    name = command[0]
    if command_problem(command) is None or not os.path.isfile(name):
        return command
    if _is_python_file(name):
        return [python_word(), *command]
    if os.access(name, os.X_OK) and not os.path.dirname(name):
        return [os.path.join(".", name), *command[1:]]
    return command


def _not_found(command: Sequence[str], suggest: Suggest) -> str:
    name = command[0]
    pythons = () if os.path.dirname(name) else ("python", "python3")
    where = "(no such file)" if os.path.dirname(name) else "on PATH (nor a file in this directory)"
    message = f"command {name!r} not found {where}"
    match = _similar_path(name, pythons)
    if match is None:
        return f"{message}; check the spelling, or give the command's path"
    fixed = [python_word() if match in pythons else match, *command[1:]]
    return f"{message}; did you mean: {suggest(_runnable(fixed))}"


def command_problem(command: Sequence[str], suggest: Suggest = shlex.join) -> Optional[str]:
    """Why ``os.execvp(command[0], command)`` cannot start `command` on this host, as one line
    that names the fix (`suggest` renders the corrected command); None when it can."""
    name = command[0]
    if os.path.dirname(name):  # execvp runs a path as it is, relative to the current directory
        if not os.path.exists(name):
            return _not_found(command, suggest)
        return _file_problem(name, command, suggest)
    found = shutil.which(name)
    if found is not None:
        return _format_problem(found, command, suggest)
    if os.path.isdir(name):
        return _directory_problem(name, command, suggest)
    if os.path.isfile(name):  # in this directory, but execvp only searches PATH
        local = os.path.join(".", name)
        return (_file_problem(name, command, suggest)
                or f"{name} is not on PATH (it is a file in this directory); "
                   f"use: {suggest([local, *command[1:]])}")
    return _not_found(command, suggest)


def main(argv: Optional[Sequence[str]] = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("usage: python -m horovod_compat.run_rank CMD [ARGS...]", file=sys.stderr)
        return 2
    os.environ.update(horovod_slot_env(os.environ))
    try:
        os.execvp(command[0], command)
    except OSError as exc:  # one line naming the command and the fix, not a traceback
        problem = command_problem(command) or f"cannot run {command[0]!r}: {exc.strerror}"
        print(f"horovodrun: on {socket.gethostname()}: {problem}", file=sys.stderr, flush=True)
        return 127 if exc.errno == errno.ENOENT else 126
    return 127  # not reached: execvp replaces this process


if __name__ == "__main__":
    sys.exit(main())
