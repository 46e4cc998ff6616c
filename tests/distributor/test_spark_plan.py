"""The Spark placement's pure parts: rank and GPU mapping, error wording; no cluster needed."""
from __future__ import annotations

import sys

import pytest

from distributor import LaunchValidationError, TorchDistributor
from distributor.placement import spark as spark_placement
from distributor.placement.spark import (
    TASK_ERROR_MARKER,
    SparkPlacementError,
    _barrier_task,
    active_spark_context,
    executor_losses,
    explain_spark_failure,
)
from distributor.placement.spark_plan import TaskSlot, plan_ranks, ranks_per_task, task_count


def _table(plan):
    return [
        [(s.rank, s.local_rank, s.local_world_size, s.node_rank, s.num_nodes, s.world_size, tuple(s.gpu_ids))
         for s in specs]
        for specs in plan
    ]


# ---- ranks per task from spark.task.resource.gpu.amount ------------------------------------
@pytest.mark.parametrize(
    "num, use_gpu, amount, expected",
    [
        (4, False, None, 1),
        (4, False, "2", 1),  # GPUs configured but not asked for: one rank per task
        (3, True, "1", 1),
        (3, True, "0.5", 1),  # a share of a GPU: one rank per task
        (4, True, "2", 2),
        (8, True, "4.0", 4),
    ],
)
def test_ranks_per_task(num, use_gpu, amount, expected):
    assert ranks_per_task(num, use_gpu, amount) == expected


def test_num_processes_must_be_a_multiple_of_the_task_gpu_amount():
    with pytest.raises(LaunchValidationError) as info:
        ranks_per_task(5, True, "2")
    message = str(info.value)
    assert "num_processes=5 is not a multiple of spark.task.resource.gpu.amount=2" in message
    assert "num_processes=4 or 6" in message


@pytest.mark.parametrize(
    "amount, match",
    [
        (None, "spark.task.resource.gpu.amount is not set"),
        ("", "spark.task.resource.gpu.amount is not set"),
        ("x", "is not a number"),
        ("0", "gives no GPU"),
        ("1.5", "must be whole GPUs"),
    ],
)
def test_gpu_amount_errors_say_what_to_set(amount, match):
    with pytest.raises(LaunchValidationError, match=match):
        ranks_per_task(2, True, amount)


def test_task_count():
    assert task_count(4, 1) == 4 and task_count(4, 2) == 2 and task_count(8, 4) == 2


# ---- rank plans ---------------------------------------------------------------------------
def test_one_rank_per_task_each_task_is_a_node_in_partition_order():
    slots = [TaskSlot("b", 1), TaskSlot("a", 2), TaskSlot("b", 3)]
    assert _table(plan_ranks(slots, 1, use_gpu=False)) == [
        [(0, 0, 1, 0, 3, 3, ())],
        [(1, 0, 1, 1, 3, 3, ())],
        [(2, 0, 1, 2, 3, 3, ())],
    ]


def test_node_per_host_numbers_a_hosts_ranks_consecutively_as_mpirun_places_them():
    """Host b's tasks (partitions 0 and 2) get ranks 0 and 1, host a's rank 2: the order in
    which one mpirun over the nodes (`MpirunLauncher.task_hosts`, --map-by slot) numbers them, so
    the rank a process reports is the rank its task was planned to host."""
    from distributor.launchers.mpirun import MpirunLauncher
    from distributor.launchers.remote_shell import task_index

    slots = [TaskSlot("b", 1), TaskSlot("a", 2), TaskSlot("b", 3)]
    plan = plan_ranks(slots, 1, use_gpu=False, node_per="host")
    assert _table(plan) == [
        [(0, 0, 2, 0, 2, 3, ())],  # host b: node 0, ranks 0 and 1
        [(2, 0, 1, 1, 2, 3, ())],  # host a: node 1, rank 2
        [(1, 1, 2, 0, 2, 3, ())],
    ]
    mpi_rank, placed = 0, {}
    for host_task, count in MpirunLauncher.task_hosts(plan):
        for _ in range(count):
            placed[mpi_rank] = slots[task_index(host_task)].host
            mpi_rank += 1
    assert placed == {spec.rank: slots[p].host for p, specs in enumerate(plan) for spec in specs}


def test_multi_gpu_tasks_run_one_rank_per_gpu_and_see_their_task_gpus():
    slots = [TaskSlot("h1", 1, ("0", "1")), TaskSlot("h2", 2, ("2", "3"))]
    assert _table(plan_ranks(slots, 2, use_gpu=True)) == [
        [(0, 0, 2, 0, 2, 4, ("0", "1")), (1, 1, 2, 0, 2, 4, ("0", "1"))],
        [(2, 0, 2, 1, 2, 4, ("2", "3")), (3, 1, 2, 1, 2, 4, ("2", "3"))],
    ]


