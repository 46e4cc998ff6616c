"""The fuzz harness: attack every socket a real job listens on while it runs, and check that the
job does not notice.

A run starts ``horovodrun -np NP python train_program.py`` (mode ``fixed``) or ``horovodrun -np NP
--min-np 1 -H localhost:NP ...`` (mode ``elastic``, whose driver also hosts the job's c10d store),
with the TCP mesh carrying the ranks' negotiation and allreduce data
(``HOROVOD_COMPAT_SHM_CONTROL=0``), finds the job's listening sockets in ``/proc`` (`listeners`)
and fuzzes them:

* **set-up**: the program holds each rank just before it connects its TCP mesh (`train_program`,
  ``FUZZ_HOLD_DIR``) and prints its mesh listener; the harness queues ``SETUP_IDLE`` silent
  connections (and one of each other attack) on every rank's mesh listener ahead of the ranks' own,
  then lets the ranks go: the job must still start (issue 28: one silent stranger stopped a job
  from starting);
* **steady state**: ``FUZZ_WORKERS`` threads open connections to a random listener (the seed
  decides which and what) from then until the job printed its last step or ``seconds`` passed
  after its first, each one of `ATTACKS`: ``random`` bytes, an ``oversized`` length header,
  ``forged`` authentication (a wrong answer to the challenge, then frames whose unpickling would
  create the run's marker file), a ``replayed`` genuine handshake answer and frame (captured from
  a handshake the harness made with the job's secret, read from a rank's ``/proc/PID/environ``),
  ``idle`` connections (held open, ``IDLE_PER_LISTENER`` at a time) and ``drip`` connections (a
  byte every ``DRIP_SECONDS``);
* meanwhile **genuine peers**: every ``PROBE_SECONDS`` the harness authenticates to the hub with
  the job's secret (a fixed-size job: an elastic job's workers fork from a fork server, so no
  process of it shows the secret) and talks to the job's c10d store as a torch client: both must
  answer.

Listener kinds (`Listener.kind`): ``hub`` (the driver hub), ``store`` (torch's c10d ``TCPStore``:
rank 0's on ``MASTER_PORT``, or the elastic job's on the driver), ``gloo`` (torch's gloo
listeners in the ranks), ``mesh`` (our TCP mesh, open during set-up only).

Right (`Outcome.problems` is empty): the job exits 0 with the unfuzzed run's results (`baseline`,
`check_against`); the marker file never appears (nothing was unpickled); each rank's and the
driver's memory grew by less than ``RSS_BOUND_MB`` while it was fuzzed; no rank went
``STALL_BOUND`` seconds without a step; every genuine probe was admitted; every listener of the
job is on loopback (every rank is local); and nothing of the run is left running (every process
carries ``FUZZ_MARKER``). `Outcome.line` prints the figures: connections per listener kind, the
longest gap between two steps, memory and descriptor growth.

`gloo_flood` is the descriptor guard's check: a job whose ranks start with a soft limit of 1024
open files, and more than that many stray connections to rank 0's gloo listeners (gloo keeps each
open until the job ends); the job must finish as the unfuzzed one did.

``python tests/fuzz/harness.py fixed|elastic|flood SEED [SECONDS]`` runs one job after its
baseline and prints its figures.
"""
from __future__ import annotations

import collections
import hmac
import os
import pickle
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # tests/, for `procs` when run as a script
    sys.path.insert(0, str(HERE.parent))

from procs import left_after, processes_with, sigkill  # noqa: E402

from distributor import protocol  # noqa: E402
from distributor.rank_entry import raise_open_file_limit  # noqa: E402
from distributor.rank_env import HUB_ADDRESS_VAR, SECRET_VAR  # noqa: E402

