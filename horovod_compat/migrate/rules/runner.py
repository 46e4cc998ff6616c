"""Databricks ``HorovodRunner(np=N).run(main, **kwargs)`` -> ``TorchDistributor(...).run(main)``.

* ``np > 0`` ran N ranks as Spark tasks: ``num_processes=N, local_mode=False``.
* ``np < 0`` ran -N ranks on the driver only: ``num_processes=-N, local_mode=True``.
* ``np = 0`` was deprecated (one rank per ... nothing sensible today): flagged.
* HorovodRunner used the GPUs it found; TorchDistributor must be told: ``use_gpu`` becomes
  ``torch.cuda.is_available()``, evaluated where the distributor is built (the driver).
* ``run(main, **kwargs)`` called ``main(**kwargs)``; ``TorchDistributor.run(main, *args)`` passes
  positional arguments only, so keyword arguments are bound with ``functools.partial``.
* ``driver_log_verbosity`` only chose how much output the driver shows; it is dropped.
* ``TorchDistributor`` is imported from ``distributor`` (shipped with horovod-compat, PySpark's
  API), which needs no SparkSession for ``local_mode=True``; see ``IMPORT_FOR_NAME``.

``horovod.run(fn, args=(...), kwargs={...}, np=N, ...)`` (Horovod's in-process launcher, which
returned every rank's value in rank order) becomes
``distributor.run_function(fn, *args, num_processes=N, return_all=True, **kwargs)``: the engine
horovod-compat ships, which starts the ranks on this host under the torchrun contract.  Options
that only chose how Horovod talked (``use_gloo``, ``use_mpi``, ``verbose``, ``disable_cache``,
``network_interfaces``, ...) are dropped with a note; ``hosts``/``hostfile`` are dropped with a
note too (every rank starts on this host; several hosts are launched with torchrun on each one,
see the guide); elastic options (``min_np``, ``max_np``, ``reset_limit``, ``slots``) are flagged.
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


def rewrite_horovod_run(call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``horovod.run(fn, args=..., kwargs=..., np=N)`` -> ``distributor.run_function(..., return_all=True)``."""
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
    pieces = [code_of(given["func"]).strip()]
    args = given.get("args")
    if isinstance(args, cst.Tuple):
        pieces += [code_of(e.value).strip() for e in args.elements if not isinstance(e, cst.StarredElement)]
        if any(isinstance(e, cst.StarredElement) for e in args.elements):
            return Flagged("horovod.run(args=(*...)) with a starred element is not rewritten")
    elif args is not None:
        pieces.append("*" + code_of(args).strip())
    pieces.append(f"num_processes={code_of(given['np']).strip() if 'np' in given else '1'}")
    if "start_timeout" in given and code_of(given["start_timeout"]).strip() != "None":
        timeout = code_of(given["start_timeout"]).strip()
        pieces.append(f"start_timeout={timeout}" if isinstance(given["start_timeout"], (cst.Integer, cst.Float))
                      else f"start_timeout={timeout} or 120.0")
    pieces.append("return_all=True")
    kwargs = given.get("kwargs")
    if isinstance(kwargs, cst.Dict) and all(
            isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
            and str(e.key.evaluated_value).isidentifier() for e in kwargs.elements):
        pieces += [f"{e.key.evaluated_value}={code_of(e.value).strip()}" for e in kwargs.elements]
    elif kwargs is not None and code_of(kwargs).strip() != "None":
        pieces.append("**" + code_of(kwargs).strip())
    ctx.need(HOROVOD, "distributor")
    text = f"distributor.run_function({', '.join(pieces)})"
    note = "-> " + text + " (every rank's value, in rank order, as horovod.run returned)"
    dropped = sorted(_RUN_DROPPED & set(given))
    if dropped:
        note += (f"; {', '.join(dropped)} dropped: ranks start on this host with gloo (nccl on GPUs); "
                 "for several hosts run the script under torchrun on each host")
    lost = [k for k in dropped if k in _RUN_WHERE and code_of(given[k]).strip() != "None"]
    todo = None
    if lost:
        todo = (f"horovod.run({', '.join(f'{k}=...' for k in lost)}) placed the ranks (hosts, ssh, "
                "interfaces, output); distributor.run_function starts them on this host. For several "
                "hosts run the function's script under torchrun on each host (see the guide), then "
                "delete this call's placement arguments from your launch code")
    return Rewritten(cst.parse_expression(text), note, todo)
