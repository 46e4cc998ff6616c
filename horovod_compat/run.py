"""`horovodrun`: run a command on N ranks, with Horovod's options and the engine's failure model.

    horovodrun -np 2 python train.py --epochs 3
    horovodrun -np 4 -H localhost:2,worker-1:2 -p 2222 -i ~/.ssh/id_ed25519 python train.py
    horovodrun -np 2 --output-filename logs --timeline-filename /tmp/tl.json pytest test_torch.py
    horovodrun --check-build
    python -m horovod_compat.run -np 2 python train.py

Horovod's command line: the same options with the same meaning (`horovodrun --help`). Ranks run
on this host unless `-H`/`--hostfile` name other hosts, which are reached with mpirun over ssh as
Horovod's MPI launcher does, or with `--gloo` by one ssh per rank as Horovod's gloo launcher does.
`--mpi` starts the ranks with `mpirun`; `--gloo` (the default on one host)
starts each rank directly and gives it Horovod's slot variables (HOROVOD_RANK, HOROVOD_SIZE,
HOROVOD_LOCAL_RANK/SIZE, HOROVOD_CROSS_RANK/SIZE, HOROVOD_HOSTNAME, set by
`horovod_compat.run_rank`); `--mpi` runs do not get them, as with Horovod's MPI launcher.
Tuning flags set the knob this project has (`horovod_compat.launch.knobs`) or print one line
saying they have no effect here. `--min-np` or `--host-discovery-script` make the job elastic
(Horovod's rule; gloo mode only): workers that fail are replaced, hosts the script adds get
workers up to `--max-np` (see `horovod_compat.launch.elastic`).
The exit status is 0 when every rank succeeded, else the first failing rank's status (1 for an
exception, 128+N for a signal N); for an elastic job that gave up, that of the failure that ended it.
Wrong input ends before any rank starts, with exit status 2 and one line
``horovodrun: <what is wrong and how to fix it>``: a bad flag or value, a bad ``-H`` list or host
file, too few slots, and, for ranks on this host, a command they could not start (not on PATH, a
script without execute permission or ``#!`` line, a directory) or a ``python`` that cannot import
horovod/torch for a script that imports them (a warning when the command may not need them).
"""
from __future__ import annotations

import argparse
import ast
import logging
import os
import shlex
import shutil
import subprocess
import sys
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Set, Tuple

from distributor import DistributedRunError, RankFailedError
from distributor.errors import ElasticJobFailedError
from distributor.placement.local import driver_pythonpath

from .launch import hosts as hostlib
from .launch import knobs
from .launch.elastic import elastic_args
from .launch.job import HorovodJob, is_python
from .run_rank import Suggest, command_problem
from .runner import horovod_environment


def usage_error(message: str) -> NoReturn:
    """Bad input: ``horovodrun: <message>`` on one line of stderr, exit status 2 (as argparse)."""
    print(f"horovodrun: {message}", file=sys.stderr)
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (unknown flag, bad value) as one line too, not the 30-line usage."""

    def error(self, message: str) -> NoReturn:
        usage_error(f"{message} (horovodrun --help lists the options)")


class _NicAction(argparse.Action):
    """--network-interfaces a,b / --network-interface a (repeatable): a set of names."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        names = set(getattr(namespace, self.dest, None) or ())
        names.update(v.strip() for v in values.split(",") if v.strip())
        setattr(namespace, self.dest, names)


