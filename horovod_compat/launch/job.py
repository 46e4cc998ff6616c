"""One Horovod-style launch on the engine, shared by `horovodrun` and `horovod.run`.

`HorovodJob` holds Horovod's launch settings (hosts, controller, output, NICs, ssh, timeouts) after
validation; `run(target)` picks the placement and launcher and starts the job:

* hosts that are all this machine (the default ``localhost:<np>``): the local placement;
* some other host: mpirun over ssh across the hosts, as Horovod's MPI launcher does
  (`distributor.placement.HostsPlacement`);
* ``use_mpi``: the ranks are started by ``mpirun`` (Open MPI's variables tell each its rank);
  otherwise (Horovod's gloo mode) directly, each rank also given Horovod's ``HOROVOD_*`` slot
  variables, as Horovod's gloo launcher sets them;
* an elastic job (`elastic.ElasticArgs`): always gloo mode; one process per worker on the hosts
  (this machine's as local processes, others over ssh), and the engine may add workers on any
  host the discovery script lists while the job runs (`distributor.placement.HostsPlacement`).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from distributor import CommandTarget, FunctionTarget, LaunchRequest, ScriptTarget, forkserver_daemon, launch
from distributor.elastic.policy import ElasticPolicy
from distributor.forkserver_daemon import DaemonSettings
from distributor.launchers import MpirunLauncher, PythonLauncher
from distributor.rank_entry import run_as_main

from ..common import shm_names
from ..common.liveness import driver_heartbeat_timeout
from ..run_rank import call_with_slot_env
from . import hosts as hostlib
from .elastic import ELASTIC_ENV, UNBOUNDED_WORKERS, ElasticArgs, FixedHosts, wait_for_script_slots
from .knobs import check_local_nics, nic_environment
from .output import RankOutput

#: Start timeout (seconds) when neither the argument nor HOROVOD_START_TIMEOUT says otherwise.
#: Horovod's is 30 s; ranks here must only connect to the driver in that time, but hosts shared
#: by several jobs can be slow to start processes, so the project keeps its 120 s.
DEFAULT_START_TIMEOUT = 120.0


_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
#: Interpreter options an elastic ``python [OPTIONS] script.py`` command may carry (the workers
#: are unbuffered anyway).
_PYTHON_OPTIONS = ("-u", "-B")


def is_python(program: str) -> bool:
    """True if `program` names a Python interpreter (``python``, ``python3.11``, ``/x/bin/python``)."""
    return bool(_PYTHON.match(os.path.basename(program)))


def python_script_command(command: Sequence[str]) -> tuple:
    """(python, script, argv) of ``python [-u] [-B] script.py ARGS...``; ValueError otherwise."""
    if command and is_python(command[0]):
        rest = list(command[1:])
        while rest and rest[0] in _PYTHON_OPTIONS:
            rest.pop(0)
        if rest and not rest[0].startswith("-"):
            return shutil.which(command[0]) or command[0], rest[0], rest[1:]
    raise ValueError(
        f"an elastic job runs 'python script.py ARGS...' commands (the script runs inside each "
        f"worker, so that hvd.init() can join the job's rendezvous rounds); got "
        f"{' '.join(command)!r}. Write the command in that form.")


def _same_interpreter(a: str, b: str) -> bool:
    """Whether the programs `a` and `b` are one Python in one environment (a virtualenv's
    ``bin/python`` links to the base interpreter, but is another environment)."""
    return (os.path.dirname(os.path.abspath(a)) == os.path.dirname(os.path.abspath(b))
            and os.path.realpath(a) == os.path.realpath(b))


#: Seconds a warm fork server stays after the last launch that used it (0: none is used), and
#: the private directory of this user's servers (`distributor.forkserver_daemon`).
WARM_SECONDS_VAR = "HOROVOD_COMPAT_WARM_SECONDS"
WARM_DIR_VAR = "HOROVOD_COMPAT_WARM_DIR"


def warm_settings_from(environ: Mapping[str, str]) -> Optional[DaemonSettings]:
    """The warm fork server settings the variables in `environ` ask for (None: off); ValueError
    naming the variable when its value is not 0 or a positive number of seconds."""
    raw = environ.get(WARM_SECONDS_VAR, "").strip()
    seconds = forkserver_daemon.DEFAULT_IDLE_SECONDS
    if raw:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"{WARM_SECONDS_VAR}={raw!r}: give the seconds a warm fork server "
                             "stays after a launch, or 0 to start every rank as a new process")
    if seconds == 0:
        return None
    return DaemonSettings(seconds, environ.get(WARM_DIR_VAR) or None)


def start_timeout_from(value: Optional[float], variable: str, default: float) -> float:
    """`value`, else the environment variable `variable`, else `default`; ValueError if bad."""
    if value is None:
        raw = os.environ.get(variable)
        if raw is None or not raw.strip():
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{variable}={raw!r} is not a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"start_timeout must be a positive number of seconds, got {value!r}")
    return float(value)


#: What importing a module (or a module under it) imports of what a warm fork server can import
#: before it forks the ranks (`forkserver_daemon.LEARNED`). Horovod's TensorFlow and Keras
#: bindings here run on torch's collectives: they import both.
_EXPENSIVE_IMPORTS = {"torch": ("torch",), "horovod.torch": ("torch",),
                      "tensorflow": ("tensorflow",), "horovod.tensorflow": ("torch", "tensorflow"),
                      "horovod.keras": ("torch", "tensorflow")}


def _user_function(target: FunctionTarget) -> Any:
    """The user's function of a ``horovod.run`` target (`call_with_slot_env` wraps it)."""
    return target.args[0] if target.fn is call_with_slot_env and target.args else target.fn


