"""Horovod's coordination-by-name guarantees, one short check each: run on 2 ranks by any launcher.

Prints ``CHECK <name> ok`` or ``CHECK <name> FAIL <what happened>`` per check on every rank. The
checks are ordered from harmless to destructive: a failure that leaves the ranks out of step
(checks 3 and 4) ends the program, so the later checks are not reported. A check that makes no
progress for 60 s dumps every thread's stack and exits 3.

1. ``synchronize(alltoall_async(t))`` returns ``(output, received_splits)``, also without splits
   (Horovod's ``alltoall`` unpacks exactly that).
2. Once an async op has completed (``poll`` true), its name may be used again before its handle is
   synchronized: Horovod refuses a name only while it is in its tensor queue.
3. Named async ops submitted in a different order on each rank are paired by name.
4. An async op submitted before a barrier on rank 0 and after it on rank 1 (upstream's
   duplicate-name tests do this) completes, and the barrier is not confused with it.
"""
from __future__ import annotations

import faulthandler
import sys
import time

import torch

import horovod.torch as hvd


def report(name: str, problem) -> None:
    print(f"CHECK {name} {'ok' if problem is None else 'FAIL ' + problem}", flush=True)


def wait_done(handle, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def main() -> int:
    faulthandler.dump_traceback_later(60, exit=True)
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    ones = torch.ones(2 * size, 2)

    result = hvd.synchronize(hvd.alltoall_async(ones, name="c1"))
    ok = isinstance(result, tuple) and len(result) == 2 and result[1].tolist() == [2] * size
    report("alltoall_async_returns_output_and_splits",
           None if ok else f"synchronize returned {type(result).__name__}")

    faulthandler.dump_traceback_later(60, exit=True)
    first = hvd.allreduce_async(torch.full((3,), float(rank)), name="c2", op=hvd.Sum)
    problem = None
    if not wait_done(first):
        problem = "the first op never completed"
    else:
        hvd.barrier()  # every rank has seen its op complete
        try:
            second = hvd.allreduce_async(torch.ones(3), name="c2", op=hvd.Sum)
            got = hvd.synchronize(second).tolist()
            if got != [float(size)] * 3:
                problem = f"the second op gave {got}"
        except ValueError as exc:
            problem = f"ValueError: {exc}"
    expected_first = [float(sum(range(size)))] * 3
    if hvd.synchronize(first).tolist() != expected_first:
        problem = (problem or "") + " and the first op's result is wrong"
    report("completed_name_reusable_before_synchronize", problem)

    faulthandler.dump_traceback_later(60, exit=True)
    names = [f"c3.{i}" for i in range(4)]
    order = names if rank % 2 == 0 else names[::-1]
    try:
        handles = {n: hvd.allreduce_async(torch.full((i + 1,), float(rank + 1)), name=n, op=hvd.Sum)
                   for i, n in ((names.index(n), n) for n in order)}
        got = {n: hvd.synchronize(h).tolist() for n, h in handles.items()}
        want = {n: [float(size * (size + 1) // 2)] * (i + 1) for i, n in enumerate(names)}
        report("different_submission_orders_paired_by_name", None if got == want else f"got {got}")
    except Exception as exc:  # noqa: BLE001 - reported, then the ranks are out of step
        report("different_submission_orders_paired_by_name", f"{type(exc).__name__}: {exc}")
        return 1

    faulthandler.dump_traceback_later(60, exit=True)
    try:
        t = torch.full((4,), float(rank + 1))
        handle = hvd.allreduce_async(t, name="c4", op=hvd.Sum) if rank == 0 else None
        hvd.barrier()
        if handle is None:
            handle = hvd.allreduce_async(t, name="c4", op=hvd.Sum)
        got = hvd.synchronize(handle).tolist()
        want = [float(size * (size + 1) // 2)] * 4
        report("async_op_on_either_side_of_a_barrier", None if got == want else f"got {got}")
    except Exception as exc:  # noqa: BLE001
        report("async_op_on_either_side_of_a_barrier", f"{type(exc).__name__}: {exc}")
        return 1
    faulthandler.cancel_dump_traceback_later()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
