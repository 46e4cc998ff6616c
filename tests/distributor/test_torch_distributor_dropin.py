"""Drop-in means drop-in: PySpark's TorchDistributor and ours, side by side on one SparkSession.

For every input of the table both are constructed: either both accept (with the same
num_processes / num_tasks), or both raise, ours an instance of PySpark's exception type with
PySpark's key words in its message. Then real runs: keyword arguments reach a function, a script
gets its command-line arguments, a script refuses keyword arguments, a TLS cluster is refused,
and local-mode GPUs are the driver's Spark GPUs.

The Spark GPU settings are runtime confs (`spark.conf.set`), which is where both read them, and
the driver's GPU resources (`SparkContext.resources`) are faked: no GPU is needed.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("torch")

from pyspark import SparkContext  # noqa: E402
from pyspark.ml.torch.distributor import TorchDistributor as PySparkTorchDistributor  # noqa: E402
from pyspark.ml.torch.distributor import _get_gpus_owned  # noqa: E402
from pyspark.resource.information import ResourceInformation  # noqa: E402

from distributor import LaunchValidationError, TorchDistributor  # noqa: E402
from spark_clusters import shared_session  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"
TASK_GPU = "spark.task.resource.gpu.amount"
DRIVER_GPU = "spark.driver.resource.gpu.amount"


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local[2]")


@pytest.fixture(scope="module")
def spark(request):
    with shared_session(request) as session:  # local[2], shared with the other local[2] modules
        yield session


@pytest.fixture
def spark_conf(spark):
    """`spark_conf({key: value})` sets runtime confs for one test; they are unset afterwards."""
    keys = []

    def set_conf(values):
        for key, value in values.items():
            spark.conf.set(key, value)
            keys.append(key)

    yield set_conf
    for key in keys:
        spark.conf.unset(key)


@pytest.fixture
def driver_gpus(monkeypatch):
    """`driver_gpus([...])`: the driver's Spark resources hold these GPU addresses."""
    def fake(addresses):
        resources = {"gpu": ResourceInformation("gpu", list(addresses))}
        monkeypatch.setattr(SparkContext, "resources", property(lambda self: resources))
    return fake


# (id, constructor kwargs, runtime confs, driver GPU addresses or None,
#  PySpark's outcome: None (accepts) or its exception type, key words both messages contain)
CASES = [
    ("num_processes=0", dict(num_processes=0, use_gpu=False), {}, None,
     ValueError, "has to be a positive integer"),
    ("num_processes=-1", dict(num_processes=-1, use_gpu=False), {}, None,
     ValueError, "has to be a positive integer"),
    ("num_processes='2'", dict(num_processes="2", use_gpu=False), {}, None, TypeError, None),
    ("num_processes=None", dict(num_processes=None, use_gpu=False), {}, None, TypeError, None),
    ("cpu local", dict(num_processes=2, local_mode=True, use_gpu=False), {}, None, None, None),
    ("cpu cluster", dict(num_processes=2, local_mode=False, use_gpu=False), {}, None, None, None),
    ("use_gpu=0 local_mode=1", dict(num_processes=2, local_mode=1, use_gpu=0), {}, None,
     None, None),
    ("defaults: use_gpu local, no GPU conf", dict(num_processes=2), {}, None,
     RuntimeError, "GPUs were unable to be found on the driver"),
    ("use_gpu cluster, no GPU conf", dict(num_processes=2, local_mode=False), {}, None,
     RuntimeError, "'spark.task.resource.gpu.amount' was unset, so gpu usage is unavailable"),
    ("use_gpu cluster, no GPU conf, num_processes=0", dict(num_processes=0, local_mode=False), {},
     None, RuntimeError, "was unset"),
    ("use_gpu cluster, task amount 1", dict(num_processes=2, local_mode=False), {TASK_GPU: "1"},
     None, None, None),
    ("use_gpu local, task amount 1, no driver GPU", dict(num_processes=2, local_mode=True),
     {TASK_GPU: "1"}, None, RuntimeError, "GPUs were unable to be found on the driver"),
    ("use_gpu cluster, task amount 2, num_processes=3", dict(num_processes=3, local_mode=False),
     {TASK_GPU: "2"}, None, RuntimeError,
     "must be a multiple of 'spark.task.resource.gpu.amount'"),
    ("use_gpu cluster, task amount 2, num_processes=-1", dict(num_processes=-1, local_mode=False),
     {TASK_GPU: "2"}, None, RuntimeError, "must be a multiple of"),
    ("use_gpu cluster, task amount 2, num_processes=0", dict(num_processes=0, local_mode=False),
     {TASK_GPU: "2"}, None, ValueError, "has to be a positive integer"),
    ("use_gpu cluster, task amount 2, num_processes=4", dict(num_processes=4, local_mode=False),
     {TASK_GPU: "2"}, None, None, None),
    ("use_gpu cluster, task amount 1.5", dict(num_processes=2, local_mode=False),
     {TASK_GPU: "1.5"}, None, ValueError, None),
    ("use_gpu cluster, task amount 'x'", dict(num_processes=2, local_mode=False),
     {TASK_GPU: "x"}, None, ValueError, None),
    ("use_gpu local, 2 driver GPUs, num_processes=2", dict(num_processes=2),
     {DRIVER_GPU: "2"}, ["0", "1"], None, None),
    ("use_gpu local, 2 driver GPUs, num_processes=4 (lowered to 2)", dict(num_processes=4),
     {DRIVER_GPU: "2"}, ["0", "1"], None, None),
    ("use_gpu local, driver GPUs found but amount unset", dict(num_processes=2), {},
     ["0", "1"], RuntimeError, "GPU resources were not configured properly on the driver"),
    ("use_gpu local, 2 driver GPUs, num_processes=0", dict(num_processes=0),
     {DRIVER_GPU: "2"}, ["0", "1"], ValueError, "has to be a positive integer"),
]


