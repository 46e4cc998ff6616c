"""Elastic Horovod -> a torchrun-elastic script (``torchrun --nnodes=MIN:MAX --max-restarts=K``).

Horovod elastic kept the surviving workers running: ``@hvd.elastic.run`` caught the failure,
rolled the ``TorchState`` back to its last ``commit()`` (kept in memory) and re-synced it from
rank 0.  torchrun instead restarts *every* worker, so the state must survive a process restart:

* ``hvd.elastic.TorchState(model, optimizer, **values)`` -> ``_NativeElasticState(...)`` (helpers.py):
  ``commit()`` saves a checkpoint from rank 0; the constructor resumes from it when it exists and
  then runs the reset callbacks (a restart is the reset); ``check_host_updates()`` is a no-op.
  The model it is given is the DDP-wrapped one (optimizer.py renames it), so ``state.model(x)``
  still averages gradients;
* ``@hvd.elastic.run`` is dropped: the function just runs (resuming happened in the constructor);
* ``hvd.elastic.ElasticSampler(ds, shuffle, seed)`` -> ``_NativeElasticSampler(...)``, which shards
  what is left of the epoch over the current ranks.
"""
from __future__ import annotations

from typing import Callable, Dict

import libcst as cst

from horovod_compat.migrate.context import Flagged, Outcome, RewriteContext, Rewritten, has_star_args, keyword_args

DECORATOR = "elastic.run"
#: hvd.elastic.X -> the helper that replaces it, and the keywords Horovod's X accepted (None: any).
_CLASSES = {
    "elastic.TorchState": ("_NativeElasticState", None),
    "elastic.ElasticSampler": ("_NativeElasticSampler", {"shuffle", "seed"}),
}


def rewrite_class(name: str, call: cst.Call, ctx: RewriteContext) -> Outcome:
    """``hvd.elastic.TorchState(...)`` / ``ElasticSampler(...)`` -> the native helper, same arguments."""
    helper, allowed = _CLASSES[name]
    if has_star_args(call) and allowed is not None:
        return Flagged(f"hvd.{name}(*args/**kwargs): arguments cannot be read")
    if allowed is not None and set(keyword_args(call)) - allowed:
        return Flagged(f"hvd.{name}() arguments not understood (expected dataset, shuffle=, seed=)")
    if name == "elastic.TorchState" and "path" in keyword_args(call):
        return Flagged("TorchState(path=...) would be taken as the checkpoint path; rename that value")
    ctx.need_helper(helper)
    note = ("-> checkpointed by rank 0 at each commit(), resumed at start (torchrun restarts every worker)"
            if helper == "_NativeElasticState" else "-> shards the rest of the epoch over the current ranks")
    return Rewritten(call.with_changes(func=cst.Name(helper)), note)


CALLS: Dict[str, Callable[[str, cst.Call, RewriteContext], Outcome]] = {name: rewrite_class for name in _CLASSES}
