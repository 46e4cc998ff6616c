"""``horovodrun --check-build``: what this installation provides, in Horovod's layout.

Frameworks: PyTorch when torch is installed (``horovod.torch``); TensorFlow when tensorflow is
installed and this installation has the ``horovod.tensorflow`` binding (``horovod_compat.tensorflow``;
Keras, ``horovod.tensorflow.keras`` and ``horovod.keras``, comes with it: Horovod's report has no Keras
line either); MXNet never (see `horovod_compat.frameworks`). Both are found with
``importlib.util.find_spec``, without importing the framework (importing tensorflow takes seconds).
Controllers: how ranks can be started — MPI when mpirun is found, Gloo (direct processes with a
torch.distributed rendezvous) when torch has gloo. Tensor operations: what moves tensors —
torch.distributed's gloo, and NCCL when torch has CUDA and NCCL; never MPI, DDL or oneCCL.
"""
from __future__ import annotations

import importlib.util
from typing import List


def _mark(flag: object) -> str:
    return "X" if flag else " "


def _installed(module: str) -> bool:
    """True if `module` can be imported, found without importing it (a dotted name imports only its
    parent packages)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def tensorflow_available() -> bool:
    """Horovod's "[X] TensorFlow": tensorflow is installed and so is our binding of it."""
    return _installed("tensorflow") and _installed("horovod_compat.tensorflow")


def report(verbose: bool = False) -> str:
    """The text `horovodrun --check-build` prints."""
    import horovod

    torch_ok = _installed("torch")
    tensorflow_ok = tensorflow_available()
    gloo = nccl = False
    if torch_ok:
        from horovod_compat.torch import gloo_built, nccl_built

        gloo, nccl = gloo_built(), bool(nccl_built())
    try:
        from distributor.launchers.mpirun import find_mpirun

        mpirun = find_mpirun()
    except Exception:  # noqa: BLE001 - LaunchValidationError when absent
        mpirun = ""
    lines: List[str] = [""] if verbose else []
    lines += [
        f"Horovod v{horovod.__version__} (horovod-compat):",
        "",
        "Available Frameworks:",
        f"    [{_mark(tensorflow_ok)}] TensorFlow",
        f"    [{_mark(torch_ok)}] PyTorch",
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        f"    [{_mark(mpirun)}] MPI",
        f"    [{_mark(gloo)}] Gloo",
        "",
        "Available Tensor Operations:",
        f"    [{_mark(nccl)}] NCCL",
        "    [ ] DDL",
        "    [ ] CCL",
        "    [ ] MPI",
        f"    [{_mark(gloo)}] Gloo",
    ]
    if verbose:
        lines += ["", f"mpirun: {mpirun or 'not found'}",
                  "Tensors move through torch.distributed (gloo; NCCL for CUDA tensors); MPI only "
                  "starts the processes."]
    return "\n".join(lines)
