"""A Horovod training loop in which one rank stops making progress: ``horovodrun -np 3 python
frozen_program.py`` (``test_frozen_rank.py``).

Environment: ``FROZEN_FAULT`` -- ``sigstop`` (the rank stops its own process), ``hang`` (native
code that holds Python's GIL: every thread of the rank stops, its process state stays ``S``) or
``slow`` (a long ``time.sleep``: alive, just late); ``FROZEN_RANK`` and ``FROZEN_STEP`` say who and
when; ``FROZEN_SLOW`` the length of a ``slow`` fault.

Output (stdout): ``frozen-pid rank=R pid=P`` at the start; ``frozen-fault rank=R t=T`` just before
the fault; ``frozen-error rank=R t=T knock_on=.. peer=.. frozen=.. msg=..`` when a collective
raises ``HorovodInternalError`` (then the error goes on up, so the rank fails);
``frozen-done rank=R`` at the end.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time

import torch

import horovod.torch as hvd


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    print(f"frozen-pid rank={r} pid={os.getpid()}", flush=True)
    fault = os.environ.get("FROZEN_FAULT", "")
    who = int(os.environ.get("FROZEN_RANK", "-1"))
    at = int(os.environ.get("FROZEN_STEP", "2"))
    try:
        for step in range(at + 3):
            if r == who and step == at:
                print(f"frozen-fault rank={r} t={time.time():.3f}", flush=True)
                if fault == "sigstop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif fault == "hang":
                    ctypes.PyDLL(None).sleep(600)  # libc's sleep without releasing the GIL
                elif fault == "slow":
                    time.sleep(float(os.environ.get("FROZEN_SLOW", "8")))
            hvd.allreduce(torch.ones(4), name="step.allreduce")
            hvd.allgather(torch.full((2, 2), float(r)), name="step.allgather")
            hvd.broadcast_object({"step": step}, root_rank=0)
    except hvd.HorovodInternalError as exc:
        print(f"frozen-error rank={r} t={time.time():.3f} knock_on={exc.knock_on} peer={exc.peer} "
              f"frozen={exc.frozen} msg={exc}", flush=True)
        raise
    print(f"frozen-done rank={r}", flush=True)


if __name__ == "__main__":
    main()
