"""Lifecycle and topology: ``hvd.init/shutdown/rank/size/local_rank/...`` -> torch.distributed.

Under ``torchrun`` or ``TorchDistributor`` every rank has ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` in its environment, and
``init_process_group`` reads the rendezvous from ``MASTER_ADDR``/``MASTER_PORT``.  A process
started without them runs alone (rank 0 of 1), as a Horovod script did without ``horovodrun``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import libcst as cst

from horovod_compat.migrate.context import HVD, Flagged, Outcome, RewriteContext, Rewritten, code_of, keyword_args

#: hvd.X() -> (native expression, names it needs imported, note).  Only zero-argument calls.
_EXPRESSIONS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "rank": ("dist.get_rank()", ("dist",)),
    "size": ("dist.get_world_size()", ("dist",)),
    "local_rank": ('int(os.environ["LOCAL_RANK"])', ("os",)),
    "local_size": ('int(os.environ["LOCAL_WORLD_SIZE"])', ("os",)),
    # torchrun numbers its nodes (agents) with GROUP_RANK; it requires the same number of
    # processes on every node, so the node count is world size / local world size.
    "cross_rank": ('int(os.environ["GROUP_RANK"])', ("os",)),
    "cross_size": ('dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"])', ("dist", "os")),
    "is_initialized": ("dist.is_initialized()", ("dist",)),
    # Capability queries: Horovod reports what it was built with; the native question is what
    # this torch build offers.  Truthiness matches (nccl_built returned a version int).
    "nccl_built": ("dist.is_nccl_available()", ("dist",)),
    "gloo_built": ("dist.is_gloo_available()", ("dist",)),
    "gloo_enabled": ("dist.is_gloo_available()", ("dist",)),
    "mpi_built": ("dist.is_mpi_available()", ("dist",)),
    "cuda_built": ("torch.backends.cuda.is_built()", ("torch",)),
    "rocm_built": ("torch.version.hip is not None", ("torch",)),
    # Horovod answers False for these on any torch build we target; there is no native question.
    "ddl_built": ("False", ()),
    "ccl_built": ("False", ()),
}

# hvd.init() also left the job at interpreter exit; without it a gloo/NCCL thread can abort the
# process during Python's finalization after the script succeeded. Guarded: the script may have
# destroyed the group itself (hvd.shutdown()), and a second destroy raises at exit.
#: A group that something still references outlives destroy_process_group(): its gloo threads
#: outlive the interpreter and may abort the exit (troubleshooting.md). torch.distributed.nn,
#: imported after the group exists (torch._dynamo imports it at the first optimizer), keeps it in
#: its default arguments: imported first, they stay None. (It is bound as `dist_nn`: a plain
#: `import torch.distributed.nn` would make `torch` a local name of the function around it.) A
#: module made data-parallel in place (replicate) that the program dropped still holds the group
#: until the garbage collector runs: gc.collect, registered last, runs first at exit.
#: Started without a launcher (`python train.py`, no RANK), Horovod ran as rank 0 of 1: the block
#: then sets what torchrun would for one process, the variables init_process_group and the
#: rewritten hvd.local_rank()/local_size()/cross_rank() read (MASTER_PORT 0: any free port).
#: torchrun and TorchDistributor set RANK, and nothing changes there. Under mpirun (Open MPI's
#: OMPI_COMM_WORLD_RANK, MPICH's PMI_RANK) nothing is set either: each of its processes must not
#: train alone as rank 0 of 1; init_process_group then says that RANK is missing (use torchrun).
#: With CUDA the group has both backends, as Horovod moved CPU tensors on gloo (or MPI) and CUDA
#: tensors on NCCL: "nccl" alone fails the first CPU tensor (a CPU model, a metric averaged on the
#: CPU) with "No backend type associated with device type cpu" (seen on an H200, 2026-11-30).
_INIT = """\
if not dist.is_initialized():
    import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
    # no launcher (torchrun sets RANK, mpirun its own): rank 0 of 1, as Horovod ran without one
    if not any(name in os.environ for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
"""
_SET_DEVICE = """\
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
"""
_SHUTDOWN = """\
if dist.is_initialized():
    dist.destroy_process_group()
"""


def rewrite_call(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.rank()`` and friends as expressions."""
    native = _EXPRESSIONS[name]
    if call.args:
        return Flagged(f"hvd.{name}() called with arguments; the rewriter knows only the no-argument form")
    text, imports = native
    ctx.need(HVD, *imports)
    return Rewritten(cst.parse_expression(text), f"-> {text}")


def _statements(*sources: str) -> List[cst.BaseStatement]:
    return [cst.parse_statement(src) for src in sources]


def rewrite_init(call: cst.Call, ctx: RewriteContext, pin_device: bool = True) -> Outcome:
    """``hvd.init()`` as a statement -> process group (gloo on CPU, nccl on CUDA) + device pinning.

    Horovod allowed ``init()`` twice, hence the ``is_initialized`` guard.  When the next statement
    already calls ``torch.cuda.set_device`` (the Horovod idiom), the device is not pinned twice.  Arguments (an MPI
    communicator, a rank list, process sets) have no torchrun equivalent and are flagged.
    """
    kw = keyword_args(call)
    if set(kw) - {"process_sets"} or any(a.keyword is None for a in call.args):
        return Flagged(
            "hvd.init(comm=...): Horovod ran on a communicator's ranks only; torchrun starts every "
            "rank into the job: make the ranks outside it leave, or use dist.new_group(ranks)"
        )
    kept = _kept(call, ctx)
    if "process_sets" in kw:
        if not ctx.shared.all_native:
            return Flagged("hvd.init(process_sets=...) stays while Horovod calls remain in this file")
        sets = kw["process_sets"].value
        if not (isinstance(sets, cst.SimpleString) and sets.evaluated_value == "dynamic"):
            # ProcessSet objects made before init: their groups are created once the job is up
            ctx.need_helper("_NativeProcessSet")
            kept = _statements(f"for _process_set in {code_of(sets)}:\n    _process_set.register()\n") + kept
    ctx.need(HVD, "dist", "torch", "os", "atexit", "gc")
    if not pin_device:  # the script pins its device itself, right after hvd.init()
        return Rewritten(_statements(_INIT) + kept,
                         "-> dist.init_process_group(nccl on CUDA else gloo)" + _kept_note("init", kept))
    return Rewritten(
        _statements(_INIT, _SET_DEVICE) + kept,
        "-> dist.init_process_group(nccl on CUDA else gloo) + torch.cuda.set_device(LOCAL_RANK)"
        + _kept_note("init", kept),
    )


def _kept_note(name: str, kept: List[cst.BaseStatement]) -> str:
    return f" (hvd.{name}() kept: Horovod calls remain in this file)" if kept else ""


def _kept(call: cst.Call, ctx: RewriteContext) -> List[cst.BaseStatement]:
    """The Horovod call itself, kept after its native replacement while other Horovod uses remain
    in the input (`SharedState.keep_horovod_lifecycle`): a partly migrated program still runs."""
    if not ctx.shared.keep_horovod_lifecycle:
        return []
    return [cst.SimpleStatementLine([cst.Expr(call)])]


def rewrite_shutdown(call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.shutdown()`` as a statement -> ``dist.destroy_process_group()`` when initialized."""
    if call.args:
        return Flagged("hvd.shutdown() with arguments is not understood")
    ctx.need(HVD, "dist")
    kept = _kept(call, ctx)  # Horovod leaves first, then the process group goes
    return Rewritten(kept + _statements(_SHUTDOWN),
                     "-> dist.destroy_process_group()" + _kept_note("shutdown", kept))


CALLS: Dict[str, Callable[[str, cst.Call, RewriteContext], Outcome]] = {
    name: rewrite_call for name in _EXPRESSIONS
}
STATEMENTS: Dict[str, Callable[[cst.Call, RewriteContext], Outcome]] = {
    "init": rewrite_init,
    "shutdown": rewrite_shutdown,
}
