"""``horovodrun --check-build``: what this installation provides, in Horovod's layout.

Frameworks: PyTorch when torch imports (``horovod.torch``); TensorFlow and MXNet never (see
`horovod_compat.frameworks`). Controllers: how ranks can be started — MPI when mpirun is found,
Gloo (direct processes with a torch.distributed rendezvous) when torch has gloo. Tensor
operations: what moves tensors — torch.distributed's gloo, and NCCL when torch has CUDA and NCCL;
never MPI, DDL or oneCCL.
"""
from __future__ import annotations

import importlib.util
from typing import List


def _mark(flag: object) -> str:
    return "X" if flag else " "


def report(verbose: bool = False) -> str:
    """The text `horovodrun --check-build` prints."""
    import horovod

    torch_ok = importlib.util.find_spec("torch") is not None
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
        "    [ ] TensorFlow",
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
