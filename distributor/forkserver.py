"""Rank processes forked from a warm Python that has already imported the heavy modules.

A fresh rank spends most of a small job importing torch (1.5-2 s of CPU here). Inside a Spark
task whose Python worker Spark keeps for later tasks (``spark.python.worker.reuse``, on by
default), the launcher can instead keep one *fork server* beside the worker: a single-threaded
``python -m distributor.forkserver`` that imports the preload modules (torch) once and then forks
one child per rank. Each child is set up exactly as a fresh ``python -m distributor.rank_entry``
would be — its own session, stdout and stderr on the supervisor's pipes, stdin from /dev/null,
the rank's full environment, the task's working directory, fresh random seeds — and then runs
`rank_entry.main`, which authenticates to the driver hub before it unpickles anything.

The server is started with the rank environment minus the variables that change from job to job
or rank to rank (`rank_env.TORCHRUN_VARS`, the engine's private ones), so whatever a preloaded
module reads from the environment at import time (OMP_NUM_THREADS, HOROVOD_* knobs, ...) is what
a fresh rank would have read; a job with a different environment, Python or working directory
gets its own server (a worker keeps two; the least recently used idle one goes). It talks to the
worker over an anonymous socket pair (JSON, no pickle) and lives exactly as long as the worker:
it exits when the worker's end closes, and its children (the ranks) are killed by the kernel
when it dies. Where no server can be used (preload failed,
server gone), ranks start as plain processes.

A worker's server also *learns* (`LEARNED`): a module that costs seconds to import, that the
front end cannot know a job needs (TensorFlow: a ``horovod.spark.run`` / ``HorovodRunner``
function that trains with ``horovod.tensorflow``), and that one of its ranks imported, the server
imports itself when it is used again (the next spawn request, before it forks), so that rank and
every later one have it already (a TensorFlow rank then starts as fast as a torch rank: no 4-6 s
of CPU per rank for ``import tensorflow``); so does ``torch._dynamo``, which torch imports at a
rank's first optimizer. A server that no job comes back to (Spark ends idle Python workers, and
a failed task's) imports nothing. Learning right after a job cost 3-9 s of CPU per server
whether or not it was used again: in a profiled run of the test suite (tests/cpu_profile.py),
92 servers spent 498 CPU-s, about 170 of them beyond their own import of torch.
Only modules checked safe to fork after are learned: importing TensorFlow starts no thread and no
eager context (its thread pools start in the rank, at its first op), nor does ``torch._dynamo``
(its compile workers start at a rank's first ``torch.compile``).
A spawn that arrives while the server imports waits for it, once per server.
"""
from __future__ import annotations

import collections
import gc
import importlib
import json
import logging
import os
import queue
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
import weakref
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .rank_env import PARENT_PID_VAR, PRIVATE_VARS, TORCHRUN_VARS

log = logging.getLogger(__name__)

#: Largest request (the rank's environment as JSON) a datagram of the socket pair carries.
MAX_MESSAGE = 1 << 20
#: How long a spawn waits for the server's answer (the preload import of a cold server included).
SPAWN_TIMEOUT = 300.0
#: What a worker's server imports for later jobs once one of its ranks imported it (see above).
#: ``torch._dynamo``: torch imports it lazily, at a rank's first optimizer (every training
#: rank), for about 1 s of CPU more than ``import torch``.
LEARNED: Tuple[str, ...] = ("torch._dynamo", "tensorflow")


def startup_environment(env: Mapping[str, str]) -> Dict[str, str]:
    """`env` without the variables that differ between jobs and ranks: the server's own."""
    skip = set(TORCHRUN_VARS) | set(PRIVATE_VARS)
    return {name: value for name, value in env.items() if name not in skip}