def _expected_imports(target: Any) -> tuple:
    """The expensive modules (`_EXPENSIVE_IMPORTS`) the ranks of a warm `target` will import,
    read off its file: the script of ``python script.py`` / ``-m module``, or the module file of
    a ``horovod.run`` function. A daemon started for the launch imports them once, before it
    forks the ranks (`DaemonSettings.expect`); an import the file hides (in a module it
    imports, through importlib) is learned as before, after the launch."""
    if isinstance(target, ScriptTarget):  # an elastic launch's script
        return _expensive_imports_of(target.path)
    if not isinstance(target, FunctionTarget):
        return ()
    fn, args = target.fn, target.args
    if fn is call_with_slot_env and args and args[0] is run_as_main:
        script, _argv, is_module = args[1:4]
        path = forkserver_daemon.module_file(script, os.getcwd()) if is_module else script
    else:
        inner = _user_function(target)
        path = getattr(sys.modules.get(getattr(inner, "__module__", None) or ""), "__file__", None)
    return _expensive_imports_of(path) if isinstance(path, str) else ()


def _expensive_imports_of(path: str) -> tuple:
    found = []
    for name in forkserver_daemon.imported_modules(path):
        for prefix, modules in _EXPENSIVE_IMPORTS.items():
            if name == prefix or name.startswith(prefix + "."):
                found += [m for m in modules if m not in found]
    return tuple(sorted(found))


