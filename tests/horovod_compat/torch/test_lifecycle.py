"""hvd.init / shutdown / topology / capability queries under every launcher.

Launchers: our engine (torchrun-style env), real ``torchrun``, real ``mpirun`` (rank 0's address
exchanged through mpi4py), horovodrun-style ``HOROVOD_*`` variables, and no environment at all.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from distributor import run_function
from distributor.rank_env import free_port

PY = sys.executable
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
               "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE")

# One script for the external launchers: init, topology, a collective, re-init, JSON on stdout.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import horovod.torch as hvd
    comm = None
    if os.environ.get("USE_MPI_COMM"):
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    hvd.init(comm=comm)
    res = dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
               local_size=hvd.local_size(), cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(),
               sum=hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item(),
               mpi_enabled=hvd.mpi_enabled(), mpi_threads=hvd.mpi_threads_supported())
    hvd.shutdown()
    hvd.init()
    res["sum2"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    hvd.shutdown()
    sys.stdout.write("RESULT " + json.dumps(res) + "\\n"); sys.stdout.flush()
""")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(("OMPI_", "PMI_", "HOROVOD_", "TORCHELASTIC"))}
    env.update(extra)
    return env


def _results(stdout: str):
    rows = [json.loads(m) for m in re.findall(r"RESULT (\{[^}]*\})", stdout)]
    return sorted(rows, key=lambda r: r["rank"])


def _check_two_ranks(rows, mpi=False):
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert r["size"] == 2 and r["local_size"] == 2 and r["local_rank"] == r["rank"]
        assert r["cross_rank"] == 0 and r["cross_size"] == 1
        assert r["sum"] == 3.0 and r["sum2"] == 2.0
        assert r["mpi_enabled"] is mpi
        assert isinstance(r["mpi_threads"], bool)


def test_topology_queries_raise_before_init():
    import horovod.torch as hvd
    assert not hvd.is_initialized()
    for fn in (hvd.size, hvd.rank, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size):
        with pytest.raises(ValueError, match=r"^Horovod has not been initialized; use hvd.init\(\).$"):
            fn()


