"""Databricks ``HorovodRunner(np=N).run(main, **kwargs)`` -> ``TorchDistributor(...).run(main)``.

* ``np > 0`` ran N ranks as Spark tasks: ``num_processes=N, local_mode=False``.
* ``np < 0`` ran -N ranks on the driver only: ``num_processes=-N, local_mode=True``.
* ``np = 0`` was deprecated (one rank per ... nothing sensible today): flagged.
* HorovodRunner used the GPUs it found; TorchDistributor must be told: ``use_gpu`` becomes
  ``torch.cuda.is_available()``, evaluated where the distributor is built (the driver).
* ``run(main, **kwargs)`` called ``main(**kwargs)``; ``TorchDistributor.run(main, *args)`` passes
  positional arguments only, so keyword arguments are bound with ``functools.partial``.
* ``driver_log_verbosity`` only chose how much output the driver shows; it is dropped.
* ``TorchDistributor`` is PySpark's own (``pyspark.ml.torch.distributor``): the migrated notebook
  needs nothing from this project. It needs an active SparkSession, which a Databricks notebook
  has (HorovodRunner ran there); this project's ``distributor.TorchDistributor`` has the same API
  and runs ``local_mode=True`` without one, and an import of either is kept as it is.

``horovod.run(fn, args=(...), kwargs={...}, np=N, ...)`` (Horovod's in-process launcher, which
returned every rank's value in rank order) becomes torch's own launcher on this host,
``elastic_launch(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=N, rdzv_backend="c10d",
rdzv_endpoint="localhost:0", run_id=..., max_restarts=0), fn)(*args)`` (what torchrun runs: a
rendezvous on a free local port, no restarts, as Horovod made none), its ``{rank: value}`` turned
into the list in rank order where the call's value is used; keyword arguments are bound with
``functools.partial`` (kept named for elastic_launch, which names the job after the function).
Options that only chose how Horovod talked (``use_gloo``, ``use_mpi``, ``verbose``,
``disable_cache``, ...) are dropped with a note. Placement options (``hosts``, ``hostfile``,
``network_interfaces``, ...) written as literals keep a TODO (several hosts are launched with
torchrun on each one, see the guide); chosen at run time (``hosts=args.hosts``), they get a check
before the statement that stops a run that sets one, with that advice. Elastic options
(``min_np``, ``max_np``, ``reset_limit``, ``slots``) are flagged.

``horovod.spark.run(fn, args=(...), kwargs={...}, num_proc=N, ...)`` (ranks as Spark tasks) becomes
PySpark's ``TorchDistributor(num_processes=N, local_mode=False, use_gpu=torch.cuda.is_available())
.run(fn, *args)``, as a statement only: horovod.spark.run returned every rank's value, where
TorchDistributor returns rank 0's, so a call whose value is used keeps a TODO. Options that chose
how Horovod talked or logged (``use_gloo``, ``use_mpi``, ``verbose``, ``nics``, ``extra_mpi_args``,
``start_timeout``, ``prefix_output_with_timestamp``) are dropped with a note (TorchDistributor
brings the ranks' output to the driver); ``env``, ``stdout`` and ``stderr`` given a value keep a
TODO, and so does a missing ``num_proc`` (Horovod then took Spark's default parallelism).
"""
from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from horovod_compat.migrate.context import (
    HOROVOD,
    RUNNER,
    Flagged,
    Outcome,
    RewriteContext,
    Rewritten,
    code_of,
    keyword_args,
    positional_args,
)


def is_runner_constructor(call: cst.Call, runner_names: Set[str]) -> bool:
    """True for ``HorovodRunner(...)`` (under whatever name it was imported)."""
    return isinstance(call.func, cst.Name) and call.func.value in runner_names