PROGRAM = HERE / "train_program.py"
NP = 2
MODES = ("fixed", "elastic")
ATTACKS = ("random", "oversized", "forged", "replayed", "idle", "drip")
MARKER_VAR = "FUZZ_MARKER"
#: Steps of a run by default (the fuzz stops at the last one, or `seconds` after the first).
STEPS = 150
#: Silent connections queued on each rank's mesh listener before the ranks connect.
SETUP_IDLE = 8
FUZZ_WORKERS = 2
#: Most connections each fuzz thread opens per second (the job shares the machine's cores).
RATE = float(os.environ.get("FUZZ_RATE", "150"))
#: Idle connections held open at once per listener, drip connections in all (oldest closed first).
IDLE_PER_LISTENER = 32
DRIPS = 64
DRIP_SECONDS = 0.5
PROBE_SECONDS = 1.0
RSS_BOUND_MB = float(os.environ.get("FUZZ_RSS_BOUND_MB", "64"))
STALL_BOUND = float(os.environ.get("FUZZ_STALL_BOUND", "20"))
RUN_TIMEOUT = float(os.environ.get("FUZZ_RUN_TIMEOUT", "180"))
#: `gloo_flood`: the ranks' soft limit on open files when they start, and the strays sent.
FLOOD_SOFT_LIMIT = 1024
FLOOD_CONNECTIONS = 2000

_PID = re.compile(r"fuzz-pid rank=(\d+) pid=(\d+)")
_MESH = re.compile(r"fuzz-mesh rank=(\d+) port=(\d+)")
_STEP = re.compile(r"step (\d+) rank (\d+) ")
_RESULT = re.compile(r"fuzz-result rank=(\d+) (.*)$")


@dataclass(frozen=True)
class Listener:
    kind: str  # hub | store | gloo | mesh
    pid: int
    bound: str  # the address it listens on ("::" / "0.0.0.0": every interface)
    port: int

    @property
    def address(self) -> Tuple[str, int]:
        """Where to connect to it."""
        return ("127.0.0.1" if self.bound in ("0.0.0.0", "::") else self.bound), self.port

    @property
    def loopback(self) -> bool:
        return self.bound.startswith("127.") or self.bound == "::1"


@dataclass
class Outcome:
    mode: str
    seed: int
    fuzzed: bool
    returncode: Optional[int] = None
    results: Dict[int, str] = field(default_factory=dict)
    connections: Dict[str, collections.Counter] = field(default_factory=dict)
    listeners: List[Listener] = field(default_factory=list)
    max_stall: float = 0.0
    rss_growth_mb: Dict[str, float] = field(default_factory=dict)
    fd_growth: Dict[str, int] = field(default_factory=dict)
    probes: collections.Counter = field(default_factory=collections.Counter)
    fuzz_seconds: float = 0.0
    seconds: float = 0.0
    problems: List[str] = field(default_factory=list)
    output: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def total(self) -> int:
        return sum(sum(c.values()) for c in self.connections.values())

    def line(self) -> str:
        kinds = " ".join(f"{kind}={sum(c.values())}" for kind, c in sorted(self.connections.items()))
        rss = max(self.rss_growth_mb.values(), default=0.0)
        fds = " ".join(f"{who}:{n:+d}" for who, n in sorted(self.fd_growth.items()))
        probes = " ".join(f"{k}={v}" for k, v in sorted(self.probes.items()))
        verdict = "ok" if self.ok else "FAILED: " + "; ".join(self.problems)
        return (f"fuzz mode={self.mode} seed={self.seed} connections={self.total} ({kinds}) "
                f"fuzzed_for={self.fuzz_seconds:.1f}s max_step_stall={self.max_stall:.2f}s "
                f"max_rss_growth={rss:.1f}MB fds=[{fds}] probes=[{probes}] "
                f"job={self.seconds:.1f}s rc={self.returncode} {verdict}")

    def table(self) -> str:
        """Connections per listener kind and attack, and where each kind listens."""
        bound = collections.defaultdict(set)
        for l in self.listeners:
            bound[l.kind].add(l.bound)
        return "\n".join(
            f"  {kind:6s} " + " ".join(f"{a}={c.get(a, 0)}" for a in ATTACKS)
            + (f"  (listening on {', '.join(sorted(bound[kind]))})" if bound.get(kind) else "")
            for kind, c in sorted(self.connections.items()))


# -- what the job listens on -----------------------------------------------------------------------
def _socket_inodes(pid: int) -> Dict[int, int]:
    """{socket inode: pid} of process `pid` (empty once it is gone)."""
    found = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = pid
    return found


