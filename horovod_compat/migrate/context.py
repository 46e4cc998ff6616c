"""State shared by the rewrite rules while one file (or one notebook cell) is rewritten.

The rules are small functions; they need to know how Horovod was imported (`hvd_aliases`),
record the native imports and helper functions their output needs, and record findings for
the report.  All of that lives here so each rule module stays a pure "node in, node out" map.
"""
from __future__ import annotations

import dataclasses
import io
import tokenize
from typing import Dict, List, Optional, Set, Union

import libcst as cst

from horovod_compat.migrate.helpers import REQUIRES
from horovod_compat.migrate.report import Finding, Kind

#: Import families: native imports are inserted next to the import they replace, so that an
#: import inside a training function (the Databricks pattern) stays inside that function.
HVD = "hvd"
RUNNER = "runner"
HOROVOD = "horovod"  # a bare `import horovod`, for horovod.run(...)
FAMILIES = (HVD, RUNNER, HOROVOD)

#: Every public name of ``horovod.torch`` (Horovod 0.28.1).
HVD_NAMES = frozenset("""
    elastic Compression allgather_object broadcast_object broadcast_optimizer_state
    broadcast_parameters allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce
    grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async
    allgather allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_async
    broadcast_ broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
    grouped_reducescatter grouped_reducescatter_async join barrier poll synchronize init shutdown
    is_initialized start_timeline stop_timeline size local_size cross_size rank local_rank
    cross_rank mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
    ddl_built ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set
    remove_process_set Average Sum Adasum Min Max Product HorovodInternalError
    DistributedOptimizer SyncBatchNorm
""".split())
#: Submodules of ``horovod.torch`` whose public names ``horovod.torch`` re-exports.
HVD_SUBMODULES = frozenset({"mpi_ops", "functions", "compression", "optimizer", "sync_batch_norm"})

#: The import statement that binds each name a rewrite may need.
IMPORT_FOR_NAME: Dict[str, str] = {
    "atexit": "import atexit",
    "gc": "import gc",
    "os": "import os",
    "torch": "import torch",
    "dist": "import torch.distributed as dist",
    "DDP": "from torch.nn.parallel import DistributedDataParallel as DDP",
    "default_hooks": "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
    # DDP in place (rules/inplace.py): torch's composable API, under its private package name
    "replicate": "from torch.distributed._composable import replicate",
    "functools": "import functools",
    "contextlib": "import contextlib",
    # hvd.join() after a DDP-wrapped model's training loop -> the loop under DDP's Join
    "Join": "from torch.distributed.algorithms.join import Join",
    # HorovodRunner -> PySpark's own TorchDistributor (it needs an active SparkSession, which a
    # Databricks notebook has; this project's distributor.TorchDistributor, same API, does not)
    "TorchDistributor": "from pyspark.ml.torch.distributor import TorchDistributor",
    # horovod.run(fn, ...) -> torch's own launcher, on this host
    "elastic_launch": "from torch.distributed.launcher.api import LaunchConfig, elastic_launch",
}


@dataclasses.dataclass
class Rewritten:
    """A rule's replacement for a node, with a one-line note for the verbose report."""

    node: Union[cst.BaseExpression, List[cst.BaseStatement]]
    note: str
    #: What the replacement cannot carry over (a dropped argument): a TODO left beside it.
    todo: Optional[str] = None
    #: Statements (source text) that go before the statement holding the replaced expression.
    before: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Flagged:
    """A rule's refusal: the node stays, and `message` says what a person must decide and why."""

    message: str


Outcome = Union[Rewritten, Flagged]


@dataclasses.dataclass
class SharedState:
    """Facts that span all units of one input (a .py file is one unit; a notebook, one per cell).

    `global_imports` are names bound by module-level imports in any unit (a notebook's cells share
    one namespace). `runner_vars` are names bound to `HorovodRunner(...)` instances.
    """

    global_imports: Set[str] = dataclasses.field(default_factory=set)
    runner_vars: Set[str] = dataclasses.field(default_factory=set)
    runner_names: Set[str] = dataclasses.field(default_factory=set)
    hvd_aliases: Set[str] = dataclasses.field(default_factory=set)
    horovod_aliases: Set[str] = dataclasses.field(default_factory=set)
    #: The input imports PyTorch Lightning (its hook names then mean Lightning hooks).
    lightning: bool = False
    #: Horovod uses remain after the rewrite: ``hvd.init()``/``hvd.shutdown()`` stay beside
    #: their native replacements, so the partly migrated program still runs.
    keep_horovod_lifecycle: bool = False
    #: The rewrite aims at a file with no Horovod left: Horovod constants used as values become
    #: native values (rules/constants.py), async handles, process sets and join are rewritten.
    #: Off in the second pass when Horovod uses remain: those calls need Horovod's own objects.
    all_native: bool = True
    #: Every name the input uses (a name the rewrite introduces, such as a loop variable, avoids them).
    names: Set[str] = dataclasses.field(default_factory=set)
    #: The input calls hvd.join(): its reductions must tell joined ranks to take part.
    calls_join: bool = False
    #: `--emulate`: a DistributedOptimizer that torch's data parallelism cannot take becomes
    #: ``_native_distributed_optimizer`` (Horovod's averaging) instead of staying with a TODO.
    emulate: bool = False

    def aliases(self, family: str) -> Set[str]:
        """The local names an import of `family` binds."""
        return {HVD: self.hvd_aliases, RUNNER: self.runner_names, HOROVOD: self.horovod_aliases}[family]


