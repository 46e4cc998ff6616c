"""Pure rank planning for the Spark placement: which ranks each barrier task runs, with which GPUs.

Kept free of Spark and sockets so that the mapping — ranks in partition order, local ranks per
host, GPUs from each task's Spark resources — is tested without a cluster or a GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import LaunchValidationError
from ..spec import RankSpec

#: Spark's resource name for GPUs (spark.task.resource.gpu.amount, TaskContext.resources()["gpu"]).
GPU_RESOURCE = "gpu"


@dataclass(frozen=True)
class TaskSlot:
    """What one barrier task told the others through `allGather`: where it runs and what it has."""

    host: str
    port: int  # a port that was free on `host`; task 0's becomes MASTER_PORT
    gpus: Tuple[str, ...] = ()


def ranks_per_task(num_processes: int, use_gpu: bool, task_gpu_amount: Optional[str]) -> int:
    """How many ranks each barrier task starts, from `spark.task.resource.gpu.amount`.

    Without GPUs every task runs one rank. With `use_gpu`, a task that holds k > 1 whole GPUs runs
    k ranks, one per GPU; a task with one GPU or a fraction of one runs one rank. Raises
    `LaunchValidationError` saying what to change when the request cannot be mapped.
    """
    if not use_gpu:
        return 1
    if task_gpu_amount in (None, ""):
        raise LaunchValidationError(
            "use_gpu=True but spark.task.resource.gpu.amount is not set, so Spark gives the tasks "
            "no GPU. Set spark.task.resource.gpu.amount (and spark.executor.resource.gpu.amount "
            "with a discovery script) when creating the SparkSession, or pass use_gpu=False."
        )
    try:
        amount = float(task_gpu_amount)
    except ValueError:
        raise LaunchValidationError(
            f"spark.task.resource.gpu.amount={task_gpu_amount!r} is not a number."
        ) from None
    if amount <= 0:
        raise LaunchValidationError(
            f"use_gpu=True but spark.task.resource.gpu.amount={task_gpu_amount} gives no GPU."
        )
    if amount <= 1:
        return 1  # one GPU, or a share of one, per task: one rank per task
    if not amount.is_integer():
        raise LaunchValidationError(
            f"spark.task.resource.gpu.amount={task_gpu_amount}: amounts above 1 must be whole "
            "GPUs (each rank gets one). Use an integer."
        )
    per_task = int(amount)
    if num_processes % per_task:
        lower = (num_processes // per_task) * per_task
        raise LaunchValidationError(
            f"num_processes={num_processes} is not a multiple of "
            f"spark.task.resource.gpu.amount={per_task}: each Spark task holds {per_task} GPUs "
            f"and runs one rank per GPU. Use num_processes={lower or per_task} or "
            f"{lower + per_task}, or set spark.task.resource.gpu.amount=1."
        )
    return per_task


def task_count(num_processes: int, per_task: int) -> int:
    """Barrier tasks needed for `num_processes` ranks at `per_task` ranks per task."""
    return math.ceil(num_processes / per_task)


def plan_ranks(slots: Sequence[TaskSlot], per_task: int, use_gpu: bool) -> List[List[RankSpec]]:
    """The ranks of every task, indexed by partition id.

    Ranks follow partition order (task p runs ranks p*per_task ... p*per_task+per_task-1). Tasks
    on the same host share a node: LOCAL_RANK counts that host's ranks in rank order,
    LOCAL_WORLD_SIZE is their number, NODE_RANK numbers hosts in order of first appearance.
    With `use_gpu`, the i-th rank of a task gets the task's i-th GPU address.
    """
    world = len(slots) * per_task
    host_index: Dict[str, int] = {}
    host_size: Dict[str, int] = {}
    for slot in slots:
        host_index.setdefault(slot.host, len(host_index))
        host_size[slot.host] = host_size.get(slot.host, 0) + per_task
    next_local: Dict[str, int] = {host: 0 for host in host_index}
    plan: List[List[RankSpec]] = []
    for partition, slot in enumerate(slots):
        if use_gpu and len(slot.gpus) < per_task:
            raise LaunchValidationError(
                f"Spark task {partition} on {slot.host} was given GPUs {list(slot.gpus)} but runs "
                f"{per_task} rank(s), one GPU each. Check spark.task.resource.gpu.amount and the "
                "executors' GPU discovery script."
            )
        specs = []
        for i in range(per_task):
            specs.append(RankSpec(
                rank=partition * per_task + i,
                world_size=world,
                local_rank=next_local[slot.host],
                local_world_size=host_size[slot.host],
                node_rank=host_index[slot.host],
                num_nodes=len(host_index),
                gpu_ids=(slot.gpus[i],) if use_gpu else (),
            ))
            next_local[slot.host] += 1
        plan.append(specs)
    return plan