def _listening() -> Dict[int, Tuple[str, int]]:
    """{inode: (bound address, port)} of every listening TCP socket of this host."""
    found = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if parts[3] != "0A":  # LISTEN
                continue
            addr, port = parts[1].rsplit(":", 1)
            if len(addr) == 8:
                host = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(addr, 16)))
            else:  # four little-endian 32-bit words
                words = [struct.pack("<I", int(addr[i:i + 8], 16)) for i in range(0, 32, 8)]
                host = socket.inet_ntop(socket.AF_INET6, b"".join(words))
            found[int(parts[9])] = (host, int(port, 16))
    return found


def listeners(driver: int, pids: List[int], hub_port: int, store_port: int) -> List[Listener]:
    """The listening sockets of the job's processes `pids`, by kind: the driver's on `hub_port`
    is the hub, any other of the driver's a store (an elastic job's); a rank's on `store_port`
    is rank 0's store, its others gloo's (mesh listeners are announced by the program)."""
    owners: Dict[int, int] = {}
    for pid in pids:
        owners.update(_socket_inodes(pid))
    found = []
    for inode, (host, port) in _listening().items():
        pid = owners.get(inode)
        if pid is None:
            continue
        if pid == driver:
            kind = "hub" if port == hub_port else "store"
        else:
            kind = "store" if port == store_port else "gloo"
        found.append(Listener(kind, pid, host, port))
    return sorted(found, key=lambda l: (l.kind, l.port))


def _environ(pid: int) -> Dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _hub_and_secret(pids: List[int], driver: int) -> Tuple[Optional[bytes], Optional[Tuple[str, int]], int]:
    """(the job's secret, the hub's address, rank 0's store port) from the environment every rank
    process of a fixed-size job was started with. An elastic job's workers fork from a fork
    server that never had them: there the secret is unknown, the hub is the driver's listener
    that sends a challenge on connect, and the store is the driver's other listener (port 0)."""
    for pid in pids:
        env = _environ(pid)
        if SECRET_VAR in env and HUB_ADDRESS_VAR in env:
            host, port = env[HUB_ADDRESS_VAR].rsplit(":", 1)
            return (bytes.fromhex(env[SECRET_VAR]), (host, int(port)),
                    int(env.get("MASTER_PORT", "0") or 0))
    owned = _socket_inodes(driver)
    for inode, (host, port) in _listening().items():
        if inode not in owned:
            continue
        address = Listener("?", driver, host, port).address
        try:
            with socket.create_connection(address, timeout=3) as s:
                s.settimeout(3)
                if len(s.recv(64)) == 32:
                    return None, address, 0
        except OSError:
            continue
    return None, None, 0


