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

#: Prefix of the errors a barrier task raises about its executor's environment; the driver finds
#: it in Spark's error text and shows that sentence alone instead of a Java stack dump.
TASK_ERROR_MARKER = "[distributor-spark]"

#: Exit status reported for a rank whose process could not be started at all (in its task, or
#: because its task is gone).
NOT_STARTED = 127

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


#: How ranks are grouped into torchrun "nodes" (LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK).
NODE_PER_TASK = "task"
NODE_PER_HOST = "host"


def plan_ranks(
    slots: Sequence[TaskSlot], per_task: int, use_gpu: bool, node_per: str = NODE_PER_TASK
) -> List[List[RankSpec]]:
    """The ranks of every task, indexed by partition id.

    Ranks are numbered node by node, a node's ranks in partition order.

    `node_per="task"` (the default, as PySpark's TorchDistributor does: one torchrun node per
    task): each task is a node, so task p runs ranks p*per_task ... p*per_task+per_task-1;
    NODE_RANK is its partition id, LOCAL_RANK counts the task's own ranks, and
    CUDA_VISIBLE_DEVICES holds the task's GPUs, so `cuda:LOCAL_RANK` is this rank's GPU and
    Lightning's `devices=ranks_per_task, num_nodes=tasks` matches even when several executors
    share a machine.

    `node_per="host"`: tasks on the same host form one node, numbered by first appearance
    (NODE_RANK); a host's ranks are consecutive, as Horovod numbers them and as mpirun over the
    nodes in that order places them (`MpirunLauncher.task_hosts`); LOCAL_RANK counts them, and
    every rank of a host sees the GPUs of all the host's tasks in local-rank order, so
    `cuda:LOCAL_RANK` is still its own GPU.
    """
    if node_per not in (NODE_PER_TASK, NODE_PER_HOST):
        raise ValueError(f"node_per must be {NODE_PER_TASK!r} or {NODE_PER_HOST!r}, got {node_per!r}")
    world = len(slots) * per_task
    for partition, slot in enumerate(slots):
        if use_gpu and len(slot.gpus) < per_task:
            raise LaunchValidationError(
                f"Spark task {partition} on {slot.host} was given GPUs {list(slot.gpus)} but runs "
                f"{per_task} rank(s), one GPU each. Check spark.task.resource.gpu.amount and the "
                "executors' GPU discovery script."
            )
    keys = [str(p) if node_per == NODE_PER_TASK else slot.host for p, slot in enumerate(slots)]
    node_index: Dict[str, int] = {}
    node_gpus: Dict[str, List[str]] = {}
    for key, slot in zip(keys, slots):
        node_index.setdefault(key, len(node_index))
        node_gpus.setdefault(key, []).extend(slot.gpus[:per_task] if use_gpu else ("",) * per_task)
    next_local: Dict[str, int] = {key: 0 for key in node_index}
    first_rank: Dict[str, int] = {}
    for key in node_index:  # in node order
        first_rank[key] = sum(len(node_gpus[k]) for k in first_rank)
    plan: List[List[RankSpec]] = []
    for key in keys:
        specs = []
        for _ in range(per_task):
            specs.append(RankSpec(
                rank=first_rank[key] + next_local[key],
                world_size=world,
                local_rank=next_local[key],
                local_world_size=len(node_gpus[key]),
                node_rank=node_index[key],
                num_nodes=len(node_index),
                gpu_ids=tuple(node_gpus[key]) if use_gpu else (),
            ))
            next_local[key] += 1
        plan.append(specs)
    return plan