def _add_knob(group: Any, knob: knobs.Knob) -> None:
    suffix = "" if knob.env is not None else f" [no effect here: {knob.no_effect}]"
    if knob.kind is bool:
        group.add_argument(*knob.flags, dest=knob.dest, action="store_const", const=True,
                           default=None, help=knob.help + suffix)
        if knob.negation:
            group.add_argument(knob.negation, dest=knob.dest, action="store_const", const=False,
                               default=None, help=argparse.SUPPRESS)
    else:
        kwargs: Dict[str, Any] = {"choices": knobs.LOG_LEVELS} if knob.dest == "log_level" else {}
        group.add_argument(*knob.flags, dest=knob.dest, type=knob.kind, default=None,
                           help=knob.help + suffix, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    import horovod

    parser = _Parser(
        prog="horovodrun", description="Run a command on N Horovod ranks (horovod-compat).")
    parser.add_argument("-v", "--version", action="version", version=horovod.__version__)
    parser.add_argument("-np", "--num-proc", dest="np", type=int, default=None,
                        help="number of ranks to start (required unless --check-build)")
    parser.add_argument("-cb", "--check-build", action="store_true",
                        help="show which frameworks, controllers and tensor operations are available")
    parser.add_argument("--disable-cache", action="store_true",
                        help="accepted for Horovod's sake; no checks are cached here")
    parser.add_argument("--start-timeout", type=float, default=None,
                        help="seconds for every rank to start (default: HOROVOD_START_TIMEOUT, else 120)")
    parser.add_argument("--network-interfaces", "--network-interface", "--nics", dest="nics",
                        action=_NicAction, default=None,
                        help="network interfaces for the ranks' traffic, comma-separated or repeated "
                             "(GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; mpirun's btl_tcp_if_include)")
    parser.add_argument("--output-filename", default=None,
                        help="also write each rank's output to DIR/rank.<rank>/stdout and .../stderr")
    parser.add_argument("--verbose", action="store_true", help="print the launch plan")
    parser.add_argument("--config-file", default=None,
                        help="YAML file with Horovod's knob sections (params, timeline, stall_check, "
                             "library_options, logging, autotune, controller); flags given on the "
                             "command line win")

    ssh = parser.add_argument_group("SSH arguments (for hosts other than this one)")
    ssh.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, default=None,
                     help="SSH port on all the hosts")
    ssh.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file", default=None,
                     help="SSH identity (private key) file")

    tuning = parser.add_argument_group("tuning, timeline, stall check, library and logging knobs")
    for knob in knobs.KNOBS:
        _add_knob(tuning, knob)
    tuning.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                        dest="prefix_output_with_timestamp", action="store_true",
                        help="timestamp each line of the ranks' output")

    library = parser.add_argument_group("MPI arguments (with --mpi or remote hosts)")
    library.add_argument("--mpi-args", dest="mpi_args", default=None,
                         help='extra arguments for mpirun, e.g. --mpi-args="--map-by ppr:2:node"')
    library.add_argument("--tcp", dest="tcp_flag", action="store_true",
                         help="TCP only: NCCL_IB_DISABLE=1 for the ranks")
    library.add_argument("--binding-args", dest="binding_args", default=None,
                         help="mpirun process binding arguments (replace --bind-to none)")

    elastic = parser.add_argument_group("elastic arguments (gloo mode)")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int, default=None,
                         help="fewest workers training goes on with (default: -np); makes the job elastic")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int, default=None,
                         help="most workers the job grows to (default: no limit)")
    elastic.add_argument("--slots-per-host", "--slots", dest="slots", type=int, default=None,
                         help="slots of a host the discovery script lists without ':slots'")
    elastic.add_argument("--elastic-timeout", dest="elastic_timeout", type=int, default=None,
                         help="seconds to wait for enough workers after a failure "
                              "(default: HOROVOD_ELASTIC_TIMEOUT, else 600)")
    elastic.add_argument("--reset-limit", dest="reset_limit", type=int, default=None,
                         help="most resets (failures or host changes) before the job fails "
                              "(default: no limit)")
    elastic.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
                         default=None, metavar=("MIN", "MAX"),
                         help="seconds a host whose worker failed waits before a replacement "
                              "starts there, doubling per failure within MIN..MAX")

    host_group = parser.add_argument_group("host arguments").add_mutually_exclusive_group()
    host_group.add_argument("-H", "--hosts", default=None,
                            help="host:slots list, e.g. localhost:2 or host1:2,host2:2")
    host_group.add_argument("-hostfile", "--hostfile", default=None,
                            help="file with one 'hostname slots=N' per line")
    host_group.add_argument("--host-discovery-script", default=None,
                            help="executable printing the available hosts, one 'host:slots' (or "
                                 "'host' with --slots) a line; makes the job elastic")

    controller = parser.add_argument_group("controller arguments").add_mutually_exclusive_group()
    controller.add_argument("--gloo", dest="use_gloo", action="store_true",
                            help="start each rank directly (the default)")
    controller.add_argument("--mpi", dest="use_mpi", action="store_true",
                            help="start the ranks with mpirun")
    controller.add_argument("--jsrun", dest="use_jsrun", action="store_true",
                            help="IBM LSF jsrun: not supported here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def _load_config(path: str) -> Dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise ValueError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise ValueError(f"cannot read --config-file {path!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--config-file {path!r} is not valid YAML: {exc}") from None
    return config


def _apply_config(args: argparse.Namespace) -> None:
    """Fill knobs (and the controller) from --config-file where the command line set none."""
    config = _load_config(args.config_file)
    controller = config.get("controller") if isinstance(config, dict) else None
    if controller and not (args.use_gloo or args.use_mpi):
        if str(controller).lower() not in ("gloo", "mpi"):
            raise ValueError(f"config controller {controller!r} is not supported; use gloo or mpi")
        setattr(args, f"use_{str(controller).lower()}", True)
    given = [k.dest for k in knobs.KNOBS if getattr(args, k.dest) is not None]
    for dest, value in knobs.from_config(config, given).items():
        setattr(args, dest, value)


#: Modules a Horovod script needs from the Python that runs it.
HOROVOD_MODULES = ("horovod", "horovod_compat", "torch")
#: Prints the interpreter's path, then which of its arguments it cannot find (find_spec: nothing
#: is imported).
_FIND_MODULES = ("import importlib.util, sys; print(sys.executable); "
                 "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")


def _python_source(command: Sequence[str]) -> Optional[str]:
    """The code ``python [OPTIONS] (script.py | -c CODE) ...`` runs, where it can be read (None
    for ``-m module``, stdin, or a script that cannot be read)."""
    rest = list(command[1:])
    while rest:
        word = rest.pop(0)
        if word.startswith("-c"):
            return word[2:] or (rest[0] if rest else None)
        if word.startswith("-m") or word == "-":
            return None
        if word in ("-W", "-X", "--check-hash-based-pycs"):
            rest = rest[1:]  # the option's value
        elif not word.startswith("-"):
            try:
                with open(word, encoding="utf-8", errors="replace") as handle:
                    return handle.read()
            except OSError:
                return None
    return None


def _imported(source: str) -> Set[str]:
    """Top-level names of the modules `source` imports (a scan: a syntax error means none)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _missing_modules(python: str, env: Dict[str, str]) -> Tuple[str, List[str]]:
    """(the interpreter's own path, which of HOROVOD_MODULES it cannot find) with the ranks'
    environment: one short subprocess; nothing missing when it cannot tell."""
    try:
        done = subprocess.run([python, "-c", _FIND_MODULES, *HOROVOD_MODULES], env=env,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return python, []
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return python, []
    return lines[0] or python, lines[1].split()


def _check_interpreter(job: HorovodJob, command: Sequence[str], suggest: Suggest) -> Optional[str]:
    """A ``python`` command whose interpreter lacks horovod/horovod_compat/torch (typically
    the system one, when horovodrun is run from a virtual environment that is not activated).

    An error when it cannot work: the script (or -c code) imports one of the missing modules, or
    the job is elastic (its workers run this project's code in that interpreter).  Otherwise only
    a warning (returned as a note): ``python -c 'print(1)'`` or a script that imports none of them
    needs none of them, and one that imports them through its own modules is beyond a scan.
    """
    python = shutil.which(command[0]) or command[0]
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        return None
    env = {**os.environ, **job.env, "PYTHONPATH": driver_pythonpath(job.env)}
    real, missing = _missing_modules(python, env)
    if not missing:
        return None
    problem = (f"{real} cannot import {', '.join(missing)} (the Python of this horovodrun is "
               f"{sys.executable})")
    where = ("activate that virtual environment" if sys.prefix != sys.base_prefix
             else f"put {os.path.dirname(sys.executable)} first on PATH")
    fix = f"run: {suggest([sys.executable, *command[1:]])}, or {where}"
    source = _python_source(command)
    needed = _imported(source) & set(HOROVOD_MODULES) if source is not None else set()
    if "horovod" in needed:  # the horovod shim runs on horovod_compat and torch
        needed = set(HOROVOD_MODULES)
    if job.elastic is not None or needed & set(missing):
        usage_error(f"{problem}; {fix}")
    return f"warning: {problem}; if the command needs them, {fix}"


def _check_command(job: HorovodJob, command: List[str], suggest: Suggest) -> List[str]:
    """Errors (exit 2) for a command this host's ranks could not start; notes for doubts."""
    problem = command_problem(command, suggest)
    if problem is not None:
        usage_error(problem)
    if not is_python(command[0]):
        return []
    note = _check_interpreter(job, command, suggest)
    return [note] if note else []


def _suggester(argv: Sequence[str], command: Sequence[str], num_proc: int) -> Suggest:
    """Renders a corrected command as the whole horovodrun line (this one's options kept)."""
    options = list(argv[:len(argv) - len(command)])
    if list(argv[len(options):]) != list(command):
        options = ["-np", str(num_proc)]
    return lambda fixed: "horovodrun " + shlex.join([*options, *fixed])


def _check_hosts_followed_by_slots(hosts: Optional[str], command: Sequence[str]) -> None:
    """``-H host1 2 python ...``: a slot count given after a space (it became the command)."""
    if hosts and ":" not in hosts.split(",")[-1] and command[0].isdecimal():
        usage_error(f"-H {hosts} is followed by {command[0]!r}, which looks like a slot count; "
                    f"write -H {hosts}:{command[0]} ({hostlib.HOSTS_SYNTAX}, then the command)")


def plan(argv: Optional[Sequence[str]] = None) -> Tuple[HorovodJob, Any, List[str]]:
    """Parse and check the command line; returns (job, its target, notes to print).

    Exits with status 2 and one line ``horovodrun: <what is wrong and how to fix it>`` on any
    wrong flag, value, host list or command, before anything starts.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_build:
        from .launch.check_build import report

        print(report(args.verbose))
        raise SystemExit(0)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.np is None:
        usage_error("-np/--num-proc is required, e.g. horovodrun -np 2 python train.py")
    if not command:
        usage_error("no command given; e.g. horovodrun -np 2 python train.py")
    if args.use_jsrun:
        usage_error("--jsrun (IBM LSF) is not supported; use --mpi or --gloo")
    _check_hosts_followed_by_slots(args.hosts, command)
    try:
        if args.config_file:
            _apply_config(args)
        values = {k.dest: getattr(args, k.dest) for k in knobs.KNOBS}
        knobs.validate(values)
        elastic = elastic_args(args.np, min_num_proc=args.min_num_proc,
                               max_num_proc=args.max_num_proc, slots=args.slots,
                               reset_limit=args.reset_limit, cooldown_range=args.cooldown_range,
                               host_discovery_script=args.host_discovery_script,
                               elastic_timeout=args.elastic_timeout)
        env = horovod_environment()
        knob_env, notes = knobs.environment(values)
        env.update(knob_env)
        if args.tcp_flag:
            env["NCCL_IB_DISABLE"] = "1"
        if args.disable_cache:
            notes.append("--disable-cache has no effect here: no checks are cached.")
        job = HorovodJob.create(
            args.np, hosts=args.hosts, hostfile=args.hostfile, use_gloo=args.use_gloo,
            use_mpi=args.use_mpi, env=env, start_timeout=args.start_timeout,
            mpi_args=args.mpi_args, binding_args=args.binding_args,
            nics=sorted(args.nics) if args.nics else None, ssh_port=args.ssh_port,
            ssh_identity_file=args.ssh_identity_file, output_filename=args.output_filename,
            prefix_output_with_timestamp=args.prefix_output_with_timestamp, verbose=args.verbose,
            elastic=elastic,
        )
    except ValueError as exc:
        usage_error(str(exc))
    if not job.remote:  # other hosts' PATH and Pythons cannot be checked from here
        notes += _check_command(job, command, _suggester(argv, args.command, args.np))
    if args.log_level:
        logging.basicConfig(level=logging.DEBUG if args.log_level == "TRACE" else args.log_level)
    if args.binding_args and not job.use_mpi:
        notes.append("--binding-args has no effect without --mpi: ranks started directly are not bound.")
    try:
        target = job.command_target(command)
    except ValueError as exc:
        usage_error(str(exc))
    return job, target, notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    job, target, notes = plan(argv)
    for note in notes:
        print(f"horovodrun: {note}", file=sys.stderr)
    try:
        job.run(target, return_all=False)
    except DistributedRunError as exc:
        print(f"horovodrun: {exc}", file=sys.stderr)
        failed = exc.root_cause if isinstance(exc, ElasticJobFailedError) else exc
        if not isinstance(failed, RankFailedError):
            return 1
        code = failed.exit_code
        return 128 - code if code is not None and code < 0 else (code or 1)
    return 0


if __name__ == "__main__":
    # ``python -m horovod_compat.run`` put the working directory first on sys.path; the
    # ``horovodrun`` command does not, and the ranks' PYTHONPATH, which carries the driver's own
    # import paths (distributor.placement.local.driver_pythonpath), must not depend on how the
    # launcher was started
    if sys.path and sys.path[0] == os.getcwd():
        del sys.path[0]
    sys.exit(main())
