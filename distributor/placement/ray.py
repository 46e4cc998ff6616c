"""Ray placement: every worker is a process that a Ray actor starts on the node its host names.

A host here is a Ray node's address (``NodeManagerAddress``), with as many slots as the caller's
discovery gives it. Each worker gets an actor of its own (`RankHost`), pinned to that node with
Ray's ``node:<address>`` resource and holding the worker's CPUs (and GPUs) in Ray's accounting,
so other Ray work does not land on them. The actor starts ``python -m distributor.rank_entry``
there, as ssh does for `HostsPlacement`: the rank is an ordinary rank process (it reaches the
driver hub, proves the job secret, beats, and is stopped by signals to its process group), and
the actor only relays its output and exit status. On the driver, `RayRankProcess` is what the
`Supervisor` tracks in place of a local process: its output arrives on local pipes, its signals go
to the actor (`signal_group`), never to a local process.

When the actor goes (its node is lost, or someone kills it), the worker counts as killed
(SIGKILL), with a line saying so; the rank itself dies with the actor (its parent) or, failing
that, when its hub connection closes with the job. An actor whose worker has exited is killed at
once, so that its CPUs are free for a replacement.

The job's working directory is used on a node where it exists, else the actor's. Ray is imported
only here, when a job is placed on Ray.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..rank_env import free_port, travels_to_other_hosts
from ..spec import LaunchRequest, RankSpec
from ..supervisor import Supervisor
from .base import JobContext, added_worker_spec, host_plan
from .hosts import HostsPlacement

#: How long a worker's actor may take to be placed and start its process.
ACTOR_START_SECONDS = 60.0
#: How long one `RankHost.read` waits for output before it answers empty.
READ_WAIT_SECONDS = 0.5


class RankHost:
    """The Ray actor that runs one worker process on its node and relays what it writes.

    Its methods run concurrently (``max_concurrency``): `read` waits for output while `signal`
    reaches the process."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._chunks: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        self._open = 2
        self._changed = threading.Condition()

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> int:
        """Start the worker process in a session of its own; return its pid."""
        full = {**os.environ, **env}
        self._proc = subprocess.Popen(
            list(argv), env=full, cwd=cwd if os.path.isdir(cwd) else None,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        for stream in ("stdout", "stderr"):
            threading.Thread(target=self._drain, args=(stream, getattr(self._proc, stream)),
                             daemon=True).start()
        return self._proc.pid

    def _drain(self, stream: str, pipe: Any) -> None:
        with pipe:
            for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
                with self._changed:
                    self._chunks[stream].append(chunk)
                    self._changed.notify_all()
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def read(self, wait: float = READ_WAIT_SECONDS) -> Tuple[bytes, bytes, Optional[int]]:
        """(stdout, stderr) written since the last call, waiting up to `wait` seconds for some,
        and the exit status once the process has exited and both pipes are read to the end."""
        with self._changed:
            self._changed.wait_for(lambda: any(self._chunks.values()) or not self._open, wait)
            out, err = (b"".join(self._chunks[s]) for s in ("stdout", "stderr"))
            self._chunks = {"stdout": [], "stderr": []}
            drained = not self._open
        code = self._proc.wait() if drained and self._proc is not None else None
        return out, err, code

    def signal(self, sig: int) -> None:
        """`sig` to the worker's process group (nothing when it has exited)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


class RayRankProcess:
    """A worker on a Ray node, as `Supervisor.track` takes a process (`supervisor.Process`): its
    output on local pipes, `poll`/`wait` for its exit status, `signal_group` for its signals.
    `pid` is the process's pid on its node (0 until it has started)."""

    def __init__(self, actor: Any, host: str, argv: Sequence[str], env: Mapping[str, str],
                 cwd: str, start_seconds: float = ACTOR_START_SECONDS) -> None:
        self._actor, self.host = actor, host
        self.pid = 0
        self.returncode: Optional[int] = None
        self._stopped = False  # the job stopped it by ending its actor
        self._done = threading.Event()
        out_r, self._out_w = os.pipe()
        err_r, self._err_w = os.pipe()
        self.stdout, self.stderr = os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")
        self._spawned = actor.spawn.remote(list(argv), dict(env), cwd)
        threading.Thread(target=self._pump, args=(start_seconds,), name=f"ray-worker-{host}",
                         daemon=True).start()

    def _pump(self, start_seconds: float) -> None:
        import ray

        code: Optional[int] = None
        try:
            try:
                self.pid = ray.get(self._spawned, timeout=start_seconds)
            except ray.exceptions.GetTimeoutError:
                self._say(f"horovod-compat: the Ray actor for a worker on node {self.host} was not "
                          f"placed and started within {start_seconds:g} s (is the node still "
                          "there, with a free CPU?)")
                code = 1
            while code is None:
                out, err, code = ray.get(self._actor.read.remote())
                for fd, data in ((self._out_w, out), (self._err_w, err)):
                    if data:
                        os.write(fd, data)
        except ray.exceptions.RayError as exc:
            if not self._stopped:  # (not the stop's own kill)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self._say(f"horovod-compat: the Ray actor that ran this worker on node {self.host} "
                          f"is gone ({type(exc).__name__}: {first})")
            code = -signal.SIGKILL
        finally:
            os.close(self._out_w)
            os.close(self._err_w)
            self.returncode = 1 if code is None else code
            self._done.set()
            self.kill_actor()  # its CPUs are free for a replacement

    def _say(self, line: str) -> None:
        os.write(self._err_w, (line + "\n").encode())

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker on {self.host}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill_actor(self) -> None:
        """End the actor (and with it the process, if it still runs)."""
        import ray

        try:
            ray.kill(self._actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray shut down
            pass

    def signal_group(self, sig: int) -> None:
        """`sig` to the worker's process group on its node; nothing once it has exited. SIGKILL,
        or a stop before the process has started (its actor maybe waiting for a node that is
        gone), ends the actor itself: the process dies with it (its parent)."""
        if self.returncode is not None:
            return
        if sig == signal.SIGKILL or (self.pid == 0 and sig == signal.SIGTERM):
            self._stopped = True
            self.kill_actor()
        else:
            self._actor.signal.remote(sig)


class RayPlacement(HostsPlacement):
    """Workers on Ray nodes: `hosts` [(node address, slots)], each worker a process started by
    an actor that holds `num_cpus` CPUs and `num_gpus` GPUs on its node (see the module's
    docstring). Workers can be added on any node while the job runs (an elastic job's
    replacements and new hosts), as with `HostsPlacement`; no ssh is used."""

    def __init__(self, hosts: Sequence[Tuple[str, int]], num_cpus: float = 1, num_gpus: float = 0,
                 is_local: Optional[Any] = None, start_seconds: float = ACTOR_START_SECONDS) -> None:
        super().__init__(hosts, is_local=is_local, discovers_hosts=True)
        self._options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": 4,
                         "max_restarts": 0}
        self._start_seconds = start_seconds
        self._processes: List[RayRankProcess] = []

    def validate(self, request: LaunchRequest) -> None:
        """The slots only: the nodes are Ray's (no ssh to check them with)."""
        self._check_slots(request, "the Ray nodes", "Add nodes, or ask for fewer workers or fewer "
                          "CPUs per worker.")

    def start(self, job: JobContext) -> None:
        specs = host_plan(self.hosts, job.request.num_processes)
        first = self.hosts[specs[0].node_rank][0]
        self._master = (self._driver_address() if self.is_local(first) else first,
                        free_port(self.hub_bind_host))
        self._job = job
        self._supervisor = Supervisor(job.sink)
        for spec in specs:
            self._start_worker(self.hosts[spec.node_rank][0], spec)

    def _start_worker(self, host: str, spec: RankSpec) -> None:
        import ray

        job, supervisor = self._job, self._supervisor
        assert job is not None and supervisor is not None
        toward = "127.0.0.1" if self.is_local(host) else self._address_toward(host)
        env = {name: value for name, value in self._env(spec, f"{toward}:{job.hub_address[1]}").items()
               if travels_to_other_hosts(name)}
        actor = ray.remote(RankHost).options(resources={f"node:{host}": 0.001},
                                             **self._options).remote()
        command = getattr(job.launcher, "command", None)
        argv = command() if command is not None else [sys.executable, "-m", "distributor.rank_entry"]
        process = RayRankProcess(actor, host, argv, env, os.getcwd(), self._start_seconds)
        self._processes.append(process)
        supervisor.track(spec.rank, process)

    def add_worker(self, worker_id: int, host: str) -> None:
        if self._job is None:
            raise RuntimeError("add_worker is called only after start")
        self._start_worker(host, added_worker_spec(worker_id))

    def close(self) -> None:
        """Kill every actor still there (a worker's actor goes when its worker exits)."""
        for process in self._processes:
            process.kill_actor()