@dataclass
class HorovodJob:
    """Validated launch settings. Construct with `HorovodJob.create(...)`."""

    num_proc: int
    hosts: List[hostlib.HostSlots]
    remote: bool
    use_mpi: bool
    env: Dict[str, str]
    start_timeout: float
    executable: str
    mpi_args: List[str] = field(default_factory=list)
    binding_args: Optional[List[str]] = None  # None: mpirun binds no rank
    nics: List[str] = field(default_factory=list)
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    output_filename: Optional[str] = None
    prefix_output_with_timestamp: bool = False
    verbose: bool = False
    elastic: Optional[ElasticPolicy] = None
    warm: Optional[DaemonSettings] = None  # None: no warm fork server (warm_settings_from)

    @classmethod
    def create(
        cls,
        num_proc: Any,
        hosts: Optional[str] = None,
        hostfile: Optional[str] = None,
        use_gloo: Optional[bool] = None,
        use_mpi: Optional[bool] = None,
        env: Optional[Dict[str, str]] = None,
        start_timeout: Optional[float] = None,
        executable: Optional[str] = None,
        mpi_args: Union[None, str, Sequence[str]] = None,
        binding_args: Optional[str] = None,
        nics: Optional[Sequence[str]] = None,
        ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None,
        output_filename: Optional[str] = None,
        prefix_output_with_timestamp: bool = False,
        verbose: bool = False,
        elastic: Optional[ElasticArgs] = None,
    ) -> "HorovodJob":
        """Check everything before any process starts; ValueError says what to change.

        With `elastic` and a discovery script, the script is run here (its errors and a
        shortage of slots are reported before any worker starts)."""
        if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
            raise ValueError(f"num_proc must be a positive int, got {num_proc!r}")
        if hosts is not None and hostfile is not None:
            raise ValueError("Argument hosts and hostfile only allow one provided.")
        if use_gloo and use_mpi:
            raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
        script = elastic.discovery_script() if elastic is not None else None
        if elastic is not None and use_mpi:
            raise ValueError("elastic training runs in Horovod's gloo mode (one process per worker, "
                             "no mpirun), as in Horovod; drop --mpi / use_mpi=True")
        if script is not None and (hosts or hostfile):
            raise ValueError("host_discovery_script lists the hosts of an elastic job; pass it or "
                             "hosts/hostfile, not both")
        if script is not None:
            host_list = wait_for_script_slots(script, num_proc, elastic.timeout())
        elif hostfile is not None:
            host_list = hostlib.parse_hostfile(hostfile)
        elif hosts:
            host_list = hostlib.parse_hosts(hosts)
        else:
            host_list = [("localhost", num_proc)]
        used = hostlib.slots_for(host_list, num_proc)
        policy = None
        if elastic is not None:
            policy = elastic.policy(num_proc, script or FixedHosts(host_list))
        local = hostlib.local_addresses()
        remote = not all(hostlib.is_local(host, local) for host, _ in used)
        if ssh_port is not None and (isinstance(ssh_port, bool) or not isinstance(ssh_port, int)
                                     or not 0 < ssh_port < 65536):
            raise ValueError(f"ssh_port must be a TCP port number, got {ssh_port!r}")
        if ssh_identity_file is not None and not os.path.isfile(ssh_identity_file):
            raise ValueError(f"ssh identity file {ssh_identity_file!r} does not exist")
        python = executable or sys.executable
        if not remote and not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ValueError(f"executable {python!r} is not an executable file on this host")
        nic_list = sorted(set(nics or ()))
        if nic_list and not remote:
            check_local_nics(nic_list)
        job_env = dict(env or {})
        if policy is not None:
            job_env.update(ELASTIC_ENV)
        if nic_list:
            job_env.update(nic_environment(nic_list))
        if isinstance(mpi_args, str):
            mpi_arg_list = shlex.split(mpi_args)
        else:
            mpi_arg_list = list(mpi_args or ())
        return cls(
            num_proc=num_proc, hosts=used, remote=remote,
            use_mpi=bool(use_mpi) or (remote and policy is None and not use_gloo),
            env=job_env, start_timeout=start_timeout_from(start_timeout, "HOROVOD_START_TIMEOUT",
                                                          DEFAULT_START_TIMEOUT),
            executable=python, mpi_args=mpi_arg_list,
            binding_args=shlex.split(binding_args) if binding_args else None, nics=nic_list, ssh_port=ssh_port,
            ssh_identity_file=ssh_identity_file, output_filename=output_filename,
            prefix_output_with_timestamp=bool(prefix_output_with_timestamp), verbose=bool(verbose),
            elastic=policy, warm=warm_settings_from({**os.environ, **job_env}),
        )

    # ---- running ----------------------------------------------------------------------------
    def describe(self) -> str:
        where = ",".join(f"{h}:{n}" for h, n in self.hosts)
        how = "mpirun" + (" over ssh" if self.remote else "") if self.use_mpi else "direct processes"
        if self.elastic is not None:
            most = self.elastic.max_workers
            how += (f", elastic: {self.elastic.min_workers} to "
                    f"{'any number of' if most >= UNBOUNDED_WORKERS else most} workers")
        return f"{self.num_proc} process(es) on {where} via {how}"

    def function_target(self, fn: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> FunctionTarget:
        if self.use_mpi:
            return FunctionTarget(fn, tuple(args), dict(kwargs))
        return FunctionTarget(call_with_slot_env, (fn, *args), dict(kwargs))

    def command_target(self, command: Sequence[str]) -> Union[CommandTarget, ScriptTarget]:
        """What each rank runs for `command`. In an elastic job a ``python script.py ...``
        command runs the script inside the worker process (which talks to the driver), so that
        its ``hvd.init()`` joins the job's rounds; the workers then use that Python."""
        if self.elastic is not None:
            self.executable, script, argv = python_script_command(command)
            return ScriptTarget(script, tuple(argv))
        if self.use_mpi:
            return CommandTarget(tuple(command))
        script = self._warm_script(command)
        if script is not None:  # run in the (warm) rank process itself, as the same Python would
            return FunctionTarget(call_with_slot_env, (run_as_main, *script))
        return CommandTarget((self.executable, "-m", "horovod_compat.run_rank", *command))

    @property
    def _across_launches(self) -> Optional[DaemonSettings]:
        """How ranks fork from this user's warm fork server (`forkserver_daemon`): in gloo mode
        on this host, unless ``HOROVOD_COMPAT_WARM_SECONDS=0`` (None: they do not)."""
        if self.use_mpi or self.remote or self.elastic is not None:
            return None
        return self.warm

    def _warm_script(self, command: Sequence[str]) -> Optional[tuple]:
        """(script, argv, is_module) of a ``python script.py ARGS`` / ``python -m module ARGS``
        command whose ``python`` is the launch's own interpreter (no interpreter options) and
        whose file does not set environment variables (`forkserver_daemon.sets_environment`),
        run in ranks forked from the warm fork server; None for any other command (it runs as
        a process of its own)."""
        if self._across_launches is None or not command or not is_python(command[0]):
            return None
        found = shutil.which(command[0])
        if found is None or not _same_interpreter(found, self.executable):
            return None
        rest = list(command[1:])
        if len(rest) >= 2 and rest[0] == "-m" and re.fullmatch(r"\w+(\.\w+)*", rest[1]):
            target = (rest[1], tuple(rest[2:]), True)
            path = forkserver_daemon.module_file(rest[1], os.getcwd())
        elif rest and not rest[0].startswith("-") and os.path.isfile(rest[0]):
            target = (rest[0], tuple(rest[1:]), False)
            path = rest[0]
        else:
            return None
        # a script that sets variables itself may mean them for an import the server did already
        return None if path is None or forkserver_daemon.sets_environment(path) else target

    def _forks_warm(self, target: Any) -> bool:
        """Whether `target`'s ranks fork from the warm fork server: a script `command_target`
        chose for it, or a function that does not set environment variables itself (see
        `_warm_script`)."""
        if self._across_launches is None or not isinstance(target, FunctionTarget):
            return False
        fn = _user_function(target)
        return fn is run_as_main or not forkserver_daemon.function_sets_environment(fn)

    @staticmethod
    def _elastic_preload(target: Any) -> tuple:
        """What an elastic job's fork server imports before it forks the workers: torch, and the
        TensorFlow a TensorFlow script or function imports, unless it sets environment variables
        itself (``TF_USE_LEGACY_KERAS``, ``TF_CPP_MIN_LOG_LEVEL`` before ``import tensorflow``
        would come too late)."""
        if "tensorflow" not in _expected_imports(target):
            return ("torch",)
        if isinstance(target, ScriptTarget):
            sets = forkserver_daemon.sets_environment(target.path)
        else:
            sets = forkserver_daemon.function_sets_environment(_user_function(target))
        return ("torch",) if sets else ("torch", "tensorflow")

    def _launcher(self, target: Any) -> Any:
        if self.elastic is not None:  # workers import torch; replacements fork with it imported
            return PythonLauncher(python=self.executable, preload=self._elastic_preload(target))
        if not self.use_mpi:
            warm = self._across_launches if self._forks_warm(target) else None
            if warm is not None:
                warm = dataclasses.replace(warm, expect=_expected_imports(target))
            return PythonLauncher(python=self.executable, across_launches=warm)
        extra = list(self.mpi_args)
        if self.nics:
            extra += ["--mca", "btl_tcp_if_include", ",".join(self.nics)]
        return MpirunLauncher(python=self.executable, extra_args=extra, binding=self.binding_args)

    def _placement(self) -> Any:
        if not self.remote and self.elastic is None:
            return None  # the engine's default: this host
        from distributor.placement import HostsPlacement

        local = hostlib.local_addresses()
        discovery = self.elastic.discovery if self.elastic is not None else None
        # can a machine other than this one join? (no: loopback is enough for the driver)
        others = None if discovery is None else (
            not isinstance(discovery, FixedHosts)  # a script may offer any host
            or not all(hostlib.is_local(host, local) for host, _ in discovery.hosts))
        return HostsPlacement(self.hosts, [h for h, _ in self.hosts if hostlib.is_local(h, local)],
                              ssh_port=self.ssh_port, ssh_identity_file=self.ssh_identity_file,
                              is_local=lambda host: hostlib.is_local(host, local),
                              verbose=bool(self.verbose), discovers_hosts=others)

    def run(self, target: Any, return_all: bool = True, stdout: Any = None, stderr: Any = None,
            placement: Any = None) -> Any:
        """Run `target` on every rank; every rank's value in rank order (function targets).
        `placement`: where the ranks run, when not on this job's hosts (horovod.ray: Ray nodes)."""
        request = LaunchRequest(target, self.num_proc, env=self.env,
                                start_timeout=self.start_timeout, return_all=return_all,
                                elastic=self.elastic,
                                heartbeat_timeout=driver_heartbeat_timeout(self.env))
        placement = placement if placement is not None else self._placement()
        if self.verbose:
            print(f"horovod-compat: launching {self.describe()}", file=sys.stderr, flush=True)
        try:
            with RankOutput(stdout, stderr, timestamps=self.prefix_output_with_timestamp,
                            directory=self.output_filename, size=self.num_proc,
                            verbose=self.verbose) as output:
                return launch(request, placement=placement, launcher=self._launcher(target),
                              output=output)
        finally:  # what a rank killed while it set up shared memory left on this host
            shm_names.remove_orphans()
