"""Why each ``horovod.torch`` name the rewriter does not rewrite is left for a person.

Every ``hvd.X`` that no rule rewrites gets a ``# TODO(horovod-compat): hvd.X: <reason>`` comment
and stays as it was (it keeps working on the horovod-compat shim), so the output never trains
differently from the input without saying so.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

import libcst as cst

from horovod_compat.migrate.context import HVD_NAMES, code_of

_ASYNC = (
    "async handles (poll/synchronize) have no one-line native form; use "
    "dist.all_reduce(..., async_op=True).wait() and mind that it sums in place"
)

#: For a Horovod value the rewrite makes native only where the whole file becomes native.
_KEPT = ("kept: Horovod calls remain in this file and work with Horovod's own {}; once the file "
         "becomes native this is {}")

REASONS = {
    "grouped_allgather": "no grouped native form; one dist.all_gather per tensor (sizes may differ)",
    "grouped_allreduce": "no grouped native form; one dist.all_reduce per tensor (Horovod averaged)",
    "grouped_allreduce_": "no grouped native form; one dist.all_reduce per tensor (Horovod averaged)",
    "grouped_reducescatter": "no grouped native form; one dist.reduce_scatter_tensor per tensor",
    "grouped_allreduce_async": _ASYNC,
    "grouped_allreduce_async_": _ASYNC,
    "sparse_allreduce_async": "sparse allreduce (allgather of indices and values) has no native form",
    "alltoall": "dist.all_to_all_single takes explicit input/output split sizes; returned splits must be exchanged first",
    "reducescatter": "dist.reduce_scatter_tensor needs equal chunks and sums; Horovod averaged by default",
    "Adasum": "Adasum has no torch.distributed/DDP equivalent",
    "Average": _KEPT.format("reduce ops", '"average"'),
    "Sum": _KEPT.format("reduce ops", '"sum"'),
    "Min": _KEPT.format("reduce ops", '"min"'),
    "Max": _KEPT.format("reduce ops", '"max"'),
    "Product": _KEPT.format("reduce ops", '"product"'),
    "global_process_set": _KEPT.format("sets", "None, the default group"),
    "start_timeline": "the Horovod timeline has no native form; use torch.profiler (see the guide)",
    "stop_timeline": "the Horovod timeline has no native form; use torch.profiler (see the guide)",
    "elastic": "Horovod elastic maps to torchrun --max-restarts with your own checkpointing; restructure by hand",
    "SyncBatchNorm": (
        "use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP "
        "(it syncs only inside DDP)"
    ),
    "Compression": _KEPT.format("compressors", "DDP's default_hooks.fp16_compress_hook or None"),
    "HorovodInternalError": _KEPT.format("exception", "dist.DistBackendError"),
    "mpi_threads_supported": "no torch.distributed equivalent",
    "mpi_enabled": "no torch.distributed equivalent (MPI is not used by torchrun)",
    "DistributedOptimizer": "see the rule's reason",
}


def reason_for(name: str) -> str:
    """The TODO text for ``hvd.<name>`` (dotted names use their first component)."""
    head = name.split(".")[0]
    if head in REASONS:
        return REASONS[head]
    if head not in HVD_NAMES:
        return (f"`{head}` is not in Horovod 0.28.1's horovod.torch (a fork's or another library's "
                "name?): the rewriter knows only Horovod's API; migrate this use by hand")
    return "the rewriter has no native mapping for this name"


# Horovod reached in ways one file does not show. The rewriter follows `hvd` where this file
# imports Horovod's binding; code that gets the module another way (a framework's wrapper
# module, a module name in a string) would otherwise come out unchanged and be called native.

#: Horovod-only optimizer calls, whatever the receiver is called.
_HOROVOD_ONLY = ("DistributedOptimizer", "broadcast_optimizer_state")
#: A module of Horovod's, named in a string: one of Horovod 0.28's packages (not a file name such
#: as a FileLock's "horovod.lock").
_MODULE_NAME = r"horovod\.(?:torch|tensorflow|keras|_keras|spark|ray|mxnet|runner|common|data)(?:\.[A-Za-z_]\w*)*"
#: Source text that may reach Horovod in one of those ways (engine.py's quick look at a file).
REACHED_BY_OTHER_NAMES = re.compile(rf"\.(?:{'|'.join(_HOROVOD_ONLY)})\(|[\"']{_MODULE_NAME}[\"']")

MODULE_BY_NAME = ("names Horovod's module in a string: code that imports it at run time (importlib."
                  "import_module, __import__) is not followed by the rewriter; import it as "
                  "`import horovod.torch as hvd` where it is used, or migrate that code by hand")


def unfollowed_horovod_call(call: cst.Call) -> Optional[Tuple[str, str]]:
    """(name, reason) for ``X.DistributedOptimizer(...)`` or ``X.broadcast_optimizer_state(...)``
    where X is no import of Horovod in this file (the caller has checked that) and no torch
    module (``torch.distributed.optim.DistributedOptimizer`` is torch's RPC optimizer)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in _HOROVOD_ONLY):
        return None
    receiver = code_of(func.value).strip()
    if re.match(r"(?:torch|dist|rpc|optim)\b", receiver):
        return None
    return (f"{receiver}.{func.attr.value}",
            f"looks like Horovod's {func.attr.value}, reached through `{receiver}`, which this file "
            "does not import from horovod.torch: the rewriter cannot follow it (import horovod.torch "
            "as hvd where it is used, or migrate it by hand)")


def horovod_module_named(node: cst.SimpleString) -> Optional[str]:
    """The module a string literal names when it is a module of Horovod's (``"horovod.torch"``)."""
    value = node.evaluated_value
    if isinstance(value, str) and re.fullmatch(_MODULE_NAME, value):
        return repr(value)
    return None
