"""The shared-memory allreduce transport (horovod_compat/common/_shm.py) on real ranks.

Inputs are deterministic per rank, so every rank computes the exact expected result itself.  A
64 KB slot makes the larger tensors take several rounds (and both banks).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from warm import run_function_warm


SMALL_SLOT = {"HOROVOD_COMPAT_SHM_SLOT_KB": "64"}


def _matrix():
    import torch
    import horovod.torch as hvd
    from horovod_compat.common.process_sets import global_process_set

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    transport = global_process_set.negotiation.shm
    rows = [("transport in use", transport is not None, "")]
    ops = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
           "Product": hvd.Product}
    dtypes = ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
              "float64"]
    rounds_before = transport.reducer.rounds if transport else 0
    # 0 elements, fewer elements than ranks, not a multiple of 16, and more than one 64 KB slot
    for numel in (0, 1, 2, 37, 40_000):
        for dn in dtypes:
            dt = getattr(torch, dn)
            inputs = [(torch.arange(numel) % 3 + j).to(dt) for j in range(n)]
            stacked = torch.stack([x.double() for x in inputs])
            for on, op in ops.items():
                if on == "Sum" or on == "Average":
                    want = stacked.sum(0)
                elif on == "Min":
                    want = stacked.min(0).values if numel else stacked.sum(0)
                elif on == "Max":
                    want = stacked.max(0).values if numel else stacked.sum(0)
                else:
                    want = stacked.prod(0)
                if on == "Average":
                    want = want / n if dt.is_floating_point else torch.div(want, n,
                                                                           rounding_mode="trunc")
                want = want.to(dt)
                x = inputs[r].clone()
                got = hvd.allreduce(x, op=op, name=f"{dn}.{on}.{numel}")
                label = f"{dn} {on} numel={numel}"
                rows.append((label, torch.equal(got, want), f"{got[:8]} != {want[:8]}"))
                rows.append((label + " input intact", torch.equal(x, inputs[r]), ""))
                y = inputs[r].clone()
                hvd.allreduce_(y, op=op, name=f"{dn}.{on}.{numel}.inplace")
                rows.append((label + " in place", torch.equal(y, want), f"{y[:8]} != {want[:8]}"))
    # non-contiguous input and scaling factors go through a copy but still through the transport
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (r + 1)
    got = hvd.allreduce(base.t(), op=hvd.Sum, name="transposed")
    want = (torch.arange(24, dtype=torch.float32).reshape(4, 6) * sum(range(1, n + 1))).t()
    rows.append(("non-contiguous", torch.equal(got, want), f"{got} != {want}"))
    got = hvd.allreduce(torch.ones(5) * (r + 1), op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5, name="scaled")
    rows.append(("pre/postscale", torch.equal(got, torch.ones(5) * sum(range(1, n + 1))), f"{got}"))
    rows.append(("rounds counted", transport is not None
                 and transport.reducer.rounds > rounds_before + 9 * 5 * 5, ""))
    hvd.shutdown()
    return rows


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_dtype_op_and_size_matches_the_exact_result(ranks):
    reports = run_function_warm(_matrix, num_processes=ranks, return_all=True, timeout=240,
                           env=SMALL_SLOT)
    for rows in reports:
        failures = [row for row in rows if not row[1]]
        assert not failures, failures[:10]
        assert len(rows) > 5 * 9 * 5 * 3


def _ordering():
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    out = {}
    # async ops of several sizes (they run on the transport's thread), a sync op and a broadcast
    # between them; synchronized in reverse order
    handles = [hvd.allreduce_async(torch.full((1 + 5000 * i,), float(i + r)), op=hvd.Sum,
                                   name=f"a{i}") for i in range(12)]
    out["sync between"] = hvd.allreduce(torch.ones(3) * (r + 1), op=hvd.Sum, name="mid").tolist()
    out["broadcast between"] = hvd.broadcast(torch.tensor([float(r)]), root_rank=1).tolist()
    got = [hvd.synchronize(h) for h in reversed(handles)]
    out["async reverse"] = [(t.numel(), t[0].item(), t[-1].item()) for t in reversed(got)]
    # poll without ever calling a blocking wait first: the op must progress on its own
    h = hvd.allreduce_async_(torch.ones(70_000) * (r + 1), op=hvd.Sum, name="polled")
    while not hvd.poll(h):
        pass
    t = hvd.synchronize(h)
    out["polled"] = (t.min().item(), t.max().item())
    hvd.shutdown()
    return out


def test_async_ops_keep_submission_order_and_progress_under_poll():
    reports = run_function_warm(_ordering, num_processes=2, return_all=True, timeout=120,
                           env=SMALL_SLOT)
    for rep in reports:
        assert rep["sync between"] == [3.0] * 3
        assert rep["broadcast between"] == [1.0]
        assert rep["async reverse"] == [(1 + 5000 * i, 2.0 * i + 1, 2.0 * i + 1) for i in range(12)]
        assert rep["polled"] == (3.0, 3.0)


_DYING_PEER = textwrap.dedent("""
    import os, sys, time
    import torch
    import horovod.torch as hvd
    hvd.init()
    hvd.allreduce(torch.ones(100_000), name="grad")  # cached: the next "grad" moves at once
    if hvd.rank() == 1:
        time.sleep(0.5)
        os._exit(0)
    try:  # the data transfer waits for the departed peer
        hvd.allreduce(torch.ones(100_000), name="grad")
        print("NO ERROR", flush=True)
    except hvd.HorovodInternalError as e:
        print("FIRST:", e, flush=True)
    try:  # a new name: fails at once (the set's coordinator is broken)
        hvd.allreduce(torch.ones(10), name="later")
    except hvd.HorovodInternalError as e:
        print("LATER:", e, flush=True)
    os._exit(0)  # skip shutdown: its teardown would wait for the departed peer