def _construct(cls, kwargs):
    try:
        return cls(**kwargs), None
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return None, exc


@pytest.mark.parametrize("kwargs, confs, gpus, expected, words", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_constructor_matches_pyspark(spark, spark_conf, driver_gpus, kwargs, confs, gpus,
                                     expected, words):
    spark_conf(confs)
    if gpus is not None:
        driver_gpus(gpus)
    theirs, their_error = _construct(PySparkTorchDistributor, kwargs)
    ours, our_error = _construct(TorchDistributor, kwargs)
    if expected is None:
        assert their_error is None, f"PySpark now refuses: {their_error!r}"
        assert our_error is None, f"PySpark accepts, ours raised {our_error!r}"
        for name in ("num_processes", "num_tasks", "local_mode", "use_gpu"):
            assert getattr(ours, name) == getattr(theirs, name), name
        return
    assert type(their_error) is expected, f"PySpark: {their_error!r}"  # the table is up to date
    assert isinstance(our_error, expected), f"PySpark raised {their_error!r}, ours {our_error!r}"
    assert isinstance(our_error, LaunchValidationError)  # and ours says what to change
    if words:
        assert words in str(their_error)
        assert words in str(our_error), f"{words!r} not in {our_error}"


# Deliberate differences: ours refuses at construction what PySpark accepts there but cannot run
# (or takes as a truth value), and runs a fraction of a GPU per task, which PySpark cannot parse.
DIFFERENCES = [
    ("num_processes=2.5", dict(num_processes=2.5, use_gpu=False), {}, TypeError),
    ("num_processes=True", dict(num_processes=True, use_gpu=False), {}, TypeError),
    ("use_gpu=None", dict(num_processes=2, use_gpu=None), {}, TypeError),
    ("local_mode='yes'", dict(num_processes=2, local_mode="yes", use_gpu=False), {}, TypeError),
    ("task amount 0.5", dict(num_processes=2, local_mode=False), {TASK_GPU: "0.5"}, None),
]


@pytest.mark.parametrize("kwargs, confs, ours_raises", [c[1:] for c in DIFFERENCES],
                         ids=[c[0] for c in DIFFERENCES])
def test_documented_differences(spark, spark_conf, kwargs, confs, ours_raises):
    spark_conf(confs)
    theirs, their_error = _construct(PySparkTorchDistributor, kwargs)
    ours, our_error = _construct(TorchDistributor, kwargs)
    if ours_raises is None:  # PySpark refuses, ours accepts
        assert isinstance(their_error, ValueError) and our_error is None, (their_error, our_error)
        assert ours.num_tasks == 2
    else:  # PySpark accepts, ours refuses
        assert their_error is None and isinstance(our_error, ours_raises), (their_error, our_error)
        assert isinstance(our_error, LaunchValidationError)


def test_num_processes_above_the_driver_gpus_is_lowered_with_a_warning(spark, spark_conf,
                                                                        driver_gpus, caplog):
    spark_conf({DRIVER_GPU: "2"})
    driver_gpus(["0", "1"])
    with caplog.at_level(logging.WARNING, logger="distributor.torch_distributor"):
        assert TorchDistributor(num_processes=4).num_processes == 2
    assert "'num_processes' was reset to be equal to the number of available GPUs" in caplog.text


def test_local_gpus_are_the_drivers_spark_gpus(spark, spark_conf, driver_gpus, monkeypatch):
    """use_gpu=True in local mode: the ranks get Spark's driver GPUs (mapped through the
    driver's CUDA_VISIBLE_DEVICES, as PySpark does), not whatever the host shows."""
    spark_conf({DRIVER_GPU: "2"})
    driver_gpus(["0", "1"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert _get_gpus_owned(spark) == ["3", "5"]
    seen = TorchDistributor(num_processes=4).run(
        lambda: (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["WORLD_SIZE"]))
    assert seen == ("3,5", "2")


def test_script_refuses_keyword_arguments_like_pyspark(spark):
    script = str(SCRIPTS / "torchrun_style.py")
    for cls in (PySparkTorchDistributor, TorchDistributor):
        with pytest.raises(ValueError, match="does not support key-word type arguments"):
            cls(num_processes=2, local_mode=True, use_gpu=False).run(script, scale=1.5)


def test_tls_cluster_is_refused_at_run_like_pyspark(spark, spark_conf, caplog):
    spark_conf({"spark.ssl.enabled": "true"})
    for cls in (PySparkTorchDistributor, TorchDistributor):
        distributor = cls(num_processes=2, local_mode=False, use_gpu=False)  # accepted
        with pytest.raises(RuntimeError, match="This cluster has TLS encryption enabled"):
            distributor.run(lambda: 1)
    spark_conf({"pytorch.spark.distributor.ignoreSsl": "true"})
    with caplog.at_level(logging.WARNING, logger="distributor.torch_distributor"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)._check_encryption()
    assert "pytorch.spark.distributor.ignoreSsl" in caplog.text


def test_function_gets_keyword_arguments_like_pyspark(spark):
    def _train(a, scale=1.0, *, offset=0):  # local: PySpark's ranks cannot import this module
        import os

        return os.environ["RANK"], a * scale + offset

    kwargs = dict(num_processes=2, local_mode=True, use_gpu=False)
    theirs = PySparkTorchDistributor(**kwargs).run(_train, 3, scale=2.0, offset=1)
    ours = TorchDistributor(**kwargs).run(_train, 3, scale=2.0, offset=1)
    assert ours == ("0", 7.0)  # rank 0's value
    assert theirs[1] == ours[1]  # PySpark returns the last rank to finish


def test_script_gets_its_arguments_like_pyspark(spark, tmp_path):
    script = str(SCRIPTS / "torchrun_style.py")
    for name, cls in (("theirs", PySparkTorchDistributor), ("ours", TorchDistributor)):
        distributor = cls(num_processes=2, local_mode=True, use_gpu=False)
        assert distributor.run(script, "--scale", 1.5, "--out", str(tmp_path / name)) is None
    for rank in (0, 1):
        ours = (tmp_path / f"ours.{rank}").read_text()
        assert ours == (tmp_path / f"theirs.{rank}").read_text()
        assert ours == f"4.5 {rank} __main__"
