"""hvd.SyncBatchNorm on CPU, 2 ranks with different batch sizes, against nn.BatchNorm on the
concatenated batch in one process (forward, input/weight/bias gradients, running statistics)."""
from __future__ import annotations

import pytest

from warm import run_function_warm


def _init():
    import horovod_compat.torch as hvd
    if hasattr(hvd, "init"):
        hvd.init()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")


def _sync_bn_report():
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    _init()
    from horovod_compat.torch.sync_batch_norm import SyncBatchNorm
    rank = dist.get_rank()
    rep = {}
    for dims in (2, 4):
        g = torch.Generator().manual_seed(5)
        shape = (8, 3) if dims == 2 else (8, 3, 4, 5)
        full = torch.randn(*shape, generator=g) * 3 + 1
        weights = torch.randn(*shape, generator=g)
        lo, hi = (0, 3) if rank == 0 else (3, 8)  # uneven batches: 3 and 5
        bn = SyncBatchNorm(3, momentum=0.3)
        ref = torch.nn.BatchNorm1d(3, momentum=0.3) if dims == 2 else torch.nn.BatchNorm2d(3, momentum=0.3)
        with torch.no_grad():
            for m in (bn, ref):
                m.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
                m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
        x = full[lo:hi].clone().requires_grad_(True)
        xr = full.clone().requires_grad_(True)
        for _ in range(2):  # two training steps: running stats accumulate
            x.grad = None
            xr.grad = None
            bn.zero_grad()
            ref.zero_grad()
            out = bn(x)
            (out * weights[lo:hi]).sum().backward()
            outr = ref(xr)
            (outr * weights).sum().backward()
        wg = bn.weight.grad.clone()
        bg = bn.bias.grad.clone()
        dist.all_reduce(wg)
        dist.all_reduce(bg)
        bn.eval()
        ref.eval()
        rep[dims] = {
            "out": (out - outr[lo:hi]).abs().max().item(),
            "dx": (x.grad - xr.grad[lo:hi]).abs().max().item(),
            "dw": (wg - ref.weight.grad).abs().max().item(),
            "db": (bg - ref.bias.grad).abs().max().item(),
            "running_mean": (bn.running_mean - ref.running_mean).abs().max().item(),
            "running_var": (bn.running_var - ref.running_var).abs().max().item(),
            "tracked": int(bn.num_batches_tracked),
            "eval": (bn(full[lo:hi]) - ref(full[lo:hi])).abs().max().item(),
        }
    try:
        SyncBatchNorm(3)(torch.zeros(3))
        rep["1d_error"] = None
    except ValueError as e:
        rep["1d_error"] = str(e)
    return rep


@pytest.fixture(scope="module")
def reports():
    return run_function_warm(_sync_bn_report, num_processes=2, return_all=True, timeout=120)


@pytest.mark.parametrize("dims", [2, 4])
def test_matches_batch_norm_on_concatenated_batch(reports, dims):
    for r in reports:
        d = r[dims]
        for key in ("out", "dx", "dw", "db", "running_mean", "running_var", "eval"):
            assert d[key] < 1e-4, (dims, key, d[key])
        assert d["tracked"] == 2


def test_input_dim_error(reports):
    assert reports[0]["1d_error"] == "expected at least 2D input (got 1D input)"