def is_runner_run(call: cst.Call, runner_names: Set[str], runner_vars: Set[str]) -> bool:
    """True for ``hr.run(...)`` with ``hr = HorovodRunner(...)``, or ``HorovodRunner(...).run(...)``."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "run"):
        return False
    owner = func.value
    if isinstance(owner, cst.Name):
        return owner.value in runner_vars
    return isinstance(owner, cst.Call) and is_runner_constructor(owner, runner_names)


def _np_value(node: cst.BaseExpression) -> Optional[int]:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.expression, cst.Integer):
        if isinstance(node.operator, cst.Minus):
            return -int(node.expression.value)
        if isinstance(node.operator, cst.Plus):
            return int(node.expression.value)
    return None


def rewrite_constructor(call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``HorovodRunner(np=N[, driver_log_verbosity=...])`` -> ``TorchDistributor(...)``."""
    kw = keyword_args(call)
    pos = positional_args(call)
    if set(kw) - {"np", "driver_log_verbosity"} or len(pos) > 1 or (pos and "np" in kw):
        return Flagged("HorovodRunner arguments not understood (expected np=, driver_log_verbosity=)")
    if not pos and "np" not in kw:
        return Flagged("HorovodRunner without np")
    np_node = pos[0].value if pos else kw["np"].value
    value = _np_value(np_node)
    if value == 0:
        return Flagged("np=0 was deprecated in HorovodRunner; choose num_processes and local_mode")
    if value is not None:
        procs, local = str(abs(value)), str(value < 0)
    elif isinstance(np_node, (cst.Name, cst.Attribute)):
        text = code_of(np_node)
        procs, local = f"abs({text})", f"{text} < 0"
    else:
        return Flagged(f"np={code_of(np_node)} is not a literal or a name")
    ctx.need(RUNNER, "TorchDistributor", "torch")
    text = f"TorchDistributor(num_processes={procs}, local_mode={local}, use_gpu=torch.cuda.is_available())"
    note = "-> " + text
    if "driver_log_verbosity" in kw:
        note += " (driver_log_verbosity dropped: TorchDistributor has no such option)"
    return Rewritten(cst.parse_expression(text), note)


