"""``horovod.torch`` with CUDA tensors: the NCCL half of the runtime's ``cpu:gloo,cuda:nccl`` backend.

Every test needs a CUDA GPU and skips without one ("needs a CUDA GPU"), so CI (CPU only) collects
and skips this file; ``scripts/gpu_check.sh`` runs it on a GPU machine together with Horovod's own
``test_torch.py``. Each test starts ``cuda_program.py`` in a process of its own, with a hard timeout:
a hang fails its test instead of blocking the run, and one NCCL failure cannot poison the others.

What one GPU allows:

* 1-rank jobs (``test_api_one_rank``, ``test_training_one_rank``): the whole API on CUDA tensors.
  A size-1 job still moves CUDA tensors through a real NCCL communicator, so every NCCL code
  path of the runtime runs (the allreduce / allgather / broadcast / alltoall / reducescatter
  transfers, their grouped, in-place and async forms, the optimizer's buckets, Adasum).
* 2 ranks on the same GPU (``test_two_ranks_one_gpu_*``): NCCL refuses two ranks of one
  communicator on one device. What is checked there is that our runtime says so clearly and in
  bounded time (no hang), and that CPU tensors of the same job still work.
* Device mistakes on 2 ranks (``test_two_ranks_device_errors_fail_only_their_op``): no NCCL
  communicator is built, so one GPU is enough.
* With 2 GPUs or more, ``test_api_two_ranks_own_gpus`` runs the API on 2 ranks, one GPU each (as
  ``torch.cuda.set_device(hvd.local_rank())`` places them); on one GPU it skips.

The program prints one ``CHECK name ok|FAIL`` line per check; a failing test lists the failed
ones, and ``pytest -rA`` shows every line (timings included) of the passing ones.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("cuda_program.py")
# gpu_check.sh runs this file with --noconftest: put tests/ (tiers.py) on the path as conftest.py does
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "horovod_compat" / "torch")]
from hvd_launch import horovodrun  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if HAS_CUDA else 0
pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The repository first on the path: the check runs from a bare checkout too (no install)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _one_rank(scenario: str, timeout: float) -> str:
    """``cuda_program.py SCENARIO`` as a plain process (a size-1 job); its output, checked."""
    try:
        proc = subprocess.run([sys.executable, str(PROGRAM), scenario], env=_env(), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode() if isinstance(exc.output, bytes) else (exc.output or "")
        pytest.fail(f"{scenario}: no end after {timeout:.0f} s (a hang); last output:\n{out[-4000:]}")
    print(proc.stdout)
    _assert_checks(scenario, proc.stdout, proc.returncode)
    return proc.stdout


def _assert_checks(scenario: str, output: str, returncode: Optional[int]) -> None:
    checks = [line for line in output.splitlines() if line.startswith("CHECK ")]
    failed = [line for line in checks if " FAIL " in line]
    assert checks, f"{scenario}: the program ran no check (exit {returncode}):\n{output[-4000:]}"
    assert not failed and returncode == 0 and "DONE failures=0" in output, (
        f"{scenario}: {len(failed)} of {len(checks)} checks failed (exit {returncode}):\n"
        + "\n".join(failed) + "\n--- output tail ---\n" + output[-3000:])


def test_check_build_names_nccl():
    """``horovodrun --check-build`` marks NCCL, and ``nccl_built()`` returns torch's NCCL version
    as Horovod's integer (2.27.3 -> 22703)."""
    out = subprocess.run([sys.executable, "-m", "horovod_compat.run", "--check-build"], env=_env(), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120).stdout
    print(out)
    assert "[X] NCCL" in out, out
    code = subprocess.run([sys.executable, "-c", "import horovod.torch as hvd; print(hvd.nccl_built())"],
                          env=_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=120).stdout.strip()
    major, minor, patch = torch.cuda.nccl.version()[:3]
    assert code == str(major * 10000 + minor * 100 + patch), code


def test_api_one_rank():
    """Every collective and variant on CUDA tensors of each dtype, in a 1-rank job."""
    _one_rank("api", timeout=240)


def test_training_one_rank():
    """DistributedOptimizer (SGD, Adam, fp16 compression, backward_passes_per_step, Adasum, Sum
    and groups), broadcast_parameters / broadcast_optimizer_state and SyncBatchNorm on a CUDA
    model: a 1-rank job must train exactly as the plain optimizer."""
    _one_rank("train", timeout=240)


