"""TorchDistributor(local_mode=False) on a `local[2]` master: the barrier stage runs in the
driver's own JVM, the ranks under its Python workers; same behaviour as on a cluster."""
from __future__ import annotations

import os
import time

import pytest

from distributor import LaunchValidationError, RankFailedError, TorchDistributor, run_function
from distributor.placement import SparkPlacement, SparkPlacementError

from spark_clusters import alive, no_active_jobs, shared_session


# One worker runs the files that share this session one after another (tests/scheduling.py).
pytestmark = pytest.mark.shares("spark local[2]")


@pytest.fixture(scope="module")
def spark(request):
    with shared_session(request) as session:  # local[2], shared with the other local[2] modules
        yield session


def _rank_info(scale):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([scale * (dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return os.environ["RANK"], os.environ["NODE_RANK"], os.getppid(), value.item()


def test_function_returns_rank0_value_from_the_barrier_stage(spark):
    rank, node, parent, total = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_rank_info, 2.0)
    assert (rank, node, total) == ("0", "0", 6.0)
    assert parent != os.getpid()


def _fails_on_rank_0():
    print(f"PID {os.getpid()}", flush=True)
    if os.environ["RANK"] == "0":
        raise KeyError("missing-column")
    import time as t

    t.sleep(120)


def test_rank_failure_raises_rank_failed_error_not_a_py4j_dump(spark, capsys):
    with pytest.raises(RankFailedError) as info:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_fails_on_rank_0)
    assert info.value.rank == 0 and info.value.exc_type == "KeyError"
    assert "missing-column" in info.value.traceback
    pids = [int(line.rsplit(" ", 1)[1]) for line in capsys.readouterr().out.splitlines() if "] PID " in line]
    assert len(pids) == 2
    deadline = time.monotonic() + 60  # (no wait once they are gone)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    assert no_active_jobs(spark)


def test_local_master_slots_are_its_cores(spark):
    with pytest.raises(LaunchValidationError, match=r"master local\[2\]\) has only 2 task slot\(s\): spark.task.cpus=1"):
        TorchDistributor(num_processes=4, local_mode=False, use_gpu=False).run(lambda: 1)


class _UnreachableHub(SparkPlacement):
    def hub_host_for_executors(self, bound_host):
        return "127.0.0.2"  # loopback, but the hub listens on 127.0.0.1 only


def test_unreachable_driver_hub_says_which_setting_to_fix(spark):
    with pytest.raises(SparkPlacementError) as info:
        run_function(lambda: 1, num_processes=2, placement=_UnreachableHub(spark))
    message = str(info.value)
    assert "could not reach the driver hub at 127.0.0.2:" in message
    assert "Set spark.driver.host" in message and "org.apache" not in message


def test_a_placement_object_can_run_jobs_one_after_another(spark):
    placement = SparkPlacement(spark)
    assert run_function(lambda: int(os.environ["RANK"]) + 5, num_processes=2, placement=placement) == 5
    assert run_function(lambda: int(os.environ["WORLD_SIZE"]) * 7, num_processes=2, placement=placement) == 14


def _jobs_submitted(spark):
    return spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()


def test_default_use_gpu_without_spark_gpus_says_to_pass_use_gpu_false(spark):
    before = _jobs_submitted(spark)
    with pytest.raises(LaunchValidationError, match="spark.task.resource.gpu.amount is not set.*use_gpu=False"):
        TorchDistributor(num_processes=2, local_mode=False).run(lambda: 1)  # PySpark's default use_gpu=True
    assert _jobs_submitted(spark) == before, "the missing GPU setting must fail before any Spark job"