def test_no_environment_is_a_size_one_job(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.replace("hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()",
                                     "hvd.allreduce(torch.tensor([3.0]), op=hvd.Sum).item()"))
    p = subprocess.run([PY, str(script)], env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (r,) = _results(p.stdout)
    assert (r["rank"], r["size"], r["local_rank"], r["local_size"], r["sum"], r["sum2"]) == (0, 1, 0, 1, 3.0, 1.0)


def test_interpreter_exit_leaves_the_job_first(tmp_path):
    """hvd.init() registers hvd.shutdown at exit (as Horovod does): without it a gloo worker thread
    could still hold a tensor while Python finalizes, and the process aborted after succeeding."""
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent("""
        import atexit
        import torch.distributed as dist
        import horovod.torch as hvd
        # Registered before hvd.init(), so it runs after everything init registered (LIFO).
        atexit.register(lambda: print("at exit: initialized", hvd.is_initialized(), dist.is_initialized()))
        hvd.init()
        hvd.allreduce(__import__("torch").ones(4), name="x")
    """))
    p = subprocess.run([PY, str(script)], env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "at exit: initialized False False" in p.stdout


GLOO_THREADS = textwrap.dedent("""
    import os
    import torch
    import horovod.torch as hvd


    def gloo_threads():
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return sorted(n for n in names if "gloo" in n)


    hvd.init()
    model = torch.nn.Linear(4, 1)
    # The first optimizer imports torch._dynamo and, with it, torch.distributed.nn.functional,
    # whose defaults (group=group.WORLD) are evaluated now that the default group exists.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    hvd.alltoall(torch.ones(hvd.size()))
    print("while initialized:", gloo_threads(), flush=True)
    hvd.shutdown()
    import torch.distributed.nn.functional as F
    print("after shutdown:", gloo_threads(), F.all_reduce.__defaults__[-1], flush=True)
    hvd.init()
    print("re-init sum:", hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), flush=True)
""")


def test_shutdown_ends_the_gloo_threads_although_torch_keeps_the_group(tmp_path):
    """hvd.shutdown() frees every torch group it made, so their gloo threads end while Python is
    whole. torch keeps the default group in default arguments of modules imported after init
    (torch.distributed.nn.functional, imported with torch._dynamo by the first optimizer); left
    alive until exit, a gloo worker that dropped a finished collective's tensor while Python
    finalized aborted the process ("terminate called without an active exception", about 1 run in
    30 on a loaded machine) after the program succeeded."""
    script = tmp_path / "threads.py"
    script.write_text(GLOO_THREADS)
    p = subprocess.run([PY, "-m", "horovod_compat.run", "-np", "2", PY, str(script)],
                       env=_clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for rank in (0, 1):
        during = re.search(rf"\[{rank}\]<stdout>:while initialized: (.*)", p.stdout)
        assert during and "pt_gloo_runloop" in during.group(1), p.stdout  # the check can see them
        after = re.search(rf"\[{rank}\]<stdout>:after shutdown: (.*)", p.stdout)
        assert after and after.group(1) == "[] None", p.stdout
        assert f"[{rank}]<stdout>:re-init sum: 2.0" in p.stdout, p.stdout


def test_torchrun(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    p = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script)], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    _check_two_ranks(_results(p.stdout))


def _mpirun():
    mpirun = os.path.join(os.path.dirname(PY), "mpirun")
    if not os.path.exists(mpirun):
        pytest.skip("mpirun not installed beside this python")
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def test_mpirun_without_master_addr_uses_mpi4py_rendezvous(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    p = subprocess.run(_mpirun() + [PY, str(script)], env=_clean_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    _check_two_ranks(_results(p.stdout), mpi=True)


def test_mpirun_with_mpi4py_communicator(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    p = subprocess.run(_mpirun() + ["-x", "USE_MPI_COMM=1", PY, str(script)], env=_clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    _check_two_ranks(_results(p.stdout), mpi=True)


def test_horovodrun_style_environment(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    port = free_port()
    procs = []
    for rank in range(2):
        env = _clean_env(HOROVOD_RANK=str(rank), HOROVOD_SIZE="2", HOROVOD_LOCAL_RANK=str(rank),
                         HOROVOD_LOCAL_SIZE="2", HOROVOD_CROSS_RANK="0", HOROVOD_CROSS_SIZE="1",
                         HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
                         HOROVOD_GLOO_RENDEZVOUS_PORT=str(port))
        procs.append(subprocess.Popen([PY, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    _check_two_ranks(_results("".join(outs)))


def _engine_lifecycle():
    import torch
    import torch.distributed as dist
    import horovod.torch as hvd
    res = {}
    hvd.init()
    hvd.init()  # a second init is a no-op
    res["topology"] = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                       hvd.cross_size(), hvd.is_homogeneous())
    res["caps"] = dict(mpi_built=hvd.mpi_built(), mpi_enabled=hvd.mpi_enabled(),
                       gloo_built=hvd.gloo_built(), gloo_enabled=hvd.gloo_enabled(),
                       nccl_built=hvd.nccl_built(), ddl_built=hvd.ddl_built(),
                       ccl_built=hvd.ccl_built(), sycl_built=hvd.sycl_built(), cuda_built=hvd.cuda_built(),
                       rocm_built=hvd.rocm_built(), mpi_threads=hvd.mpi_threads_supported())
    try:  # dispatched to horovod_compat.common.timeline, which wants HOROVOD_TIMELINE=DYNAMIC
        hvd.start_timeline("/tmp/never-written.json")
        res["timeline"] = "started"
    except ValueError as e:
        res["timeline"] = str(e)
    sums = []
    for _ in range(3):  # init -> shutdown -> init, with collectives in between
        sums.append(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="x").item())
        hvd.shutdown()
        res.setdefault("after_shutdown", hvd.is_initialized())
        hvd.init()
    sums.append(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="x").item())
    hvd.shutdown()
    res["sums"] = sums
    # comm=[ranks]
    hvd.init(comm=[0, 1])
    res["comm"] = (hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
    hvd.shutdown()
    # torch.distributed initialised by the user first: hvd joins that group
    dist.init_process_group("gloo")
    hvd.init()
    res["preinit"] = (hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
    hvd.shutdown()
    res["preinit_group_kept"] = dist.is_initialized()
    dist.destroy_process_group()
    return res


def test_engine_init_shutdown_reinit_and_capabilities():
    r0, r1 = run_function(_engine_lifecycle, num_processes=2, return_all=True, timeout=120)
    for rank, r in enumerate((r0, r1)):
        assert r["topology"] == (rank, 2, rank, 2, 0, 1, True)
        c = r["caps"]
        assert c["gloo_built"] is True and c["gloo_enabled"] is True
        assert c["mpi_built"] is True and c["mpi_enabled"] is False and c["mpi_threads"] is False
        assert c["nccl_built"] == 0 and c["ddl_built"] is False and c["ccl_built"] is False and c["sycl_built"] is False
        assert c["cuda_built"] is False and c["rocm_built"] is False
        assert r["timeline"] == "Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage."
        assert r["after_shutdown"] is False
        assert r["sums"] == [2.0, 2.0, 2.0, 2.0]
        assert r["comm"] == (2, 2.0)
        assert r["preinit"] == (2, 2.0) and r["preinit_group_kept"] is True