@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs (this machine has {GPUS})")
def test_api_two_ranks_own_gpus():
    launch = horovodrun(2, [sys.executable, str(PROGRAM), "api"], timeout=300, env=_env(), cwd=str(ROOT))
    print(launch.output)
    assert not launch.timed_out, "the 2-rank launch hung:\n" + launch.tail()
    for rank in (0, 1):
        _assert_checks(f"api rank {rank}", "\n".join(launch.rank_lines(rank)), launch.returncode)


def _outcomes(lines: List[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in lines:
        if line.startswith("OUTCOME "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key in ("cpu_allreduce", "cuda_allreduce", "cpu_after", "shutdown_seconds"):
                    out[key] = value
            if "error=" in line:
                out["error"] = line.split("error=", 1)[1]
    return out


#: What a clear message about two ranks on one GPU names (NCCL's own words, or ours).
CLEAR = ("same GPU", "Duplicate GPU", "duplicate GPU", "one GPU", "same device")

#: Op timeout of the 2-rank launches: a rank that waited for a peer's transfer this long fails.
OP_TIMEOUT = "60"
#: How long one 2-rank launch may take before it counts as hung (scripts/gpu_check.sh shortens it).
LAUNCH_TIMEOUT = float(os.environ.get("HOROVOD_COMPAT_GPU_LAUNCH_TIMEOUT", "180"))
#: NCCL's own warnings name the cause of a refused communicator.
NCCL_ENV = {"HOROVOD_COMPAT_OP_TIMEOUT": OP_TIMEOUT, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}
_hung: List[str] = []


def _same_gpu_launch(scenario: str):
    """A 2-rank launch with both ranks on ``cuda:0``; after one such launch hung, the next is not
    tried (it would hang the same way and only spend the GPU machine's time)."""
    if _hung:
        pytest.skip(f"not repeated: the launch of {_hung[0]} hung")
    launch = horovodrun(2, [sys.executable, str(PROGRAM), scenario], timeout=LAUNCH_TIMEOUT,
                        env=_env(NCCL_ENV), cwd=str(ROOT))
    print(launch.output)
    if launch.timed_out:
        _hung.append(scenario)
    assert not launch.timed_out, (f"two ranks on one GPU: the launch hung (no end after "
                                  f"{LAUNCH_TIMEOUT:.0f} s)\n" + launch.tail())
    return launch


def test_two_ranks_device_errors_fail_only_their_op():
    """Rank 0 on the GPU and rank 1 on the CPU for one allreduce, then a grouped allreduce of a CPU
    and a GPU tensor: each must raise on both ranks, and the job's later ops must still work
    (Horovod raises per op; a user's device mistake must not break the runtime). Needs no NCCL
    communicator, so it runs on one GPU."""
    launch = horovodrun(2, [sys.executable, str(PROGRAM), "mixed"], timeout=LAUNCH_TIMEOUT,
                        env=_env(NCCL_ENV), cwd=str(ROOT))
    print(launch.output)
    assert not launch.timed_out, "device errors on 2 ranks: the launch hung\n" + launch.tail()
    for rank in (0, 1):
        _assert_checks(f"mixed rank {rank}", "\n".join(launch.rank_lines(rank)), launch.returncode)


def test_two_ranks_one_gpu_fails_clearly():
    """Both ranks put their CUDA tensors on ``cuda:0``. NCCL cannot build a communicator with two
    ranks on one device; the CUDA allreduce must end on both ranks within the op timeout with an
    error that says why, and the CPU allreduce before it (gloo, same job) must work."""
    launch = _same_gpu_launch("same_gpu")
    for rank in (0, 1):
        got = _outcomes(launch.rank_lines(rank))
        assert got.get("cpu_allreduce") == "ok", (rank, got, launch.tail())
        result = got.get("cuda_allreduce")
        assert result in ("ok", "error"), (rank, got, launch.tail())
        if result == "error":
            assert "NCCL" in got.get("error", "") or any(c in got.get("error", "") for c in CLEAR), (rank, got)


def test_two_ranks_one_gpu_error_reaches_the_user():
    """The same error left uncaught: horovodrun must end (non-zero) in bounded time and its report
    must show the rank's error, not only a knock-on or a timeout."""
    launch = _same_gpu_launch("same_gpu_raise")
    if launch.returncode == 0:
        assert "cuda_allreduce=ok" in launch.output  # NCCL coped: nothing to report
        return
    assert "NCCL" in launch.output or any(c in launch.output for c in CLEAR), launch.tail(80)
