"""A fork server that outlives the launch that started it: warm ranks for the next launch too.

`forkserver` keeps a warm Python beside a reused Spark Python worker. A command-line launch
(``horovodrun``, `distributor.run` from a script) has no such worker: each launch is a new driver
process, and each rank of each launch would pay its imports again (``import tensorflow``: 4-6 s of
CPU; ``import torch``: 1.5-2 s). Here the first launch starts a *daemon*: ``python -m
distributor.forkserver_daemon``, a `forkserver` that listens on a Unix socket instead of one
socket pair, serves one launch per connection, and stays after its launch for
`DaemonSettings.idle_seconds` (default `DEFAULT_IDLE_SECONDS`). It
starts with nothing but the engine imported and *learns* (`LEARNED`: torch, the ``torch._dynamo``
that torch imports at a rank's first optimizer, TensorFlow) what
its ranks imported: when the next launch connects, it imports that once (the launch waits for it,
about as long as one of its ranks would have taken to import it) and forks that launch's ranks,
and every later launch's, with it imported. A server no launch comes back to costs no import.
A daemon started for a launch whose script imports one of them (`DaemonSettings.expect`)
imports it when that launch connects, before it forks the ranks: once, where each rank would
have imported it. A rank is set up as `forkserver` sets up any rank, in the launch's
working directory.

Whom it serves, and what it refuses:

* Only its owner. The socket and a 0600 secret file live in a private directory (0700, owned by
  this user: `DaemonSettings.directory`, else ``$XDG_RUNTIME_DIR/distributor-warm``, else
  ``/tmp/distributor-warm-UID``); a directory that is anyone else's, or open to others, is not
  used. A peer of another user id (``SO_PEERCRED``) is closed at once; the others must answer the
  mutual HMAC challenge over that secret (`protocol.Challenge`, as the driver hub's) before
  anything else they send is read. Messages are JSON (no pickle); each rank still proves its
  job's own secret to its driver's hub.
* Only launches whose ranks it would have started the same way: one daemon per (Python, learned
  modules, environment minus what differs per job and per rank), as for `forkserver` (plus the
  shell's bookkeeping variables, `VOLATILE_VARS`, which no module reads at import).
* Not once any module it imported has changed on disk (a ``pip install``, an edited source file):
  a connection finds it *stale*; it stops listening, ends when its running ranks have, and the
  launch starts a fresh daemon.

A launch's ranks die with its connection (the daemon kills what a closed connection left
running) and with the daemon (``PR_SET_PDEATHSIG``); a rank whose driver is gone ends itself
(`rank_entry`). The daemon's pid file (``KEY-PID.pid``) lets whoever cleans up stop it by PID.
"""
from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import inspect
import json
import logging
import os
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import forkserver, protocol
from .errors import LaunchValidationError

log = logging.getLogger(__name__)

#: How long a daemon waits, with no launch connected and no rank running, before it exits.
DEFAULT_IDLE_SECONDS = 300.0
#: What a daemon imports between launches once one of its ranks has: modules that cost seconds,
#: checked safe to fork after (no thread, no device context at import).
LEARNED: Tuple[str, ...] = ("torch", "torch._dynamo", "tensorflow")
#: Variables a shell or test runner changes from command to command; not part of a daemon's key.
VOLATILE_VARS = ("_", "PWD", "OLDPWD", "SHLVL", "PYTEST_CURRENT_TEST")
#: How long a launch waits for a daemon it started to listen.
START_SECONDS = 30.0
#: Marks a name of `LEARNED` on a new daemon's command line as one its first launch expects.
EXPECT_MARK = "!"
#: Longest Unix socket path Linux accepts (sun_path, with its terminating NUL).
_MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class DaemonSettings:
    """How a launch uses the daemons: `idle_seconds` a daemon stays with nothing to do (it is
    started with the launch's settings), `directory` the private directory (None: the default,
    ``$XDG_RUNTIME_DIR/distributor-warm`` or ``/tmp/distributor-warm-UID``), `expect` the modules
    the launch's ranks will import (`imported_modules` of its script): a daemon started for this
    launch imports those of `LEARNED` before it forks the ranks, once instead of once per rank."""

    idle_seconds: float = DEFAULT_IDLE_SECONDS
    directory: Optional[str] = None
    expect: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        seconds = self.idle_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not 0 < seconds < float("inf"):
            raise LaunchValidationError(
                f"idle_seconds must be a positive number of seconds, got {seconds!r}")
        if not isinstance(self.expect, tuple) or not all(isinstance(n, str) for n in self.expect):
            raise LaunchValidationError(f"expect must be a tuple of module names, got {self.expect!r}")