def test_node_per_host_gpus_are_indexed_by_local_rank():
    # Two single-GPU tasks on one host: each rank sees both GPUs, cuda:LOCAL_RANK is its own.
    slots = [TaskSlot("h", 1, ("5",)), TaskSlot("h", 2, ("3",))]
    plan = plan_ranks(slots, 1, use_gpu=True, node_per="host")
    for specs in plan:
        for spec in specs:
            assert spec.gpu_ids == ("5", "3")
    assert [specs[0].gpu_ids[specs[0].local_rank] for specs in plan] == ["5", "3"]


def test_single_gpu_tasks_each_rank_gets_its_task_gpu():
    slots = [TaskSlot("h", 1, ("5",)), TaskSlot("h", 2, ("3",))]
    plan = plan_ranks(slots, 1, use_gpu=True)
    assert [specs[0].gpu_ids for specs in plan] == [("5",), ("3",)]
    assert all(specs[0].local_rank == 0 for specs in plan)


def test_task_with_too_few_gpus_is_reported():
    with pytest.raises(LaunchValidationError, match=r"task 1 on h2 was given GPUs \['2'\] but runs 2"):
        plan_ranks([TaskSlot("h1", 1, ("0", "1")), TaskSlot("h2", 2, ("2",))], 2, use_gpu=True)


# ---- error wording ------------------------------------------------------------------------
_PY4J_TEXT = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed barrier ResultStage.
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "worker.py", line 1, in process
RuntimeError: {marker} The executors' Python (/usr/bin/python3) has no 'torch' module. Install it.
\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)
"""


def test_marked_task_errors_come_back_alone():
    error = explain_spark_failure(RuntimeError(_PY4J_TEXT.format(marker=TASK_ERROR_MARKER)))
    assert isinstance(error, SparkPlacementError)
    assert str(error) == "The executors' Python (/usr/bin/python3) has no 'torch' module. Install it."
    assert "collectAndServe" in error.spark_message


def test_other_task_errors_name_the_python_exception():
    text = _PY4J_TEXT.replace("RuntimeError: {marker} The", "OSError: [Errno 28] no space. The")
    error = explain_spark_failure(RuntimeError(text), group="distributor-abc")
    assert str(error).startswith("The Spark barrier job running the ranks failed (Spark job group distributor-abc)")
    assert "a barrier task raised OSError: [Errno 28] no space" in str(error)
    assert "\tat org.apache" not in str(error)


def test_the_tasks_spark_lost_with_their_executor_are_read_from_its_error():
    """Spark 4's words (a barrier stage's abort, as a SIGKILLed executor JVM gave them, and a task
    set's "Lost task" line); any other failure of a task loses none."""
    barrier = (": org.apache.spark.SparkException: Job aborted due to stage failure: Could not "
               "recover from a failed barrier ResultStage. Most recent failure reason: Stage failed "
               "because barrier task ResultTask(0, 1) finished unsuccessfully.\nExecutorLostFailure "
               "(executor 1 exited caused by one of the running tasks) Reason: Command exited with "
               "code 137\n\tat org.apache.spark.scheduler.DAGScheduler.abortStage(DAGScheduler.scala:1)")
    assert executor_losses(barrier) == {1: "ExecutorLostFailure (executor 1 exited caused by one of "
                                           "the running tasks) Reason: Command exited with code 137"}
    task_set = ("Job aborted due to stage failure: Task 2 in stage 3.0 failed 1 times, most recent "
                "failure: Lost task 2.0 in stage 3.0 (TID 9) (10.0.0.7 executor 4): ExecutorLostFailure "
                "(executor 4 exited unrelated to the running tasks) Reason: worker lost\n")
    assert list(executor_losses(task_set)) == [2]
    assert executor_losses(_PY4J_TEXT.format(marker=TASK_ERROR_MARKER)) == {}
    assert executor_losses(barrier.replace("ExecutorLostFailure", "TaskKilled")) == {}


def _call_task(config, monkeypatch, blocked_module):
    monkeypatch.setitem(sys.modules, blocked_module, None)  # makes `import` of it fail
    task = _barrier_task(config)
    with pytest.raises(RuntimeError) as info:
        list(task(iter([])))
    return str(info.value)


def test_task_without_this_project_says_so(monkeypatch):
    message = _call_task({"required_modules": ["torch"]}, monkeypatch, "distributor.placement.spark_task")
    assert message.startswith(TASK_ERROR_MARKER)
    assert f"The executors' Python ({sys.executable}) cannot import this project's 'distributor' package" in message
    assert "PYSPARK_PYTHON" in message


def test_task_without_torch_says_so(monkeypatch):
    message = _call_task({"required_modules": ["torch", "no_such_module_xyz"]}, monkeypatch, "unrelated_xyz")
    assert "has no 'no_such_module_xyz' module" in message and "'torch'" not in message