@dataclasses.dataclass
class RewriteContext:
    """Per-unit state: where we are, what the output needs, and what we found."""

    location: str
    shared: SharedState
    line_offset: int = 0
    needs: Dict[str, Set[str]] = dataclasses.field(
        default_factory=lambda: {family: set() for family in FAMILIES}
    )
    helpers: List[str] = dataclasses.field(default_factory=list)
    findings: List[Finding] = dataclasses.field(default_factory=list)

    @property
    def hvd_aliases(self) -> Set[str]:
        """Local names under which `horovod.torch` is imported (usually just ``hvd``)."""
        return self.shared.hvd_aliases

    def need(self, family: str, *names: str) -> None:
        """Record that rewritten code of `family` (one of FAMILIES) uses these imported names."""
        for name in names:
            if name not in IMPORT_FOR_NAME:
                raise KeyError(f"no import known for {name!r}")
            self.needs[family].add(name)

    def need_helper(self, name: str) -> None:
        """Record that the module needs the native helper function `name` (see helpers.py), and
        the helpers it calls."""
        for required in REQUIRES.get(name, ()):
            self.need_helper(required)
        if name not in self.helpers:
            self.helpers.append(name)

    def rewrite(self, line: int, name: str, message: str) -> None:
        """Record a rewrite made at input `line`."""
        self.findings.append(
            Finding(self.location, line + self.line_offset, Kind.REWRITE, name, message)
        )

    def todo(self, line: int, name: str, message: str) -> None:
        """Record a TODO left at input `line`."""
        self.findings.append(
            Finding(self.location, line + self.line_offset, Kind.TODO, name, message)
        )


def hvd_attr_name(node: cst.CSTNode, aliases: Set[str]) -> Optional[str]:
    """``hvd.X`` (with ``hvd`` one of `aliases`) -> ``"X"``; anything else -> None.

    Nested names such as ``hvd.Compression.fp16`` return the dotted tail (``"Compression.fp16"``);
    a re-exported name reached through its submodule is the name itself (``hvd.mpi_ops.Sum``:
    ``"Sum"``).
    """
    parts: List[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name) and node.value in aliases and parts:
        if len(parts) > 1 and parts[-1] in HVD_SUBMODULES and parts[-2] in HVD_NAMES:
            parts.pop()  # hvd.mpi_ops.Sum is hvd.Sum: horovod.torch re-exports it
        return ".".join(reversed(parts))
    return None


def code_of(node: cst.CSTNode) -> str:
    """Source text of a node exactly as written (formatting and comments kept)."""
    return cst.Module(body=[]).code_for_node(node)


def without_comments(code: str) -> str:
    """`code` with each comment blanked out (lines and columns kept), for the text scans of a
    module: a commented-out ``clip_grad_norm_(...)`` is not a gradient read."""
    lines = code.splitlines(keepends=True)
    try:
        comments = [tok.start for tok in tokenize.generate_tokens(io.StringIO(code).readline)
                    if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    for row, col in comments:
        line = lines[row - 1]
        end = len(line.rstrip("\r\n"))
        lines[row - 1] = line[:col] + " " * (end - col) + line[end:]
    return "".join(lines)


def keyword_args(call: cst.Call) -> Dict[str, cst.Arg]:
    """The keyword arguments of `call`, by name."""
    return {a.keyword.value: a for a in call.args if a.keyword is not None}


def positional_args(call: cst.Call) -> List[cst.Arg]:
    """The plain positional arguments of `call` (not ``*args``/``**kwargs``)."""
    return [a for a in call.args if a.keyword is None and a.star == ""]


def has_star_args(call: cst.Call) -> bool:
    """True when `call` uses ``*args`` or ``**kwargs`` (its arguments cannot be read statically)."""
    return any(a.star != "" for a in call.args)


def free_name(base: str, taken: Set[str]) -> str:
    """`base`, or `base_2`, `base_3`, ... : the first not in `taken` (which it joins)."""
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name
