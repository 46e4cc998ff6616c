"""Why each ``horovod.torch`` name the rewriter does not rewrite is left for a person.

Every ``hvd.X`` that no rule rewrites gets a ``# TODO(horovod-compat): hvd.X: <reason>`` comment
and stays as it was (it keeps working on the horovod-compat shim), so the output never trains
differently from the input without saying so.
"""
from __future__ import annotations

_ASYNC = (
    "async handles (poll/synchronize) have no one-line native form; use "
    "dist.all_reduce(..., async_op=True).wait() and mind that it sums in place"
)

#: For a Horovod value the rewrite makes native only where the whole file becomes native.
_KEPT = ("kept: Horovod calls remain in this file and work with Horovod's own {}; once the file "
         "becomes native this is {}")

REASONS = {
    "allgather_async": _ASYNC,
    "grouped_allgather": "no grouped native form; one dist.all_gather per tensor (sizes may differ)",
    "grouped_allreduce": "no grouped native form; one dist.all_reduce per tensor (Horovod averaged)",
    "grouped_allreduce_": "no grouped native form; one dist.all_reduce per tensor (Horovod averaged)",
    "grouped_reducescatter": "no grouped native form; one dist.reduce_scatter_tensor per tensor",
    "grouped_allreduce_async": _ASYNC,
    "grouped_allreduce_async_": _ASYNC,
    "broadcast_async": _ASYNC,
    "broadcast_async_": _ASYNC,
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
    return "the rewriter has no native mapping for this name"