def _status_kb(pid: int, name: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for row in f:
                if row.startswith(name + ":"):
                    return int(row.split()[1])
    except OSError:
        pass
    return None


def _fds(pid: int) -> Optional[int]:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# -- attacks ---------------------------------------------------------------------------------------
def malicious_pickle(marker: Path) -> bytes:
    """A pickle whose loading creates `marker` (and does nothing else)."""

    class _Marker:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(_Marker())


def _frame(kind: int, body: bytes) -> bytes:
    """A frame as `distributor.protocol.Channel` sends it."""
    return bytes([kind]) + len(body).to_bytes(8, "big") + body


class Fuzzer:
    """Threads that attack `targets` (updated as the job's listeners change) until `stop`."""

    def __init__(self, seed: int, marker: Path, secret: Optional[bytes]) -> None:
        self.seed, self.secret = seed, secret
        self.counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.targets: List[Listener] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._held: Dict[Listener, collections.deque] = collections.defaultdict(collections.deque)
        self._drips: collections.deque = collections.deque()
        self._threads: List[threading.Thread] = []
        self._pickle = malicious_pickle(marker)
        #: what a genuine client sent in one handshake with the hub, and a frame (`capture_from`)
        self._replay: Optional[Tuple[bytes, bytes]] = None

    def capture_from(self, hub: Tuple[str, int]) -> None:
        """Make one genuine handshake with the hub and keep what this side sent, to replay."""
        assert self.secret is not None
        with socket.create_connection(hub, timeout=10) as s:
            nonce = protocol.recv_exact(s, 32, time.monotonic() + 10)
            answer = hmac.new(self.secret, nonce + b"client", "sha256").digest() + os.urandom(32)
            s.sendall(answer)
            protocol.recv_exact(s, 32, time.monotonic() + 10)  # the hub's answer: admitted
        self._replay = (answer, _frame(protocol.Kind.HEARTBEAT, pickle.dumps(())))

    def one(self, target: Listener, attack: str, rng: random.Random) -> None:
        """One connection to `target` carrying `attack`."""
        try:
            s = socket.create_connection(target.address, timeout=5)
        except OSError:
            self._count(target, attack + "-refused")
            return
        self._count(target, attack)
        keep = False
        try:
            s.settimeout(2)
            if attack == "random":
                s.sendall(rng.randbytes(rng.choice((1, 7, 64, 300, 4096, 65536))))
            elif attack == "oversized":
                head = rng.choice((
                    bytes([rng.randrange(256)]) + (1 << 63).to_bytes(8, "big"),  # our frame header
                    b"\x01" + (1 << 62).to_bytes(8, "little"),        # c10d SET, key length 2**62
                    b"\x03" + (0xFFFFFFFFFFFF).to_bytes(8, "little"),  # c10d GET, key length 2**48
                    b"\xff" * 32,                                       # any size field, all ones
                ))
                s.sendall(head + rng.randbytes(rng.randrange(0, 512)))
            elif attack == "forged":
                if target.kind == "hub":  # (a held mesh listener answers no one yet)
                    s.recv(32)
                s.sendall(rng.randbytes(protocol.REPLY_BYTES) + _frame(protocol.Kind.RESULT, self._pickle)
                          + _frame(protocol.Kind.HELLO, self._pickle))
            elif attack == "replayed":
                if target.kind == "hub":
                    s.recv(32)
                answer, frame = self._replay or (rng.randbytes(protocol.REPLY_BYTES),
                                                 _frame(protocol.Kind.HEARTBEAT, pickle.dumps(())))
                tag = struct.pack("<I", 1) if target.kind == "mesh" else b""  # a mesh rank index
                s.sendall(answer + tag + frame + _frame(protocol.Kind.HELLO, self._pickle))
            elif attack == "idle":
                keep = True
                with self._lock:
                    held = self._held[target]
                    held.append(s)
                    if len(held) > IDLE_PER_LISTENER:
                        held.popleft().close()
            elif attack == "drip":
                keep = True
                s.setblocking(False)
                with self._lock:
                    self._drips.append(s)
                    if len(self._drips) > DRIPS:
                        self._drips.popleft().close()
        except OSError:
            pass  # the server hung up on us: fine
        finally:
            if not keep:
                s.close()

    def _count(self, target: Listener, attack: str) -> None:
        with self._lock:
            self.counts[target.kind][attack] += 1

    def _worker(self, index: int) -> None:
        rng = random.Random(f"{self.seed}:{index}")
        pause = 1.0 / RATE
        while not self._stop.is_set():
            targets = [t for t in self.targets if t.kind != "mesh"]
            if not targets:
                self._stop.wait(0.05)
                continue
            started = time.monotonic()
            self.one(rng.choice(targets), rng.choice(ATTACKS), rng)
            self._stop.wait(max(0.0, pause - (time.monotonic() - started)))

    def _dripper(self) -> None:
        rng = random.Random(f"{self.seed}:drip")
        while not self._stop.wait(DRIP_SECONDS):
            with self._lock:
                drips = list(self._drips)
            for s in drips:
                try:
                    s.send(rng.randbytes(1))
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # the server closed it (or we did, beyond DRIPS)
                    with self._lock:
                        if s in self._drips:
                            self._drips.remove(s)
                    s.close()

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._worker, args=(i,), daemon=True)
                         for i in range(FUZZ_WORKERS)]
        self._threads.append(threading.Thread(target=self._dripper, daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        with self._lock:
            for held in self._held.values():
                while held:
                    held.popleft().close()
            while self._drips:
                self._drips.popleft().close()


def _genuine_hub(hub: Tuple[str, int], secret: bytes) -> bool:
    """Whether the hub admits a peer that proves the secret."""
    try:
        with socket.create_connection(hub, timeout=protocol.HANDSHAKE_TIMEOUT) as sock:
            protocol.client_handshake(sock, secret)
        return True
    except (OSError, protocol.AuthenticationError):
        return False


def _genuine_store(address: Tuple[str, int], n: int) -> bool:
    """Whether the c10d store serves a torch client (a key of its own, set, read, deleted)."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        client = dist.TCPStore(address[0], address[1], is_master=False, timeout=timedelta(seconds=10))
        key = f"fuzz-probe/{os.getpid()}/{n}"
        client.set(key, b"genuine")
        ok = client.get(key) == b"genuine"
        client.delete_key(key)
        return ok
    except Exception:  # noqa: BLE001 - any failure is a failed probe
        return False


# -- a job -----------------------------------------------------------------------------------------
class _Job:
    """One ``horovodrun`` of the program, its output parsed as it comes."""

    def __init__(self, mode: str, workdir: Path, out: Outcome, hold: bool, steps: int,
                 nofile_soft: Optional[int] = None) -> None:
        self.out, self.steps_wanted = out, steps
        self.marker = uuid.uuid4().hex
        self.hold = workdir / "hold"
        self.hold.mkdir(parents=True, exist_ok=True)
        # ranks as new processes: the harness reads the job's secret and rank 0's store port
        # from a rank's /proc/PID/environ, where a rank forked by a warm fork server shows the
        # server's (which has neither); the listeners are the same either way
        env = {**os.environ, MARKER_VAR: self.marker, "PYTHONUNBUFFERED": "1",
               "FUZZ_STEPS": str(steps), "HOROVOD_COMPAT_SHM_CONTROL": "0",
               "HOROVOD_COMPAT_WARM_SECONDS": "0"}
        for name in ("FUZZ_ELASTIC", "FUZZ_HOLD_DIR"):
            env.pop(name, None)
        if mode == "elastic":
            env["FUZZ_ELASTIC"] = "1"
        if hold:
            env["FUZZ_HOLD_DIR"] = str(self.hold)
        argv = [sys.executable, "-m", "horovod_compat.run", "-np", str(NP)]
        if mode == "elastic":
            argv += ["--min-np", "1", "-H", f"localhost:{NP}"]
        argv += [sys.executable, str(PROGRAM)]

        def limit_files() -> None:
            if nofile_soft is not None:
                _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_soft, hard))

        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", start_new_session=True,
                                     preexec_fn=limit_files)
        self.rank_pids: Dict[int, int] = {}
        self.mesh_ports: Dict[int, int] = {}
        self.steps: Dict[int, List[float]] = collections.defaultdict(list)
        self.all_held = threading.Event()
        self.first_step = threading.Event()
        self.last_step = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.out.output.append(line)
            m = _STEP.search(line)
            if m:
                self.steps[int(m.group(2))].append(time.monotonic())
                self.first_step.set()
                if int(m.group(1)) >= self.steps_wanted - 1:
                    self.last_step.set()
                continue
            m = _PID.search(line)
            if m:
                self.rank_pids[int(m.group(1))] = int(m.group(2))
            m = _MESH.search(line)
            if m:
                self.mesh_ports[int(m.group(1))] = int(m.group(2))
                if len(self.mesh_ports) == NP:
                    self.all_held.set()
            m = _RESULT.search(line)
            if m:
                self.out.results[int(m.group(1))] = m.group(2)

    def pids(self) -> List[int]:
        return processes_with(f"{MARKER_VAR}={self.marker}")

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, event: threading.Event) -> bool:
        """Wait for `event` while the job runs (at most half of ``RUN_TIMEOUT``)."""
        deadline = time.monotonic() + RUN_TIMEOUT / 2
        while not event.wait(0.1):
            if not self.running() or time.monotonic() > deadline:
                return event.is_set()
        return True

    def release(self) -> None:
        """Let ranks held before their mesh set-up go on."""
        (self.hold / "go").touch()

    def finish(self) -> None:
        """Wait for the job's end (SIGKILL to its process group past ``RUN_TIMEOUT``); then the
        exit status, the longest gap between two steps, and what was left running."""
        out = self.out
        try:
            out.returncode = self.proc.wait(
                timeout=max(1.0, RUN_TIMEOUT - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            out.problems.append(f"still running {RUN_TIMEOUT:g}s after the start")
            self.kill()
        out.seconds = time.monotonic() - self.started
        self._reader.join(timeout=10)
        gaps = [b - a for times in self.steps.values() for a, b in zip(times, times[1:])]
        out.max_stall = max(gaps, default=0.0)
        left = left_after(f"{MARKER_VAR}={self.marker}", timeout=10)
        if left:
            out.problems.append(f"processes left running: {left}")
            sigkill(left)

    def kill(self) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.out.returncode = self.proc.wait()


class _Watch:
    """Resident memory and open descriptors of the ranks' training processes and the driver,
    from a starting point: growth = the highest seen since (`sample`), minus the start."""

    def __init__(self, job: _Job) -> None:
        self.pids = {f"rank{r}": pid for r, pid in job.rank_pids.items()}
        self.pids["driver"] = job.proc.pid
        self.start = {who: (_status_kb(pid, "VmRSS"), _fds(pid)) for who, pid in self.pids.items()}
        self.peak = dict(self.start)

    def sample(self) -> None:
        for who, pid in self.pids.items():
            rss, fds = _status_kb(pid, "VmRSS"), _fds(pid)
            old_rss, old_fds = self.peak[who]
            if rss is not None and old_rss is not None:
                old_rss = max(old_rss, rss)
            if fds is not None and old_fds is not None:
                old_fds = max(old_fds, fds)
            self.peak[who] = (old_rss, old_fds)

    def fd_growth(self, who: str) -> Optional[int]:
        """The most descriptors `who` held since the start, beyond those it held then."""
        (_, fds0), (_, fds) = self.start.get(who, (None, None)), self.peak.get(who, (None, None))
        return fds - fds0 if fds0 is not None and fds is not None else None

    def report(self, out: Outcome) -> None:
        for who in self.pids:
            (rss0, _), (rss, _) = self.start[who], self.peak[who]
            if rss0 is not None and rss is not None:
                out.rss_growth_mb[who] = (rss - rss0) / 1024.0
            growth = self.fd_growth(who)
            if growth is not None:
                out.fd_growth[who] = growth


def steps_for(seconds: float) -> int:
    """Steps a job trains for, so that it trains for about `seconds` (some 60 steps a second
    on a 2-core machine; the fuzz stops at the last step, or `seconds` after the first)."""
    return max(STEPS, int(seconds * 60))


def run(mode: str, seed: int, workdir: Path, seconds: float = 4.0, fuzz: bool = True,
        steps: int = STEPS) -> Outcome:
    """One job of `mode` training `steps` steps; fuzzed as the module docstring says when
    `fuzz`, else a baseline."""
    out = Outcome(mode, seed, fuzz)
    workdir.mkdir(parents=True, exist_ok=True)
    marker_file = workdir / "UNPICKLED"
    job = _Job(mode, workdir, out, hold=fuzz, steps=steps)
    fuzzer: Optional[Fuzzer] = None
    try:
        if fuzz:
            fuzzer = _fuzz(job, seed, seconds, marker_file)
        job.finish()
    finally:
        if fuzzer is not None:
            fuzzer.stop()
            out.connections = {k: collections.Counter(v) for k, v in fuzzer.counts.items()}
        if job.running():
            job.kill()
    _judge(out, marker_file)
    return out


def _fuzz(job: _Job, seed: int, seconds: float, marker_file: Path) -> Fuzzer:
    """Fuzz `job` from its mesh set-up to its last step (or `seconds` after its first); return
    the fuzzer (the caller stops it)."""
    out = job.out
    if not job.wait_for(job.all_held):
        out.problems.append(f"the ranks never reached their TCP mesh set-up "
                            f"(held: {sorted(job.mesh_ports)})")
        job.release()
        return Fuzzer(seed, marker_file, None)
    secret, hub, store_port = _hub_and_secret(job.pids(), job.proc.pid)
    if hub is None:
        out.problems.append("found no driver hub (no listener of the driver sent a challenge)")
        job.release()
        return Fuzzer(seed, marker_file, None)
    fuzzer = Fuzzer(seed, marker_file, secret)
    if secret is not None:
        fuzzer.capture_from(hub)
    rng = random.Random(f"{seed}:setup")
    # set-up: strangers queue on every rank's mesh listener ahead of the ranks, then go
    bound = {port: host for host, port in _listening().values()}
    meshes = [Listener("mesh", job.rank_pids.get(rank, 0), bound.get(port, "?"), port)
              for rank, port in sorted(job.mesh_ports.items())]
    for mesh in meshes:
        for attack in ["idle"] * SETUP_IDLE + [a for a in ATTACKS if a != "idle"]:
            fuzzer.one(mesh, attack, rng)
    job.release()
    fuzzer.targets = listeners(job.proc.pid, job.pids(), hub[1], store_port)
    fuzzer.start()
    fuzz_started = time.monotonic()
    if not job.wait_for(job.first_step):
        out.problems.append("the job never made its first step")
        return fuzzer
    training = time.monotonic()
    watch = _Watch(job)
    probes, next_probe = 0, time.monotonic()
    while (not job.last_step.is_set() and job.running()
           and time.monotonic() - training < seconds):
        if time.monotonic() >= next_probe:
            next_probe = time.monotonic() + PROBE_SECONDS
            probes += 1
            if secret is not None:
                out.probes["hub"] += 1
                if not _genuine_hub(hub, secret):
                    out.probes["hub-failed"] += 1
            store = next((t for t in fuzzer.targets if t.kind == "store"), None)
            if store is not None:
                out.probes["store"] += 1
                if not _genuine_store(store.address, probes):
                    out.probes["store-failed"] += 1
            fuzzer.targets = listeners(job.proc.pid, job.pids(), hub[1], store_port) or fuzzer.targets
        watch.sample()
        job.last_step.wait(0.1)
    out.fuzz_seconds = time.monotonic() - fuzz_started
    watch.report(out)
    out.listeners = [*meshes, *fuzzer.targets]
    fuzzer.stop()
    return fuzzer


def _judge(out: Outcome, marker_file: Path) -> None:
    problems = out.problems
    if out.returncode != 0:
        problems.append(f"exit status {out.returncode}")
    if sorted(out.results) != list(range(NP)):
        problems.append(f"results from ranks {sorted(out.results)}, not from all {NP}")
    if marker_file.exists():
        problems.append(f"something was unpickled: {marker_file} exists")
    if not out.fuzzed:
        return
    kinds = {l.kind for l in out.listeners}
    for kind in ("hub", "store", "gloo", "mesh"):
        if kind not in kinds or not out.connections.get(kind):
            problems.append(f"no {kind} listener was fuzzed (found {sorted(kinds)})")
    wide = [l for l in out.listeners if not l.loopback]
    if wide:
        problems.append("listening beyond loopback though every rank is on this host: "
                        + ", ".join(f"{l.kind} on {l.bound}:{l.port}" for l in wide))
    for who, mb in out.rss_growth_mb.items():
        if mb >= RSS_BOUND_MB:
            problems.append(f"{who}'s memory grew by {mb:.1f} MB (bound {RSS_BOUND_MB:g} MB)")
    if out.max_stall >= STALL_BOUND:
        problems.append(f"a rank made no step for {out.max_stall:.1f} s (bound {STALL_BOUND:g} s)")
    for kind in ("hub", "store"):
        if out.probes.get(f"{kind}-failed"):
            problems.append(f"{out.probes[kind + '-failed']} of {out.probes[kind]} genuine {kind} "
                            "probes failed")
    if not out.probes.get("store") or (out.mode == "fixed" and not out.probes.get("hub")):
        problems.append(f"the genuine probes did not run ({dict(out.probes)})")
    # the hub logs its first rejection, then a count at most once a minute and when it closes
    logged = [l for l in out.output if "driver hub rejected" in l]
    if len(logged) > 2 + out.seconds // 60:
        problems.append(f"the hub logged {len(logged)} lines about rejected connections in "
                        f"{out.seconds:.0f} s")


def gloo_flood(workdir: Path, connections: int = FLOOD_CONNECTIONS, steps: int = STEPS) -> Outcome:
    """A fixed-size job started under a soft limit of ``FLOOD_SOFT_LIMIT`` open files, and
    `connections` strays (4 random bytes each, half of gloo's header, so that gloo waits for the
    rest) to rank 0's gloo listeners once it trains, all held open on this side until rank 0's
    open files are counted: rank 0 then holds every one of them, so without the ranks' raised
    limit (`distributor.rank_entry.raise_open_file_limit`) it aborts ("Too many open files").
    (Strays of 8 bytes closed at once were held only as long as gloo took to see them close: 481
    to 1,333 of 2,000 at the count, depending on the machine's load.)"""
    out = Outcome("flood", 0, False)
    workdir.mkdir(parents=True, exist_ok=True)
    job = _Job("fixed", workdir, out, hold=False, steps=steps, nofile_soft=FLOOD_SOFT_LIMIT)
    counts: collections.Counter = collections.Counter()
    try:
        if job.wait_for(job.first_step):
            time.sleep(0.2)  # rank_pids are printed before the first step
            rank0 = job.rank_pids.get(0)
            targets = [l for l in listeners(job.proc.pid, [rank0] if rank0 else [], -1, -1)
                       if l.kind == "gloo"]
            if not targets:
                out.problems.append("rank 0 has no gloo listener")
            watch = _Watch(job)
            rng = random.Random(0)
            held: List[socket.socket] = []
            raise_open_file_limit()  # (this process holds them all too)
            try:
                for i in range(connections if targets else 0):
                    if not job.running():
                        break
                    try:
                        s = socket.create_connection(targets[i % len(targets)].address, timeout=5)
                    except OSError:
                        counts["random-refused"] += 1
                        continue
                    held.append(s)
                    try:
                        s.sendall(rng.randbytes(4))  # half of gloo's 8-byte header: it waits for more
                        counts["random"] += 1
                    except OSError:
                        counts["random-refused"] += 1
                # gloo accepts them from the listen backlog at its own pace: count once it has
                # taken them all (or after 20 s)
                deadline = time.monotonic() + 20
                while True:
                    watch.sample()
                    held_by_rank0 = watch.fd_growth("rank0")
                    if held_by_rank0 is None or held_by_rank0 >= counts["random"] \
                            or time.monotonic() > deadline or not job.running():
                        break
                    time.sleep(0.05)
            finally:
                for s in held:
                    s.close()
            watch.report(out)
        else:
            out.problems.append("the job never made its first step")
        job.finish()
    finally:
        if job.running():
            job.kill()
    out.connections = {"gloo": counts}
    if out.returncode != 0:
        out.problems.append(f"exit status {out.returncode}")
    if sorted(out.results) != list(range(NP)):
        out.problems.append(f"results from ranks {sorted(out.results)}, not from all {NP}")
    return out


def baseline(mode: str, workdir: Path, steps: int = STEPS) -> Outcome:
    """The unfuzzed run whose results a fuzzed run of `steps` steps must reproduce."""
    return run(mode, 0, workdir, fuzz=False, steps=steps)


def check_against(out: Outcome, base: Outcome) -> None:
    """Add a problem to `out` when its results differ from the unfuzzed `base`'s."""
    if not base.ok:
        out.problems.append("the unfuzzed baseline failed: " + "; ".join(base.problems))
    elif out.results != base.results:
        out.problems.append(f"results differ from the unfuzzed run's: {out.results} != {base.results}")


def main(argv: Optional[List[str]] = None) -> int:
    """``python tests/fuzz/harness.py fixed|elastic|flood SEED [SECONDS]``: a baseline and one
    fuzzed run, its figures and, when it failed, the job's last lines."""
    import tempfile

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in (*MODES, "flood"):
        print(f"usage: harness.py {{{','.join(MODES)},flood}} SEED [SECONDS]", file=sys.stderr)
        return 2
    mode, seed = args[0], int(args[1])
    seconds = float(args[2]) if len(args) > 2 else 4.0
    steps = steps_for(seconds)
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline("fixed" if mode == "flood" else mode, Path(tmp) / "baseline", steps)
        out = gloo_flood(Path(tmp) / "flood", steps=steps) if mode == "flood" \
            else run(mode, seed, Path(tmp) / "fuzzed", seconds, steps=steps)
        check_against(out, base)
        print(out.line() + "\n" + out.table(), flush=True)
        if not out.ok:
            print("\n".join(out.output[-60:]), flush=True)
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