""")


def test_a_peer_that_exits_mid_allreduce_fails_the_op_instead_of_hanging(tmp_path):
    script = tmp_path / "dying_peer.py"
    script.write_text(_DYING_PEER)
    from distributor.rank_env import free_port

    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        out0, _ = procs[0].communicate(timeout=120)  # rank 1 stays unreaped: a zombie meanwhile
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert "FIRST: rank 1 of this process set" in out0 and "exited while rank 0 waited" in out0, out0
    # the process set stays broken: later ops fail at once with the same cause
    assert "LATER: rank 1 of this process set" in out0, out0


def test_gloo_carries_the_data_when_shared_memory_is_off():
    def probe():
        import torch
        import horovod.torch as hvd
        from horovod_compat.common.process_sets import global_process_set

        hvd.init()
        got = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum).tolist()
        used = global_process_set.negotiation.shm is not None
        hvd.shutdown()
        return got, used

    for env, used in (({}, True), ({"HOROVOD_COMPAT_SHM_DATA": "0"}, False),
                      ({"HOROVOD_COMPAT_SHM_CONTROL": "0"}, False)):
        for got, shm_used in run_function_warm(probe, num_processes=2, return_all=True, timeout=60,
                                          env=env):
            assert got == [3.0] * 3 and shm_used is used, env


def _optimizer_step():
    import torch
    import horovod.torch as hvd
    from horovod_compat.common.process_sets import global_process_set

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    model = torch.nn.Linear(300, 200)
    with torch.no_grad():
        model.weight.fill_(0.0)
        model.bias.fill_(0.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    reducer = global_process_set.negotiation.shm.reducer
    before = reducer.rounds
    x = torch.full((4, 300), float(r + 1))
    model(x).sum().backward()  # grad of weight: 4 * (r + 1) everywhere; of bias: 4
    opt.step()
    used = reducer.rounds - before
    weight = model.weight.detach().clone()
    hvd.shutdown()
    return used, weight.min().item(), weight.max().item()


def test_distributed_optimizer_buckets_go_through_shared_memory():
    for used, lo, hi in run_function_warm(_optimizer_step, num_processes=2, return_all=True,
                                     timeout=120):
        assert used > 0
        assert lo == hi == -6.0  # minus the averaged gradient (4 * 1 + 4 * 2) / 2


OWNER_KILLED = textwrap.dedent("""\
    import os, signal
    import torch
    import horovod.torch as hvd

    if os.environ["RANK"] == "0":  # the owner of the set's segments: killed once it made one
        fallocate = os.posix_fallocate

        def fallocate_then_die(fd, offset, size):
            fallocate(fd, offset, size)
            print("owner pid", os.getpid(), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        os.posix_fallocate = fallocate_then_die
    hvd.init()
    hvd.allreduce(torch.ones(1))
    """)


def test_a_segment_whose_owner_was_killed_before_unlinking_it_is_removed_after_the_job(tmp_path):
    """Rank 0 made its segment in /dev/shm and was SIGKILLed before the others had mapped it (so
    before it unlinked it): horovodrun removes it when the job ends (shm_names.remove_orphans)."""
    from hvd_launch import horovodrun

    script = tmp_path / "owner_killed.py"
    script.write_text(OWNER_KILLED)
    run = horovodrun(2, [sys.executable, str(script)], timeout=120)
    assert not run.timed_out and run.returncode != 0, run.tail()
    pids = [line.split()[-1] for line in run.rank_lines(0) if line.startswith("owner pid")]
    assert pids, "rank 0 never made its segment\n" + run.tail()
    left = [name for name in os.listdir("/dev/shm") if f"-{pids[0]}-" in name]
    assert left == [], left
