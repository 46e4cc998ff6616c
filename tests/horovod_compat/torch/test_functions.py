"""broadcast_parameters / broadcast_optimizer_state / broadcast_object / allgather_object on 2 real
ranks (one launch runs every check and returns a report the test asserts on)."""
from __future__ import annotations

import pytest

from warm import run_function_warm


def _init():
    """hvd.init() when the core exposes it; torch.distributed's default group otherwise."""
    import horovod_compat.torch as hvd
    if hasattr(hvd, "init"):
        hvd.init()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")


def _functions_report():
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    _init()
    from horovod_compat.torch.functions import (allgather_object, broadcast_object,
                                                broadcast_optimizer_state, broadcast_parameters)
    rank = dist.get_rank()
    rep = {"rank": rank}

    def model():
        torch.manual_seed(100 + rank)  # different weights on every rank
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))

    # state_dict (includes BatchNorm buffers, int64 num_batches_tracked)
    m = model()
    m[1].num_batches_tracked += 3 + rank
    broadcast_parameters(m.state_dict(), root_rank=1)
    rep["state_dict"] = [v.clone() for _, v in sorted(m.state_dict().items())]
    # named parameters list, root 0
    m = model()
    broadcast_parameters(list(m.named_parameters()), root_rank=0)
    rep["named"] = [p.detach().clone() for p in m.parameters()]
    # plain tensors list, mixed dtypes
    ts = [torch.full((3,), float(rank)), torch.arange(4) * (rank + 1), torch.tensor([rank == 0])]
    broadcast_parameters(ts, root_rank=0)
    rep["tensors"] = ts
    try:
        broadcast_parameters(m.named_parameters(), root_rank=0)  # a generator: Horovod rejects it
        rep["generator_error"] = None
    except ValueError as e:
        rep["generator_error"] = str(e)

    # different models on the ranks: HorovodInternalError everywhere, naming the ranks; then all is well
    bad = torch.nn.Linear(3, 2 + rank)
    try:
        broadcast_parameters(bad.state_dict(), root_rank=0)
        rep["mismatch"] = None
    except RuntimeError as e:
        rep["mismatch"] = (type(e).__name__, str(e))
    after = [torch.full((2,), float(rank))]
    broadcast_parameters(after, root_rank=1)
    rep["after_mismatch"] = after[0].tolist()

    # optimizer state: fresh Adam with rank-dependent options -> materialized, root's options
    m = model()
    broadcast_parameters(m.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.Adam(m.parameters(), lr=0.01 * (rank + 1), betas=(0.9, 0.99 - 0.01 * rank),
                           weight_decay=0.1)
    broadcast_optimizer_state(opt, root_rank=0)
    rep["adam_options"] = [(g["lr"], g["betas"], g["weight_decay"]) for g in opt.param_groups]
    rep["adam_state_keys"] = [sorted(opt.state[p].keys()) for p in m.parameters()]
    rep["params_unchanged"] = all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    rep["grads_zero"] = all(p.grad is not None and not p.grad.any() for p in m.parameters())
    # a parameter that does not require grad keeps grad None (Horovod's test_broadcast_state_no_grad)
    frozen = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    live = torch.nn.Parameter(torch.rand(4))
    opt_ng = torch.optim.SGD([frozen, live], lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    broadcast_optimizer_state(opt_ng, root_rank=0)
    rep["no_grad_param"] = (frozen.grad is None, live.grad is not None and not live.grad.any())
    # state only on rank 1 (trained), broadcast from rank 1: rank 0 ends with rank 1's state
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1 + rank, momentum=0.9)
    if rank == 1:
        m(torch.randn(5, 4)).sum().backward()
        opt.step()
    broadcast_optimizer_state(opt, root_rank=1)
    rep["sgd_momentum"] = [opt.state[p]["momentum_buffer"].clone() for p in m.parameters()]
    rep["sgd_lr"] = opt.param_groups[0]["lr"]
    try:
        broadcast_optimizer_state(torch.optim.LBFGS(m.parameters()), root_rank=0)
        rep["lbfgs_error"] = None
    except ValueError as e:
        rep["lbfgs_error"] = str(e)

    # objects: different types on each rank must not hang
    rep["bobj"] = broadcast_object({"a": [1, 2], "r": rank} if rank == 0 else 3.5, root_rank=0)
    rep["bobj_root1"] = broadcast_object(lambda x: x + rank, root_rank=1)(10)
    rep["gobj"] = allgather_object({"rank": rank} if rank == 0 else ["x" * 1000, rank])
    rep["gobj_named"] = allgather_object(rank * 2, name="n")
    return rep


@pytest.fixture(scope="module")
def reports():
    return run_function_warm(_functions_report, num_processes=2, return_all=True, timeout=120)


def test_broadcast_parameters_state_dict_named_list_and_tensors(reports):
    import torch
    r0, r1 = reports
    for a, b in zip(r0["state_dict"], r1["state_dict"]):
        assert torch.equal(a, b)
    # sorted keys: index 3 is BatchNorm's num_batches_tracked; the root (rank 1) had 3 + 1
    assert r0["state_dict"][3].dtype == torch.int64 and r0["state_dict"][3].item() == 4
    for a, b in zip(r0["named"], r1["named"]):
        assert torch.equal(a, b)
    assert torch.equal(r1["tensors"][0], torch.zeros(3))
    assert torch.equal(r1["tensors"][1], torch.arange(4))
    assert r1["tensors"][2].dtype == torch.bool and bool(r1["tensors"][2].item()) is True


def test_broadcast_parameters_rejects_generator(reports):
    assert "invalid params of type" in reports[0]["generator_error"]
    assert "invalid params of type" in reports[1]["generator_error"]


def test_broadcast_parameters_mismatch_is_reported_not_hung(reports):
    for r in reports:
        kind, msg = r["mismatch"]
        assert kind == "HorovodInternalError"
        assert msg == ("Mismatched BROADCAST tensor shapes: One rank sent a tensor of shape [2], "
                       "but another rank sent a tensor of shape [3]. Tensor 'broadcast.bias': "
                       "rank 0 sent shape [2]; rank 1 sent shape [3]."), msg
        assert r["after_mismatch"] == [1.0, 1.0]


def test_public_namespace_reexports_helpers():
    import horovod_compat.torch as hvd
    from horovod_compat.torch import elastic, functions, optimizer, sync_batch_norm
    assert hvd.DistributedOptimizer is optimizer.DistributedOptimizer
    assert hvd.broadcast_parameters is functions.broadcast_parameters
    assert hvd.broadcast_optimizer_state is functions.broadcast_optimizer_state
    assert hvd.broadcast_object is functions.broadcast_object
    assert hvd.allgather_object is functions.allgather_object
    assert hvd.SyncBatchNorm is sync_batch_norm.SyncBatchNorm
    assert hvd.elastic.run is elastic.run and hvd.elastic.TorchState is elastic.TorchState


def test_broadcast_optimizer_state_materializes_and_syncs_options(reports):
    r0, r1 = reports
    assert r0["adam_options"] == r1["adam_options"] == [(0.01, (0.9, 0.99), 0.1)]
    assert r1["adam_state_keys"][0] == ["exp_avg", "exp_avg_sq", "step"]
    # the materializing step (weight decay!) left the weights as they were
    assert r0["params_unchanged"] and r1["params_unchanged"]
    assert r0["grads_zero"] and r1["grads_zero"]  # Horovod leaves zero gradients behind
    assert r0["no_grad_param"] == r1["no_grad_param"] == (True, True)


def test_broadcast_optimizer_state_from_rank_with_state(reports):
    import torch
    r0, r1 = reports
    assert r0["sgd_lr"] == r1["sgd_lr"] == 1.1
    for a, b in zip(r0["sgd_momentum"], r1["sgd_momentum"]):
        assert torch.equal(a, b) and a.abs().sum() > 0


def test_broadcast_optimizer_state_lbfgs_is_value_error(reports):
    assert reports[0]["lbfgs_error"] == "cannot broadcast torch.optim.LBFGS state"


def test_broadcast_object_and_allgather_object(reports):
    r0, r1 = reports
    assert r0["bobj"] == r1["bobj"] == {"a": [1, 2], "r": 0}
    assert r0["bobj_root1"] == r1["bobj_root1"] == 11
    expected = [{"rank": 0}, ["x" * 1000, 1]]
    assert r0["gobj"] == r1["gobj"] == expected
    assert r0["gobj_named"] == r1["gobj_named"] == [0, 2]


def test_helpers_before_init_raise_value_error():
    import torch
    import torch.distributed as dist
    from horovod_compat.torch.functions import broadcast_object, broadcast_parameters
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialized in the test process")
    with pytest.raises(ValueError, match="Horovod has not been initialized; use hvd.init()."):
        broadcast_parameters([torch.zeros(1)], root_rank=0)
    with pytest.raises(ValueError, match="Horovod has not been initialized"):
        broadcast_object(1)
