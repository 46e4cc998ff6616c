"""distributor.extras: a feature whose optional part of the installation is missing names the pip
line that brings it, before anything starts. Each case runs in a fresh interpreter where the
extra's modules cannot be imported (a meta-path finder refuses them), as on a core-only install."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from distributor.extras import EXTRAS, MissingExtraError, missing, require

BLOCKER = textwrap.dedent("""\
    import importlib.abc, sys
    BLOCKED = set({blocked!r})
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, Block())
    import importlib.util
    _find_spec = importlib.util.find_spec
    def find_spec(name, package=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return _find_spec(name, package)
    importlib.util.find_spec = find_spec
    """)


def _run_without(blocked, code):
    program = BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)


def test_require_names_the_first_missing_module_and_the_pip_line():
    require("spark", "anything")  # installed in the test environment: no error
    assert missing("spark") == ()
    with pytest.raises(MissingExtraError) as info:
        require("plot", "the timeline plot", modules=("no_such_module_for_the_test",))
    assert str(info.value) == ("the timeline plot needs no_such_module_for_the_test, which is not "
                               "installed: pip install 'horovod-compat[plot]'")
    assert isinstance(info.value, ImportError) and info.value.extra == "plot"
    with pytest.raises(KeyError, match="unknown extra 'sparkk'; known: spark, mpi"):
        require("sparkk", "x")
    assert set(EXTRAS) == {"spark", "mpi", "plot", "lightning", "tensorflow", "ray"}


@pytest.mark.parametrize("blocked, code, message", [
    ({"tensorflow"}, "import horovod.tensorflow",
     "horovod.tensorflow (and horovod.keras) needs tensorflow, which is not installed: "
     "pip install 'horovod-compat[tensorflow]'"),
    ({"pyspark"}, "import horovod.spark.torch as h; h.TorchEstimator",
     "The Spark estimators (horovod.spark.torch, .keras, .lightning) needs pyspark, which is not "
     "installed: pip install 'horovod-compat[spark]'"),
    ({"pyarrow"}, "import horovod.spark.keras as h; h.KerasEstimator",
     "needs pyarrow, which is not installed: pip install 'horovod-compat[spark]'"),
])
def test_an_import_that_needs_a_missing_extra_names_it(blocked, code, message):
    done = _run_without(blocked, code)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("distributor.extras.MissingExtraError: ") and last.endswith(message), \
        done.stderr[-2000:]


def test_torch_only_users_need_no_extra():
    """The core install: horovod.torch, its runtime and horovodrun's planning import nothing of
    Spark, MPI, matplotlib, Lightning or TensorFlow."""
    done = _run_without({"pyspark", "pyarrow", "pandas", "fsspec", "mpi4py", "matplotlib",
                         "lightning", "tensorflow"}, """
        import horovod.torch as hvd
        import horovod_compat.run, horovod_compat.timeline, horovod_compat.migrate
        hvd.init()
        print("CORE OK", hvd.size())
        """)
    assert done.returncode == 0 and "CORE OK 1" in done.stdout, done.stderr[-3000:]


def test_a_missing_mpirun_names_the_mpi_extra(tmp_path, monkeypatch):
    from distributor.errors import LaunchValidationError
    from distributor.launchers import mpirun

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(mpirun.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(LaunchValidationError, match=r"pip install 'horovod-compat\[mpi\]'"):
        mpirun.find_mpirun()
