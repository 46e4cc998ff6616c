"""PyTorch Lightning on Horovod -> Lightning's native DDP strategy.

Lightning 1.x ran on Horovod with ``Trainer(accelerator='horovod', gpus=...)`` (later
``strategy='horovod'``): one process per device, started by horovodrun.  Its native equivalent,
started by torchrun (or anything that sets the torchrun environment), is
``Trainer(strategy='ddp', accelerator=..., devices=<processes on this node>, num_nodes=<nodes>)``:
Lightning's DDP strategy then joins the process group torchrun describes (or the one the script
already initialised) and checks ``devices``/``num_nodes`` against ``LOCAL_WORLD_SIZE``/``WORLD_SIZE``.

``gpus=g`` meant one GPU per process when ``g`` was true, else CPU, so it becomes
``accelerator='gpu' if g else 'cpu'``.

Lightning 2.0 removed the 1.x epoch-end hooks (a module defining ``validation_epoch_end`` makes
``fit`` raise) and stopped calling the old callback hooks (``on_epoch_end``, ``on_init_start``,
...), which no Horovod release can run either (Horovod's Lightning support ended with Lightning 1).
What replaces them depends on what they did, so each is flagged with a pointer to Lightning's
upgrade notes.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from horovod_compat.migrate.context import HVD, Flagged, Outcome, RewriteContext, Rewritten, code_of, keyword_args

UPGRADE_NOTES = "https://lightning.ai/docs/pytorch/stable/upgrade/migration_guide.html"

#: LightningModule hooks Lightning 2 refuses (fit raises), and callback hooks it no longer calls.
REMOVED_HOOKS = {
    "training_epoch_end": "removed in Lightning 2.0 (fit raises): move it to on_train_epoch_end, "
                          "keeping the step outputs yourself",
    "validation_epoch_end": "removed in Lightning 2.0 (fit raises): move it to on_validation_epoch_end, "
                            "keeping the step outputs yourself",
    "test_epoch_end": "removed in Lightning 2.0 (fit raises): move it to on_test_epoch_end, "
                      "keeping the step outputs yourself",
    "training_step_end": "no longer called since Lightning 2.0 (removed with the DP strategy; fit does not "
                         "say so): move its logic into training_step, or to on_train_batch_end",
    "validation_step_end": "no longer called since Lightning 2.0 (removed with the DP strategy; fit does not "
                           "say so): move its logic into validation_step, or to on_validation_batch_end",
    "test_step_end": "no longer called since Lightning 2.0 (removed with the DP strategy; fit does not say "
                     "so): move its logic into test_step, or to on_test_batch_end",
    "on_epoch_start": "no longer called since Lightning 1.8: use on_train_epoch_start / on_validation_epoch_start",
    "on_epoch_end": "no longer called since Lightning 1.8: use on_train_epoch_end / on_validation_epoch_end",
    "on_init_start": "no longer called since Lightning 1.8: do it before constructing the Trainer",
    "on_init_end": "no longer called since Lightning 1.8: do it after constructing the Trainer",
    "on_batch_start": "no longer called since Lightning 1.8: use on_train_batch_start",
    "on_batch_end": "no longer called since Lightning 1.8: use on_train_batch_end",
}

_IMPORTS_LIGHTNING = re.compile(r"^\s*(from|import)\s+(pytorch_lightning|lightning)\b", re.MULTILINE)


def uses_lightning(source: str) -> bool:
    """True when the source imports PyTorch Lightning (so its hook names mean Lightning hooks)."""
    return bool(_IMPORTS_LIGHTNING.search(source))


def _horovod_literal(arg: Optional[cst.Arg]) -> bool:
    return (arg is not None and isinstance(arg.value, cst.SimpleString)
            and arg.value.evaluated_value == "horovod")


def is_horovod_trainer(call: cst.Call) -> bool:
    """``Trainer(..., accelerator='horovod')`` or ``strategy='horovod'`` (any ``X.Trainer``)."""
    func = call.func
    name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
    kw = keyword_args(call)
    return name == "Trainer" and (_horovod_literal(kw.get("accelerator")) or _horovod_literal(kw.get("strategy")))


_LOCAL = 'int(os.environ.get("LOCAL_WORLD_SIZE", "1"))'
_NODES = f'int(os.environ.get("WORLD_SIZE", "1")) // {_LOCAL}'


def rewrite_trainer(call: cst.Call, ctx: RewriteContext) -> Outcome:
    """The Horovod Trainer -> Lightning's DDP strategy over the processes torchrun started."""
    kw = keyword_args(call)
    clashes = sorted({"devices", "num_nodes", "num_processes"} & set(kw))
    if clashes or ("strategy" in kw and not _horovod_literal(kw["strategy"])):
        return Flagged(f"Trainer(accelerator='horovod') with {', '.join(clashes) or 'strategy'}= given: "
                       "decide devices/num_nodes for strategy='ddp' by hand")
    gpus = kw.get("gpus")
    if gpus is not None:
        value = gpus.value
        text = code_of(value).strip()
        if not (value.lpar or isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer))):
            text = f"({text})"
        accelerator = f'"gpu" if {text} else "cpu"'
    elif "accelerator" in kw and not _horovod_literal(kw["accelerator"]):
        accelerator = code_of(kw["accelerator"].value).strip()
    else:
        accelerator = '"auto"'
    new_args = []
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in ("accelerator", "strategy", "gpus"):
            continue
        new_args.append(arg)
    head = [
        cst.Arg(cst.parse_expression('"ddp"'), keyword=cst.Name("strategy")),
        cst.Arg(cst.parse_expression(accelerator), keyword=cst.Name("accelerator")),
        cst.Arg(cst.parse_expression(_LOCAL), keyword=cst.Name("devices")),
        cst.Arg(cst.parse_expression(_NODES), keyword=cst.Name("num_nodes")),
    ]
    ctx.need(HVD, "os")
    # The new arguments take the layout of the first original one (one per line in most scripts).
    first = call.args[0].comma if call.args else cst.MaybeSentinel.DEFAULT
    comma = first if isinstance(first, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    equal = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    args = [a.with_changes(equal=equal, comma=comma) for a in head]
    if not new_args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return Rewritten(call.with_changes(args=[*args, *new_args]),
                     "-> strategy='ddp' on the processes torchrun started (devices = LOCAL_WORLD_SIZE, "
                     "num_nodes = WORLD_SIZE / LOCAL_WORLD_SIZE); gpus= -> accelerator=")


def removed_hook_message(name: str) -> Optional[str]:
    """The TODO text for a Lightning-1 hook, or None for any other function name."""
    if name not in REMOVED_HOOKS:
        return None
    return (f"{REMOVED_HOOKS[name]}; Horovod's Lightning support ended with Lightning 1, so this never "
            f"ran on a native stack. See {UPGRADE_NOTES}")
