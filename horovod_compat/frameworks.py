"""Which of Horovod's framework modules this project provides, and the answer for the others.

`import horovod.mxnet` raises `ModuleNotFoundError` with a message that says what
horovod-compat covers and where their users go, instead of a bare "No module named ...". `horovodrun --check-build` reports the same facts.
"""
from __future__ import annotations

from typing import Dict

#: What this project gives Horovod users, in one phrase.
PROVIDES = ("horovod.torch, horovod.tensorflow and horovod.keras (on one runtime), the launchers "
            "(horovodrun, horovod.run, HorovodRunner, horovod.ray's RayExecutor) and the Spark APIs "
            "(horovod.spark.run)")

#: Horovod modules this project does not provide → the advice for their users.
UNSUPPORTED: Dict[str, str] = {
    "horovod.mxnet": ("MXNet is retired (Apache attic, 2023); move the model to PyTorch and use "
                      "horovod.torch or torch.distributed."),
}


def unsupported_message(fullname: str) -> str:
    """The ModuleNotFoundError text for `fullname` (a module under an unsupported prefix)."""
    top = next(prefix for prefix in UNSUPPORTED
               if fullname == prefix or fullname.startswith(prefix + "."))
    return (f"No module named {fullname!r}: horovod-compat provides {PROVIDES}, not {top}. "
            f"{UNSUPPORTED[top]}")


def unsupported_prefix(fullname: str) -> bool:
    """True if `fullname` is (under) a Horovod module this project does not provide."""
    return any(fullname == p or fullname.startswith(p + ".") for p in UNSUPPORTED)