def rewrite_run(call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``.run(main, **kwargs)`` -> ``.run(functools.partial(main, **kwargs))`` (or ``.run(main)``)."""
    pos = positional_args(call)
    star_pos = [a for a in call.args if a.star == "*"]
    if len(pos) != 1 or star_pos or (call.args and call.args[0].keyword is not None):
        return Flagged("HorovodRunner.run takes main and keyword arguments only")
    rest = [a for a in call.args[1:]]
    if not rest:
        return Rewritten(call, "run(main) unchanged")
    ctx.need(RUNNER, "functools")
    pieces = [code_of(pos[0].value)]
    for arg in rest:
        if arg.star == "**":
            pieces.append("**" + code_of(arg.value))
        else:
            pieces.append(f"{arg.keyword.value}={code_of(arg.value)}")
    partial = cst.parse_expression(f"functools.partial({', '.join(pieces)})")
    new_call = call.with_changes(args=[cst.Arg(value=partial)])
    return Rewritten(new_call, "keyword arguments bound with functools.partial (TorchDistributor passes *args only)")


class RunnerVarScan(cst.CSTVisitor):
    """Collect names bound to ``HorovodRunner(...)`` instances (``hr = HorovodRunner(np=2)``)."""

    def __init__(self, runner_names: Set[str], runner_vars: Set[str]) -> None:
        self.runner_names = runner_names
        self.runner_vars = runner_vars

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and is_runner_constructor(node.value, self.runner_names):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self.runner_vars.add(target.target.value)


#: horovod.run's parameters in order (Horovod 0.28.1), and what becomes of each.
_RUN_PARAMETERS = ("func", "args", "kwargs", "np", "min_np", "max_np", "slots", "reset_limit", "hosts",
                   "hostfile", "start_timeout", "ssh_port", "ssh_identity_file", "disable_cache",
                   "output_filename", "verbose", "use_gloo", "use_mpi", "mpi_args",
                   "network_interfaces", "executable")
_RUN_DROPPED = {"hosts", "hostfile", "ssh_port", "ssh_identity_file", "disable_cache", "output_filename",
                "verbose", "use_gloo", "use_mpi", "mpi_args", "network_interfaces", "executable"}
_RUN_ELASTIC = {"min_np", "max_np", "slots", "reset_limit"}
#: Dropped arguments that say where the ranks run or where their output goes: given a value
#: other than None, losing them changes what the call does, so they become a TODO.
_RUN_WHERE = {"hosts", "hostfile", "ssh_port", "ssh_identity_file", "network_interfaces",
              "mpi_args", "executable", "output_filename"}


def is_horovod_run(call: cst.Call, aliases: Set[str]) -> bool:
    """True for ``horovod.run(...)`` with ``import horovod`` bound to one of `aliases`."""
    func = call.func
    return (isinstance(func, cst.Attribute) and func.attr.value == "run"
            and isinstance(func.value, cst.Name) and func.value.value in aliases)


def _keywords(kwargs: Optional[cst.BaseExpression]) -> str:
    """A launcher's ``kwargs={...}`` as the keyword arguments of functools.partial: ``lr=0.1`` for
    a literal dict of identifier keys, ``**kwargs`` otherwise; "" for none."""
    if kwargs is None or code_of(kwargs).strip() == "None":
        return ""
    if isinstance(kwargs, cst.Dict) and all(
            isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
            and str(e.key.evaluated_value).isidentifier() for e in kwargs.elements):
        return ", ".join(f"{e.key.evaluated_value}={code_of(e.value).strip()}" for e in kwargs.elements)
    return "**" + code_of(kwargs).strip()


def rewrite_horovod_run(call: cst.Call, ctx: RewriteContext, value_used: bool = True) -> Outcome:
    """``horovod.run(fn, args=..., kwargs=..., np=N)`` -> torch's own launcher, ``elastic_launch``
    (what torchrun runs), on this host; its ``{rank: value}`` becomes the list in rank order that
    horovod.run returned (`value_used`: the call's value is used, not a statement of its own)."""
    if any(a.star for a in call.args):
        return Flagged("horovod.run(*args/**kwargs): its arguments cannot be read")
    given = {}
    for index, arg in enumerate(call.args):
        if arg.keyword is None:
            if index >= len(_RUN_PARAMETERS):
                return Flagged("horovod.run() has too many positional arguments")
            given[_RUN_PARAMETERS[index]] = arg.value
        else:
            given[arg.keyword.value] = arg.value
    unknown = set(given) - set(_RUN_PARAMETERS)
    if unknown or "func" not in given:
        return Flagged(f"horovod.run() arguments not understood ({', '.join(sorted(unknown)) or 'no function'})")
    elastic = sorted(k for k in _RUN_ELASTIC & set(given) if code_of(given[k]).strip() != "None")
    if elastic:
        return Flagged(f"horovod.run({', '.join(elastic)}=...) is elastic; launch the script with "
                       "torchrun --nnodes=MIN:MAX --max-restarts=K instead (see the guide)")
    func = code_of(given["func"]).strip()
    args = given.get("args")
    if isinstance(args, cst.Tuple):
        if any(isinstance(e, cst.StarredElement) for e in args.elements):
            return Flagged("horovod.run(args=(*...)) with a starred element is not rewritten")
        call_args = ", ".join(code_of(e.value).strip() for e in args.elements)
    elif args is not None:
        call_args = "*" + code_of(args).strip()
    else:
        call_args = ""
    bound = _keywords(given.get("kwargs"))
    entry = func
    if bound:
        # elastic_launch passes positional arguments only, and names the job after the function
        entry = f"functools.update_wrapper(functools.partial({func}, {bound}), {func})"
        ctx.need(HOROVOD, "functools")
    options = [f"nproc_per_node={code_of(given['np']).strip() if 'np' in given else '1'}"]
    timeout = code_of(given["start_timeout"]).strip() if "start_timeout" in given else "None"
    if timeout != "None":
        options.append(f"rdzv_timeout=int({timeout})" if not isinstance(given["start_timeout"], cst.Integer)
                       else f"rdzv_timeout={timeout}")
    config = (f"LaunchConfig(min_nodes=1, max_nodes=1, {', '.join(options)}, rdzv_backend=\"c10d\", "
              "rdzv_endpoint=\"localhost:0\", run_id=\"horovod_run\", max_restarts=0)")
    launch = f"elastic_launch({config}, {entry})({call_args})"
    text = f"[value for _, value in sorted({launch}.items())]" if value_used else launch
    ctx.need(HOROVOD, "elastic_launch")
    note = ("-> torch's elastic_launch (torchrun's launcher) on this host"
            + (", its {rank: value} as the list in rank order horovod.run returned" if value_used else "")
            + "; a failed rank raises torch's ChildFailedError (Horovod raised RuntimeError)")
    dropped = sorted(_RUN_DROPPED & set(given))
    if dropped:
        note += f"; {', '.join(dropped)} dropped: ranks start on this host with gloo (nccl on GPUs)"
    where = [k for k in dropped if k in _RUN_WHERE and code_of(given[k]).strip() != "None"]
    literal = [k for k in where if isinstance(given[k], (cst.SimpleString, cst.List, cst.Tuple, cst.Integer,
                                                         cst.ConcatenatedString))]
    todo, before = None, []
    if literal:
        todo = (f"horovod.run({', '.join(f'{k}=...' for k in literal)}) placed the ranks (hosts, ssh, "
                "interfaces, output); elastic_launch starts them on this host. For several hosts run "
                "the function's script under torchrun on each host (see the guide), then delete this "
                "call's placement arguments from your launch code")
    elif where:  # chosen at run time (`hosts=args.hosts`): only a run that sets one is refused
        condition = " or ".join(f"{code_of(given[k]).strip()} is not None" for k in where)
        before.append(
            f"if {condition}:  # horovod.run placed ranks on other hosts; torch's launcher here does not\n"
            f"    raise SystemExit(\"{', '.join(where)}: run this script under torchrun on each host \"\n"
            f"                     \"(migration_guide/api_mapping.md, horovod.run)\")\n")
        note += f"; a run that sets {', '.join(where)} stops with a message (torchrun on each host)"
    return Rewritten(cst.parse_expression(text), note, todo, before)


#: horovod.spark.run's parameters in order (Horovod 0.28.1); those dropped and those kept as a TODO.
_SPARK_RUN_PARAMETERS = ("fn", "args", "kwargs", "num_proc", "start_timeout", "extra_mpi_args", "env",
                         "stdout", "stderr", "verbose", "nics", "prefix_output_with_timestamp",
                         "use_mpi", "use_gloo")
_SPARK_RUN_DROPPED = {"start_timeout", "extra_mpi_args", "verbose", "nics", "prefix_output_with_timestamp",
                      "use_mpi", "use_gloo"}


def is_horovod_spark_run(call: cst.Call, aliases: Set[str]) -> bool:
    """True for ``horovod.spark.run(...)`` with ``horovod`` bound by ``import horovod.spark``."""
    func = call.func
    return (isinstance(func, cst.Attribute) and func.attr.value == "run" and isinstance(func.value, cst.Attribute)
            and func.value.attr.value == "spark" and isinstance(func.value.value, cst.Name)
            and func.value.value.value in aliases)


def rewrite_horovod_spark_run(call: cst.Call, ctx: RewriteContext, value_used: bool) -> Outcome:
    """``horovod.spark.run(fn, args=..., kwargs=..., num_proc=N)`` as a statement ->
    ``TorchDistributor(num_processes=N, local_mode=False, use_gpu=...).run(fn, *args)``."""
    if value_used:
        return Flagged("horovod.spark.run returned every rank's value; PySpark's TorchDistributor.run "
                       "returns rank 0's: rewrite the call as TorchDistributor(num_processes=N, "
                       "local_mode=False).run(fn, *args) and collect the other ranks' values yourself")
    if any(a.star for a in call.args):
        return Flagged("horovod.spark.run(*args/**kwargs): its arguments cannot be read")
    given = {}
    for index, arg in enumerate(call.args):
        if arg.keyword is not None:
            given[arg.keyword.value] = arg.value
        elif index < len(_SPARK_RUN_PARAMETERS):
            given[_SPARK_RUN_PARAMETERS[index]] = arg.value
        else:
            return Flagged("horovod.spark.run() has too many positional arguments")
    unknown = set(given) - set(_SPARK_RUN_PARAMETERS)
    if unknown or "fn" not in given:
        return Flagged(f"horovod.spark.run() arguments not understood ({', '.join(sorted(unknown)) or 'no function'})")
    if code_of(given.get("num_proc", cst.Name("None"))).strip() == "None":
        return Flagged("horovod.spark.run without num_proc ran one rank per Spark default parallelism; "
                       "TorchDistributor needs num_processes: give num_proc")
    kept = [k for k in ("env", "stdout", "stderr") if k in given and code_of(given[k]).strip() != "None"]
    if kept:
        return Flagged(f"horovod.spark.run({', '.join(k + '=...' for k in kept)}): TorchDistributor sets no "
                       "environment for the ranks and sends their output to the driver's log; move that "
                       "setting into the function, then call TorchDistributor(...).run(fn, *args)")
    fn = code_of(given["fn"]).strip()
    args = given.get("args")
    if isinstance(args, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in args.elements):
        pieces = [code_of(e.value).strip() for e in args.elements]
    elif args is not None and code_of(args).strip() != "None":
        pieces = ["*" + code_of(args).strip()]
    else:
        pieces = []
    bound = _keywords(given.get("kwargs"))
    if bound:  # (TorchDistributor.run passes positional arguments only)
        ctx.need(HOROVOD, "functools")
        fn = f"functools.partial({fn}, {bound})"
    ctx.need(HOROVOD, "TorchDistributor", "torch")
    procs = code_of(given["num_proc"]).strip()
    text = (f"TorchDistributor(num_processes={procs}, local_mode=False, use_gpu=torch.cuda.is_available())"
            f".run({', '.join([fn, *pieces])})")
    note = ("-> PySpark's TorchDistributor (ranks as Spark tasks, torchrun's environment); a failed rank "
            "raises its RuntimeError")
    dropped = sorted(_SPARK_RUN_DROPPED & set(given))
    if dropped:
        note += f"; {', '.join(dropped)} dropped: TorchDistributor chooses its own transport and logging"
    return Rewritten(cst.parse_expression(text), note)