def private_dir(settings: DaemonSettings) -> Optional[str]:
    """This user's daemon directory, created 0700 if missing; None (logged) if it is unsafe."""
    path = settings.directory or (
        os.path.join(os.environ["XDG_RUNTIME_DIR"], "distributor-warm")
        if os.environ.get("XDG_RUNTIME_DIR") else f"/tmp/distributor-warm-{os.getuid()}")
    problem = private_dir_problem(path)
    if problem is not None:
        log.log(logging.WARNING if os.path.lexists(path) else logging.INFO,
                "no warm fork server: %s", problem)
        return None
    return path


def private_dir_problem(path: str) -> Optional[str]:
    """Create the directory `path` (mode 0700; its parent must exist) if it is missing. None if it
    is then a directory of this user that no one else can open, else what is wrong with it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {path} ({exc})"
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return (f"{path} must be a directory of this user that no one else can open (mode 0700); "
                "fix or remove it")
    return None


def _secret(directory: str) -> bytes:
    """The directory's secret (created on first use, readable by this user only)."""
    path = os.path.join(directory, "secret")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path, "rb") as handle:
            return handle.read()
    value = protocol.new_secret()
    with os.fdopen(fd, "wb") as handle:
        handle.write(value)
    return value


def daemon_key(python: str, env: Mapping[str, str], learn: Sequence[str] = LEARNED) -> str:
    """The name of the daemon that serves ranks of `python` with environment `env`."""
    startup = forkserver.startup_environment(env)
    for name in VOLATILE_VARS:
        startup.pop(name, None)
    text = json.dumps([os.path.realpath(python), list(learn), sorted(startup.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def sets_environment(path: str) -> bool:
    """Whether the Python file `path` may set environment variables itself (``os.environ[...] =``,
    ``.update``, ``.setdefault``, ``putenv``...), or cannot be read or parsed. Such a script runs
    in a new process: a variable it sets before ``import torch`` (``OMP_NUM_THREADS``, read when
    the OpenMP runtime loads) or ``import tensorflow`` would come too late for modules the daemon
    imported already."""
    try:
        with open(path, "rb") as handle:
            return _tree_sets_environment(ast.parse(handle.read(), path))
    except (OSError, SyntaxError, ValueError):
        return True


def imported_modules(path: str) -> FrozenSet[str]:
    """The dotted names the Python file `path` imports anywhere in it (``import a.b``: ``a.b``;
    ``from a import b``: ``a`` and ``a.b``, whether ``b`` is a module or not); relative imports
    left out; empty where the file cannot be read or parsed."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    return frozenset(names)


def function_sets_environment(fn: object) -> bool:
    """`sets_environment` for a function: its own source (not that of the functions it calls);
    True where the source cannot be found."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))  # type: ignore[arg-type]
        return _tree_sets_environment(ast.parse(source))
    except (OSError, TypeError, SyntaxError, ValueError):
        return True


def _tree_sets_environment(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and _is_environ(node.value):
            return True
        if isinstance(node, ast.Attribute) and (node.attr in ("putenv", "unsetenv") or (
                node.attr in ("update", "setdefault", "pop", "popitem", "clear")
                and _is_environ(node.value))):
            return True
        if isinstance(node, ast.Name) and node.id in ("putenv", "unsetenv"):
            return True
    return False


def _is_environ(node: ast.AST) -> bool:
    """``os.environ``, ``environ`` (``from os import environ``), or their bytes forms."""
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb")
            or isinstance(node, ast.Name) and node.id in ("environ", "environb"))


def module_file(name: str, directory: str) -> Optional[str]:
    """The file ``python -m name`` run in `directory` would run, found without importing
    anything (a package's ``__main__.py``); None if it cannot be found that way."""
    from importlib.machinery import PathFinder  # (the driver never needs it otherwise)

    path: Optional[List[str]] = [directory, *sys.path[1:]]
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if i < len(parts) - 1 and path is None:
            return None
    if spec is not None and spec.submodule_search_locations is not None:  # a package
        spec = PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
    return spec.origin if spec is not None and spec.has_location else None


def server_pids(directory: str) -> List[int]:
    """The PIDs of the daemons whose private directory is `directory`, from their pid files
    (``KEY-PID.pid``): whoever cleans up (a test run, a benchmark) stops them by these."""
    return sorted(int(name[:-4].rsplit("-", 1)[1]) for name in os.listdir(directory)
                  if name.endswith(".pid"))


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---- the launch's side ---------------------------------------------------------------------
def connect(python: str, env: Mapping[str, str],
            settings: DaemonSettings = DaemonSettings()) -> Optional[forkserver.ForkServer]:
    """A connection to this user's daemon for (`python`, `env`), started if none runs; None
    where none can be used (unsafe directory, the daemon failed to start)."""
    directory = private_dir(settings)
    if directory is None:
        return None
    key = daemon_key(python, env)
    path = os.path.join(directory, f"{key}.sock")
    if len(path.encode()) > _MAX_SOCKET_PATH:
        log.info("no warm fork server: socket path %s is too long", path)
        return None
    secret = _secret(directory)
    with _locked(os.path.join(directory, f"{key}.lock")):
        server = _try(path, secret)
        if server is None:
            if not _start(python, env, directory, key, settings.idle_seconds, settings.expect):
                return None
            server = _try(path, secret)
    return server


def _try(path: str, secret: bytes) -> Optional[forkserver.ForkServer]:
    """A ready connection to the daemon listening at `path`, or None (none, or stale)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(START_SECONDS)
        sock.connect(path)
        # both prove the directory's secret; a daemon importing what it learned answers after
        protocol.client_handshake(sock, secret, timeout=forkserver.SPAWN_TIMEOUT)
        sock.settimeout(forkserver.SPAWN_TIMEOUT)  # (as long as a rank may take to import them)
        reply = json.loads(sock.recv(forkserver.MAX_MESSAGE) or b"{}")
    except (OSError, ValueError):
        sock.close()
        return None
    if not reply.get("ready"):
        sock.close()  # stale (it stopped listening) or refused
        return None
    sock.settimeout(None)
    return forkserver.ForkServer.connected(sock)


def _start(python: str, env: Mapping[str, str], directory: str, key: str, idle: float,
           expect: Sequence[str] = ()) -> bool:
    """Start the daemon `key` and wait until it listens; False if it could not. It imports the
    modules of `LEARNED` that `expect` names when its first launch connects."""
    ready_r, ready_w = os.pipe()
    try:
        environment = forkserver.startup_environment(env)
        proc = subprocess.Popen(
            [python, "-m", "distributor.forkserver_daemon", directory, key, str(idle), str(ready_w),
             *(f"{EXPECT_MARK}{name}" if name in expect else name for name in LEARNED)],
            env=environment, cwd=directory, pass_fds=[ready_w], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(ready_r)
        return False
    finally:
        os.close(ready_w)
    proc.wait()  # the first process forks the daemon and exits
    with os.fdopen(ready_r, "rb") as ready:
        return ready.read(1) == b"1"  # EOF without it: the daemon failed before it listened


# ---- the daemon's side ---------------------------------------------------------------------
def _module_files() -> Dict[str, int]:
    """Modification times of the files of every imported module (and of the interpreter)."""
    times = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            try:
                times[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass
    times[sys.executable] = os.stat(sys.executable).st_mtime_ns
    return times


def _changed(files: Mapping[str, int]) -> bool:
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


_PEERCRED = struct.Struct("3i")


def _same_user(conn: socket.socket) -> bool:
    try:
        _pid, uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return False
    return uid == os.getuid()


class _Daemon:
    """The listening server: launches (connections), their ranks, learning, idleness."""

    def __init__(self, listener: socket.socket, path: str, secret: bytes, idle: float,
                 learn: Sequence[str], expected: Sequence[str] = ()) -> None:
        self.listener, self.path, self.secret, self.idle = listener, path, secret, idle
        self.selector = selectors.DefaultSelector()
        self.owner: Dict[int, socket.socket] = {}  # running rank pid -> its launch's connection
        self.trusted: set = set()  # connections that proved the secret
        self.challenges: Dict[socket.socket, protocol.Challenge] = {}  # those yet to prove it
        self.listening = True
        self.wake_r, self.wake_w = os.pipe()
        self.learned_r, self.learned_w = os.pipe()
        for fd in (self.wake_r, self.wake_w, self.learned_r):
            os.set_blocking(fd, False)
        self.learning = forkserver._Learning(learn, self.learned_r)
        self.learning.wanted.extend(expected)  # imported when the first launch connects
        self.files = _module_files()

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
        signal.set_wakeup_fd(self.wake_w)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.selector.register(self.learned_r, selectors.EVENT_READ)
        idle_since: Optional[float] = time.monotonic()
        while True:
            timeout: Optional[float] = None
            if self.owner or self.trusted:
                idle_since = None
            else:
                if not self.listening:
                    return  # stale, and the last launch it served is over
                if idle_since is None:
                    idle_since = time.monotonic()
                timeout = idle_since + self.idle - time.monotonic()
                if timeout <= 0:
                    return
            for key, _ in self.selector.select(timeout):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wake_r:
                    self._reap()
                elif key.fileobj == self.learned_r:
                    self.learning.read()
                else:
                    self._message(key.fileobj)
            self.learning.read()  # a rank writes before it exits: it is in the pipe when reaped

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if not _same_user(conn):
            conn.close()
            return
        challenge = self.challenges[conn] = protocol.Challenge(self.secret)
        self.selector.register(conn, selectors.EVENT_READ)
        try:
            conn.send(challenge.nonce)
        except OSError:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        """A launch is over: kill what it left running (each rank leads its own session)."""
        self.selector.unregister(conn)
        self.trusted.discard(conn)
        self.challenges.pop(conn, None)
        conn.close()
        for pid, owner in list(self.owner.items()):
            if owner is conn:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)

    def _message(self, conn: socket.socket) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, forkserver.MAX_MESSAGE, 2)
        except OSError:
            data, fds = b"", []
        if conn not in self.trusted:  # its answer to the challenge, and nothing else
            for fd in fds:
                os.close(fd)
            try:
                conn.send(self.challenges.pop(conn).answer(data))
            except (protocol.AuthenticationError, OSError):
                self._drop(conn)
                return
            if self.listening and _changed(self.files):  # stale: a new daemon serves from now on
                self.listening = False
                self.selector.unregister(self.listener)
                self.listener.close()
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            if not self.listening:
                self._drop(conn)
                return
            if self.learning.wanted:  # used again (or expected): now its imports pay off
                self.learning.import_wanted()
                self.files = _module_files()
            self.trusted.add(conn)
            forkserver._send(conn, {"ready": True, "failed": {}})
            return
        if not data or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            self._drop(conn)
            return
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            for sock in (self.listener, *self.trusted):
                sock.close()
            for fd in (self.wake_r, self.wake_w, self.learned_r):
                os.close(fd)
            forkserver._become_rank(json.loads(data), fds, self.learned_w, self.learning.pending())
        for fd in fds:
            os.close(fd)
        self.owner[pid] = conn
        with contextlib.suppress(OSError):
            forkserver._send(conn, {"pid": pid})

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.owner.pop(pid, None)
            if conn is not None and conn in self.trusted:
                with contextlib.suppress(OSError):
                    forkserver._send(conn, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def main(argv: Sequence[str]) -> None:
    directory, key, idle, ready_fd, *learn = argv
    if os.fork():  # the launch reaps this first process at once; the daemon is init's child
        os._exit(0)
    path = os.path.join(directory, f"{key}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead daemon's: the launch holds the key's lock
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    pid_file = os.path.join(directory, f"{key}-{os.getpid()}.pid")
    with open(pid_file, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    from . import rank_entry  # noqa: F401 - what every rank runs

    names = [name.lstrip(EXPECT_MARK) for name in learn]
    expected = [name.lstrip(EXPECT_MARK) for name in learn if name.startswith(EXPECT_MARK)]
    daemon = _Daemon(listener, path, _secret(directory), float(idle), names, expected)

    bound = os.stat(path).st_ino

    def leave(*_: object) -> None:
        with contextlib.suppress(OSError):  # not once a successor's socket is there
            if daemon.listening and os.stat(path).st_ino == bound:
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.unlink(pid_file)
        os._exit(0)  # its ranks die with it (PR_SET_PDEATHSIG)

    signal.signal(signal.SIGTERM, leave)  # stopped by PID, even in the middle of an import
    os.write(int(ready_fd), b"1")
    os.close(int(ready_fd))
    try:
        daemon.run()
    finally:
        leave()


if __name__ == "__main__":
    main(sys.argv[1:])
