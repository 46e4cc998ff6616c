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
