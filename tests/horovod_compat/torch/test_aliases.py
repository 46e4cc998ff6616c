"""``import horovod`` / ``horovod.torch`` / upstream submodule paths resolve to horovod_compat, in a
plain interpreter (the engine, torchrun and mpirun launches of test_lifecycle.py also import
``horovod.torch``), for the editable install and for a regular (non-editable) install."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CHECK = textwrap.dedent("""
    import horovod, horovod.torch as hvd, horovod_compat.torch as core
    import horovod.torch.mpi_ops as mpi_ops, horovod_compat.torch.mpi_ops as core_mpi_ops
    from horovod.torch.mpi_ops import allreduce_async_, synchronize, Average, Sum, Adasum
    from horovod.torch import DistributedOptimizer, Compression, broadcast_parameters
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    import horovod.common
    assert hvd is core and mpi_ops is core_mpi_ops, (hvd, core)
    assert hvd.__spec__.name == "horovod_compat.torch"
    assert HorovodInternalError is core.HorovodInternalError and issubclass(HorovodInternalError, RuntimeError)
    assert allreduce_async_ is core.allreduce_async_ and Average == 0
    assert horovod.__version__ == "0.28.1"
    hvd.init()
    import torch
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [1.0, 1.0]
    hvd.shutdown()
    print("ALIAS-OK", os.path.dirname(horovod.__file__))
""").replace("import horovod,", "import os, horovod,", 1)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env.update(extra)
    return env


def test_aliases_in_a_plain_interpreter(tmp_path):
    p = subprocess.run([PY, "-c", CHECK], cwd=str(tmp_path), env=_clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ALIAS-OK" in p.stdout


def test_alias_can_be_disabled(tmp_path):
    code = ("import horovod\n"
            "try:\n    import horovod.torch\n    print('IMPORTED')\n"
            "except ImportError:\n    print('NO-ALIAS')\n")
    p = subprocess.run([PY, "-c", code], cwd=str(tmp_path),
                       env=_clean_env(HOROVOD_COMPAT_DISABLE_ALIAS="1"), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "NO-ALIAS" in p.stdout


def test_regular_install(tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([PY, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "--target", str(target), ROOT],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        pytest.fail(p.stderr[-3000:])
    assert (target / "horovod" / "__init__.py").exists()
    p = subprocess.run([PY, "-c", CHECK], cwd=str(tmp_path), env=_clean_env(PYTHONPATH=str(target)),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"ALIAS-OK {target / 'horovod'}" in p.stdout


# Every name of Horovod 0.28.1's ``horovod.torch`` namespace (docs/horovod_torch_api.md).
PUBLIC_NAMES = """
init shutdown is_initialized size rank local_rank local_size cross_rank cross_size
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built start_timeline stop_timeline
Average Sum Adasum Min Max Product
allreduce allreduce_async allreduce_ allreduce_async_
grouped_allreduce grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_
sparse_allreduce_async allgather allgather_async grouped_allgather grouped_allgather_async
broadcast broadcast_async broadcast_ broadcast_async_ alltoall alltoall_async
reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async
join barrier poll synchronize
ProcessSet global_process_set add_process_set remove_process_set
broadcast_parameters broadcast_optimizer_state broadcast_object allgather_object
Compression DistributedOptimizer SyncBatchNorm elastic check_extension
""".split()


def test_every_public_name_exists():
    import horovod.torch as hvd
    missing = [n for n in PUBLIC_NAMES if not hasattr(hvd, n)]
    assert not missing, missing
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert hvd.global_process_set.__class__.__name__.endswith("ProcessSet")
    for n in PUBLIC_NAMES:
        if n not in ("Average", "Sum", "Adasum", "Min", "Max", "Product", "global_process_set",
                     "elastic", "Compression"):
            assert callable(getattr(hvd, n)), n
    assert hasattr(hvd.elastic, "run") and hasattr(hvd.elastic, "TorchState")
    assert hasattr(hvd.Compression, "none") and hasattr(hvd.Compression, "fp16")
    from horovod.common.util import check_extension, split_list
    check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", __file__, "mpi_lib_v2")
    assert split_list([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
