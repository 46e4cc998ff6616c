"""A grouped op whose tensors sit on different devices fails alone, on every rank, before it is sent.

Horovod refuses such an op when it is enqueued (a ``RuntimeError``). Found only when the transfer
starts, it used to fail as a broken transfer does and break the process set: every later op of the
job raised. CPU and GPU tensors are the real case (tests/gpu/test_cuda.py has it on a GPU); here
``meta`` tensors stand in for the second device, so the check runs on any machine.
"""
from __future__ import annotations

import sys
import textwrap

from hvd_launch import horovodrun

PROGRAM = textwrap.dedent('''
    import torch
    import horovod.torch as hvd
    from horovod_compat.common.exceptions import HorovodInternalError

    hvd.init()
    n = hvd.size()
    ops = {
        "grouped_allreduce": lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum),
        "grouped_allreduce_": lambda ts: hvd.grouped_allreduce_(ts, op=hvd.Sum),
        "grouped_allgather": hvd.grouped_allgather,
        "grouped_reducescatter": lambda ts: hvd.grouped_reducescatter(ts, op=hvd.Sum),
    }
    for kind, op in ops.items():
        for order in ((torch.device("cpu"), torch.device("meta")),
                      (torch.device("meta"), torch.device("cpu"))):
            ts = [torch.ones(2 * n, device=d) for d in order]
            try:
                op(ts)
                print("RESULT", kind, "accepted")
            except HorovodInternalError as exc:
                print("RESULT", kind, "HorovodInternalError", exc)
            except RuntimeError as exc:
                print("RESULT", kind, "refused" if "one device" in str(exc) else exc)
            out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"after.{kind}.{order[0]}")
            print("RESULT", kind, "after", "ok" if torch.equal(out, torch.full((3,), float(n))) else out)
    hvd.shutdown()
''')


def test_mixed_device_grouped_ops_fail_alone(tmp_path):
    program = tmp_path / "grouped_devices.py"
    program.write_text(PROGRAM)
    launch = horovodrun(2, [sys.executable, str(program)], timeout=120)
    assert not launch.timed_out, launch.tail()
    assert launch.returncode == 0, launch.tail()
    for rank in (0, 1):
        # "RESULT <kind> <what happened>"
        results = [line.split(None, 2) for line in launch.rank_lines(rank) if line.startswith("RESULT ")]
        assert len(results) == 16, launch.tail()
        wrong = [" ".join(r[1:]) for r in results if r[2] not in ("refused", "after ok")]
        assert not wrong, wrong