# ---- the worker's side ---------------------------------------------------------------------
class ForkedProcess:
    """A rank forked by the server, with the parts of `subprocess.Popen` the supervisor uses."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        self.args = ["<forked>", "distributor.rank_entry"]
        self.pid = pid
        self.stdout = os.fdopen(stdout, "rb")
        self.stderr = os.fdopen(stderr, "rb")
        self.returncode: Optional[int] = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The worker's handle on one fork server process."""

    def __init__(self, python: str, preload: Sequence[str], env: Mapping[str, str], cwd: str,
                 learn: Sequence[str] = ()) -> None:
        """`learn`: modules the server imports when used again once a rank has (`LEARNED`); a job's
        own server (`PythonLauncher.keep_warm`) learns nothing, as no later job uses it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [python, "-m", "distributor.forkserver", str(theirs.fileno()), *preload,
                 *(f"{LEARN_MARK}{name}" for name in learn)],
                env=startup_environment(env), cwd=cwd, pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._attach(ours, proc)

    @classmethod
    def connected(cls, sock: socket.socket) -> "ForkServer":
        """A handle on a server this process did not start, reached over `sock` (a
        `forkserver_daemon`, already authenticated): `close` only ends the connection."""
        self = cls.__new__(cls)
        self._attach(sock, None)
        self._ready.set()
        return self

    def _attach(self, sock: socket.socket, proc: Optional[subprocess.Popen]) -> None:
        self._proc = proc
        self._sock = sock
        self._replies: "queue.Queue[dict]" = queue.Queue()
        self._lock = threading.Lock()
        self._children: Dict[int, ForkedProcess] = {}  # running, by pid
        self._early: Dict[int, int] = {}  # exit statuses that came before their spawn's reply was read
        self._gone = False
        self._spawn_lock = threading.Lock()
        self._ready = threading.Event()
        self.failed: Dict[str, str] = {}  # preload module -> the error importing it
        threading.Thread(target=self._read, name="distributor-forkserver", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                if "ready" in message:
                    self.failed = dict(message["failed"])
                    self._ready.set()
                elif "exited" in message:
                    with self._lock:
                        child = self._children.pop(message["exited"], None)
                        if child is None:
                            self._early[message["exited"]] = message["code"]
                    if child is not None:
                        child._set_exit(message["code"])
                else:
                    self._replies.put(message)
        except (OSError, ValueError):
            pass
        with self._lock:  # its children die with it (PR_SET_PDEATHSIG): report them killed
            self._gone = True
            orphans, self._children = list(self._children.values()), {}
        for child in orphans:
            child._set_exit(-signal.SIGKILL)
        self._ready.set()
        self._replies.put({"error": "the fork server exited"})

    @property
    def usable(self) -> bool:
        """Still running, and every preload module imported (waits for a cold server's imports)."""
        self._ready.wait(SPAWN_TIMEOUT)
        return not self._gone and not self.failed and self._ready.is_set()

    @property
    def gone(self) -> bool:
        return self._gone

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._children

    def spawn(self, env: Mapping[str, str], cwd: Optional[str] = None) -> ForkedProcess:
        """Fork one rank with environment `env` (in directory `cwd`, where the server serves
        several directories); OSError if the server cannot."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._spawn_lock:
                request = json.dumps({"env": dict(env), **({"cwd": cwd} if cwd else {})}).encode()
                socket.send_fds(self._sock, [request], [out_w, err_w])
                reply = self._replies.get(timeout=SPAWN_TIMEOUT)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if "pid" not in reply:
            os.close(out_r)
            os.close(err_r)
            raise OSError(reply.get("error", "the fork server did not start the rank"))
        child = ForkedProcess(reply["pid"], out_r, err_r)
        with self._lock:
            code = self._early.pop(child.pid, None)
            if code is None and self._gone:
                code = -signal.SIGKILL
            if code is None:
                self._children[child.pid] = child
        if code is not None:
            child._set_exit(code)
        return child

    def close(self) -> None:
        """End the server (its running children die with it) and reap it."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._proc is None:  # a daemon's: it ends this connection's ranks and stays
            return
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _key(python: str, preload: Sequence[str], env: Mapping[str, str], cwd: str) -> Tuple:
    return (python, tuple(preload), cwd, tuple(sorted(startup_environment(env).items())))


#: How many fork servers a worker keeps, for jobs of different environments (front ends differ:
#: e.g. OMP_NUM_THREADS=1 where a task's node runs several ranks); the least recently used idle
#: one goes first.
MAX_SERVERS = 2
#: This worker's fork servers by key, least recently used first.
_servers: "collections.OrderedDict[Tuple, ForkServer]" = collections.OrderedDict()
_servers_lock = threading.Lock()


def spawn_warm(python: str, preload: Sequence[str], env: Mapping[str, str]) -> Optional[ForkedProcess]:
    """A rank forked by this worker's fork server for (`python`, `preload`, `env`), started on
    first use and kept for the next job; None when no server can start it (the caller then
    starts a plain process)."""
    cwd = os.getcwd()
    key = _key(python, preload, env, cwd)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.gone and not server.failed:  # crashed: start another
            del _servers[key]
            server = None
        if server is None:
            for old_key, old in list(_servers.items()):
                if len(_servers) < MAX_SERVERS:
                    break
                if old.idle:
                    old.close()
                    del _servers[old_key]
            server = _servers[key] = ForkServer(python, preload, env, cwd, learn=LEARNED)
        _servers.move_to_end(key)
    if not server.usable:
        if server.failed and not server.gone:  # kept, closed, so that the next job does not retry
            log.info("fork server preload failed (%s); starting ranks as plain processes",
                     server.failed)
            server.close()
        return None
    try:
        return server.spawn(env)
    except OSError:
        log.debug("fork server could not start a rank", exc_info=True)
        return None


# ---- the server's side ---------------------------------------------------------------------
def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


#: Marks a name on the server's command line as one to learn, not to preload.
LEARN_MARK = "?"


def serve(sock: socket.socket, preload: Sequence[str], learn: Sequence[str] = ()) -> None:
    """Import `preload`, then fork a rank per request until the worker's end of `sock` closes;
    import a module of `learn` once a rank imported it and no rank runs."""
    failed = {}
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - reported; the worker starts plain ranks
            failed[name] = f"{type(exc).__name__}: {exc}"
    from . import rank_entry  # noqa: F401 - what every child runs

    _skip_library_teardown()
    _send(sock, {"ready": True, "failed": failed})
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so the wakeup fd is written
    signal.set_wakeup_fd(wake_w)
    # each rank writes, as it ends, the names of `learn` it imported (one write, < PIPE_BUF)
    learned_r, learned_w = os.pipe()
    os.set_blocking(learned_r, False)
    learning = _Learning(learn, learned_r)
    running = set()
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        selector.register(learned_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is sock:
                    try:
                        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 2)
                    except OSError:
                        data, fds = b"", []
                    if not data:
                        return  # the worker is gone
                    # used again: what an earlier job's ranks imported now pays off (a server
                    # that no job comes back to, as when Spark ends its worker, imports nothing)
                    learning.read()
                    learning.import_wanted()
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        sock.close()
                        for fd in (wake_r, wake_w, learned_r):
                            os.close(fd)
                        _become_rank(json.loads(data), fds, learned_w, learning.pending())
                    running.add(pid)
                    for fd in fds:
                        os.close(fd)
                    _send(sock, {"pid": pid})
                elif key.fileobj == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    running.difference_update(_reap(sock))
            # a rank writes before it exits: what it wrote is in the pipe when it is reaped
            learning.read()


class _Learning:
    """The server's side of `LEARNED`: which modules its ranks imported, imported when the
    server is used again."""

    def __init__(self, learn: Sequence[str], pipe: int) -> None:
        self.learn = tuple(learn)
        self.pipe = pipe
        self.wanted: List[str] = []
        self.tried: set = set()

    def pending(self) -> Tuple[str, ...]:
        """What a rank should report if it imports it: not imported here, not tried."""
        return tuple(n for n in self.learn if n not in sys.modules and n not in self.tried)

    def read(self) -> None:
        try:
            while True:
                data = os.read(self.pipe, 4096)
                if not data:
                    return
                for name in data.decode(errors="replace").split():
                    if name in self.pending() and name not in self.wanted:
                        self.wanted.append(name)
        except BlockingIOError:
            pass

    def import_wanted(self) -> None:
        while self.wanted:
            name = self.wanted.pop(0)
            self.tried.add(name)
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - the next jobs' ranks import it themselves
                pass
            _skip_library_teardown()  # of a learned torch too


def _skip_library_teardown() -> None:
    """Turn off the exit-time finalizers of the `torch.library` registrations made by the preload.

    At exit each one deregisters operators from the process's own dispatcher, which is pointless
    just before a rank's `os._exit`, and in a forked child slow: every write copies a page shared
    with the server (134 finalizers, 30-100 ms per rank exit here, against 1-2 ms without).
    Libraries a rank registers itself keep theirs.
    """
    library = sys.modules.get("torch.library")
    teardown = getattr(library, "_del_library", None)
    if teardown is None:
        return
    for obj in gc.get_objects():
        if type(obj) is weakref.finalize:  # type(): no __class__ property of a lazy module runs
            info = obj.peek()
            if info is not None and info[1] is teardown:
                obj.atexit = False


def _reap(sock: socket.socket) -> List[int]:
    """Report every child that has exited; their pids."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)
        _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _become_rank(request: dict, fds: List[int], learned: int = -1, learn: Sequence[str] = ()) -> None:
    """In the forked child, the server's own files closed: become what
    `python -m distributor.rank_entry` would be. Never returns.

    As it ends it writes to `learned` which modules of `learn` it imported (`LEARNED`)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a daemon's handler is its own
        os.setsid()
        stdout, stderr = fds
        null = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((null, 0), (stdout, 1), (stderr, 2)):
            os.dup2(source, target)
            os.close(source)
        os.environ.clear()
        os.environ.update(request["env"])
        if "cwd" in request:  # a server that serves several directories (`forkserver_daemon`)
            start = os.getcwd()
            os.chdir(request["cwd"])
            if sys.path and sys.path[0] == start:  # what ``-m`` put first: the rank's directory
                sys.path[0] = os.getcwd()
        os.environ[PARENT_PID_VAR] = str(os.getppid())  # this server, whose death ends the rank
        from . import rank_entry

        sys.argv = [rank_entry.__file__]
        random.seed()  # the children must not share the server's random state
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        code = rank_entry.main()
    except BaseException:  # noqa: BLE001 - as an uncaught exception would end a fresh rank
        traceback.print_exc()
    if learned >= 0:
        imported = " ".join(name for name in learn if name in sys.modules)
        try:
            if imported:
                os.write(learned, f"{imported}\n".encode())
            os.close(learned)
        except OSError:
            pass
    from . import rank_entry

    rank_entry._exit(code)


def main(argv: Sequence[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    names = argv[1:]
    try:
        serve(sock, [n for n in names if not n.startswith(LEARN_MARK)],
              [n[len(LEARN_MARK):] for n in names if n.startswith(LEARN_MARK)])
    finally:
        sock.close()


if __name__ == "__main__":
    main(sys.argv[1:])