_UNPICKLE_WITHOUT_PROJECT = r"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "distributor" or name.startswith("distributor."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
import cloudpickle
task = cloudpickle.loads(sys.stdin.buffer.read())
try:
    list(task(iter([])))
except RuntimeError as exc:
    print(exc)
"""


def test_barrier_task_unpickles_and_reports_on_an_executor_without_this_project():
    """The task is pickled by value: an executor without this project can still run it, and it
    says what is missing instead of failing to unpickle."""
    import subprocess

    import cloudpickle

    blob = cloudpickle.dumps(_barrier_task({"required_modules": ["torch"]}))
    done = subprocess.run([sys.executable, "-c", _UNPICKLE_WITHOUT_PROJECT], input=blob,
                          capture_output=True, timeout=60)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert out.startswith(TASK_ERROR_MARKER) and "cannot import this project's 'distributor'" in out


def test_no_active_session_is_explained(monkeypatch):
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(LaunchValidationError, match="needs an active SparkSession"):
        active_spark_context()
    with pytest.raises(LaunchValidationError, match="use local_mode=True"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(lambda: 1)


def test_spark_connect_session_is_explained():
    class FakeConnectSession:
        pass

    FakeConnectSession.__module__ = "pyspark.sql.connect.session"
    with pytest.raises(LaunchValidationError, match="Spark Connect session, which cannot run RDD barrier"):
        active_spark_context(FakeConnectSession())


def test_unknown_node_grouping_is_rejected():
    with pytest.raises(LaunchValidationError, match="node_per must be"):
        spark_placement.SparkPlacement(spark=object(), node_per="rack")


# ---- checks before submitting, against a stand-in SparkContext ------------------------------
class _FakeSparkContext:
    """Just what SparkPlacement reads: master, conf, start time, slot and executor counts."""

    def __init__(self, master, conf=None, slots=2, executors=2):
        from types import SimpleNamespace as NS

        self.master = master
        self._conf = dict(conf or {})
        self.startTime = 0  # long ago: executors have had time to register
        scala = NS(
            resourceProfileManager=lambda: NS(defaultResourceProfile=lambda: "default"),
            maxNumConcurrentTasks=lambda profile: slots,
            statusTracker=lambda: NS(getExecutorInfos=lambda: [None] * (executors + 1)),
        )
        self._jsc = NS(sc=lambda: scala)

    def getConf(self):
        return self._conf


def _validate(sc, num_processes, use_gpu=False):
    from distributor import FunctionTarget, LaunchRequest

    placement = spark_placement.SparkPlacement(sc)
    placement.validate(LaunchRequest(FunctionTarget(len), num_processes, use_gpu=use_gpu))
    return placement


def test_dynamic_allocation_is_explained():
    sc = _FakeSparkContext("spark://h:7077", {"spark.dynamicAllocation.enabled": "true"})
    with pytest.raises(LaunchValidationError, match="dynamic allocation.*spark.dynamicAllocation.enabled=false"):
        _validate(sc, 2)
    # Spark ignores the setting on a local master, and so do we
    _validate(_FakeSparkContext("local[2]", {"spark.dynamicAllocation.enabled": "true"}), 2)


def test_slot_shortage_with_multi_gpu_tasks_counts_tasks_not_ranks():
    conf = {"spark.task.resource.gpu.amount": "2", "spark.task.cpus": "4"}
    placement = _validate(_FakeSparkContext("spark://h:7077", conf, slots=2, executors=2), 4, use_gpu=True)
    assert placement._tasks == 2 and placement._per_task == 2
    with pytest.raises(LaunchValidationError) as info:
        _validate(_FakeSparkContext("spark://h:7077", conf, slots=2, executors=2), 6, use_gpu=True)
    message = str(info.value)
    assert "num_processes=6 needs 3 Spark barrier tasks running at the same time (2 ranks per task)" in message
    assert ("only 2 task slot(s): 2 executor(s) registered, spark.task.cpus=4, "
            "spark.task.resource.gpu.amount=2") in message
    assert "Lower num_processes to at most 4" in message


def test_hub_listens_on_the_driver_bind_address():
    assert spark_placement.SparkPlacement(_FakeSparkContext("local[1]")).hub_bind_host == "127.0.0.1"
    sc = _FakeSparkContext("local[1]", {"spark.driver.host": "10.0.0.5"})
    assert spark_placement.SparkPlacement(sc).hub_bind_host == "10.0.0.5"
    sc = _FakeSparkContext("local[1]", {"spark.driver.host": "10.0.0.5", "spark.driver.bindAddress": "0.0.0.0"})
    assert spark_placement.SparkPlacement(sc).hub_bind_host == "0.0.0.0"
