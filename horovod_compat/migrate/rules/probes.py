"""``hasattr(hvd, "NAME")``: a question about Horovod's API that Horovod 0.28.1 answers.

Programs probe for Horovod's versions (``if hasattr(hvd, "Average"): kwargs = {"op": ...}``,
``hvd.rank() if hasattr(hvd, "rank") else None``) or for a fork's additions (``if args.timeline
and hasattr(hvd, "timeline"): hvd.timeline.start_timeline(...)``). Horovod 0.28.1's
``horovod.torch``, whose API the rewriter reproduces, either has NAME or does not, so the test
is decided: the branch it picks stays, the other goes, with the decision in the report. A test
is decided only where the probe settles it (``A and <no>``, ``A or <yes>``) and what stands
before the probe has no effect to lose: names, attributes, literals, comparisons and Horovod's
topology queries (``hvd.rank()``).
"""
from __future__ import annotations

from typing import List, Optional, Set

import libcst as cst

from horovod_compat.migrate.context import HVD_NAMES, HVD_SUBMODULES, hvd_attr_name

#: Names horovod.torch 0.28.1 may hold besides its API and submodules (helpers and modules it
#: imports, names added in its last releases): a probe for one of them is left undecided.
_MAYBE = {"check_extension", "gpu_available", "split_list", "is_homogeneous", "sycl_built",
          "get_process_set_ids_and_ranks", "HostsUpdatedInterrupt", "mpi_lib", "mpi_lib_v2", "torch",
          "warnings", "collections", "contextmanager", "os", "common"}
#: Horovod calls that only ask (what a decided test may call before the probe).
_QUERIES = {"rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "is_initialized"}


def answer(node: cst.BaseExpression, aliases: Set[str]) -> Optional[bool]:
    """True/False for ``hasattr(hvd, "NAME")`` (NAME in Horovod 0.28.1's horovod.torch, its API
    or a submodule, or not); None for anything else, and for a name it may hold (`_MAYBE`)."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "hasattr"
            and len(node.args) == 2 and all(a.keyword is None and a.star == "" for a in node.args)):
        return None
    module, name = node.args[0].value, node.args[1].value
    if not (isinstance(module, cst.Name) and module.value in aliases and isinstance(name, cst.SimpleString)):
        return None
    asked = name.evaluated_value
    if asked in _MAYBE:
        return None
    return asked in HVD_NAMES or asked in HVD_SUBMODULES


class _Effects(cst.CSTVisitor):
    def __init__(self, aliases: Set[str]) -> None:
        self.aliases = aliases
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        if answer(node, self.aliases) is None and hvd_attr_name(node.func, self.aliases) not in _QUERIES:
            self.found = True

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.found = True


def _quiet(node: cst.BaseExpression, aliases: Set[str]) -> bool:
    """`node` only reads: no call but Horovod's queries and probes, no assignment."""
    visitor = _Effects(aliases)
    node.visit(visitor)
    return not visitor.found


def asked(test: cst.BaseExpression, aliases: Set[str]) -> List[str]:
    """The names `test` probes for, in order."""
    found: List[str] = []

    class _Probes(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if answer(node, aliases) is not None:
                found.append(node.args[1].value.evaluated_value)  # type: ignore[attr-defined]

    test.visit(_Probes())
    return found


def decided(test: cst.BaseExpression, aliases: Set[str]) -> Optional[bool]:
    """The value of `test` where a probe settles it (see the module docstring), else None."""
    known = answer(test, aliases)
    if known is not None:
        return known
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = decided(test.expression, aliases)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        settles = isinstance(test.operator, cst.Or)  # the value that settles the operator
        left, right = decided(test.left, aliases), decided(test.right, aliases)
        if left is not None:
            return settles if left == settles else right
        if right == settles and _quiet(test.left, aliases):
            return settles
    return None
