"""hvd.DistributedOptimizer on 2 real ranks: every option combination trains to the same weights as
native DDP (or an exact reference), every validation error, the misuse errors, memory.

Each launch costs ~2 s, so one launch runs many scenarios and returns a report the tests assert on.
"""
from __future__ import annotations

import pytest

from warm import run_function_warm


TOL = 1e-5


def _init():
    """hvd.init() when the core exposes it; torch.distributed's default group otherwise."""
    import horovod_compat.torch as hvd
    if hasattr(hvd, "init"):
        hvd.init()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")


def _core(name, default=None):
    import importlib
    for mod in ("horovod_compat.torch", "horovod_compat.torch.compression"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, name):
            return getattr(m, name)
    return default


def _scenarios():
    """Train the same model with DDP and with DistributedOptimizer under many options."""
    import os
    import warnings
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    _init()
    from horovod_compat.common import ops
    from horovod_compat.torch.optimizer import DistributedOptimizer
    rank, size = dist.get_rank(), dist.get_world_size()
    Sum, Average = ops.Sum, ops.Average
    Compression = _core("Compression")
    rep = {}

    def make(seed=0):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                   torch.nn.Tanh(), torch.nn.Linear(16, 3))

    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)) for _ in range(12)]

    def local(i):
        x, y = data[i % len(data)]
        return x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]

    def ddp_run(opt_fn, steps=4, passes=1, lr_scale=1.0):
        m = make()
        d = DDP(m)
        opt = opt_fn(m.parameters(), lr_scale)
        k = 0
        for _ in range(steps):
            opt.zero_grad()
            for j in range(passes):
                x, y = local(k)
                k += 1
                if j < passes - 1:
                    with d.no_sync():
                        F.mse_loss(d(x), y).backward()
                else:
                    F.mse_loss(d(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in m.parameters()]

    def hvd_run(opt_fn, steps=4, passes=1, **kw):
        m = make()
        opt = DistributedOptimizer(opt_fn(m.parameters(), 1.0), named_parameters=m.named_parameters(),
                                   backward_passes_per_step=passes, **kw)
        k = 0
        for _ in range(steps):
            opt.zero_grad()
            for _ in range(passes):
                x, y = local(k)
                k += 1
                F.mse_loss(m(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in m.parameters()], opt

    def diff(a, b):
        return max((x - y).abs().max().item() for x, y in zip(a, b))

    sgd = lambda ps, s: torch.optim.SGD(ps, lr=0.1 * s, momentum=0.9)
    adam = lambda ps, s: torch.optim.Adam(ps, lr=0.01 * s)
    ref_sgd, ref_adam = ddp_run(sgd), ddp_run(adam)

    w, opt = hvd_run(sgd)
    rep["sgd"] = diff(w, ref_sgd)
    rep["class"] = (type(opt).__name__, isinstance(opt, torch.optim.SGD), type(opt) is not torch.optim.SGD)
    rep["adam"] = diff(hvd_run(adam)[0], ref_adam)
    # from the 2nd step on, p.grad is a view of the reduction bucket (no copy back); zeroing in
    # place (set_to_none=False) then accumulates into the bucket -- results must not change
    m = make()
    opt = DistributedOptimizer(sgd(m.parameters(), 1.0), named_parameters=m.named_parameters())
    for i in range(4):
        opt.zero_grad(set_to_none=False)
        x, y = local(i)
        F.mse_loss(m(x), y).backward()
        opt.step()
    rep["grad_views"] = (diff(list(m.parameters()), ref_sgd), all(p.grad._base is not None for p in m.parameters()))
    os.environ["HOROVOD_COMPAT_GRAD_AS_BUCKET_VIEW"] = "0"
    w, opt = hvd_run(sgd)
    rep["no_grad_views"] = (diff(w, ref_sgd), any(p.grad._base is not None for p in opt._hvd_reducer.params))
    del os.environ["HOROVOD_COMPAT_GRAD_AS_BUCKET_VIEW"]
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    w, opt = hvd_run(sgd)
    rep["no_fusion"] = (diff(w, ref_sgd), len(opt._hvd_reducer.buckets))
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "600"  # a few tensors per bucket
    w, opt = hvd_run(adam)
    rep["small_fusion"] = (diff(w, ref_adam), len(opt._hvd_reducer.buckets))
    # the reductions start inside backward (from the gradient hooks), not in step()
    m = make()
    opt = DistributedOptimizer(adam(m.parameters(), 1.0), named_parameters=m.named_parameters())
    x, y = local(0)
    F.mse_loss(m(x), y).backward()
    reducer = opt._hvd_reducer
    rep["launched_in_backward"] = (reducer.next_bucket, len(reducer.buckets),
                                   all(b.work is not None for b in reducer.buckets))
    opt.step()
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    rep["predivide"] = diff(hvd_run(sgd, gradient_predivide_factor=2.0)[0], ref_sgd)
    # large gradients are copied by their own hook (small ones batched per bucket): force that path
    import horovod_compat.torch.optimizer as optmod
    saved_numel, optmod._DIRECT_COPY_NUMEL = optmod._DIRECT_COPY_NUMEL, 1
    try:
        rep["direct_copy"] = max(diff(hvd_run(sgd)[0], ref_sgd),
                                 diff(hvd_run(sgd, gradient_predivide_factor=2.0)[0], ref_sgd))
    finally:
        optmod._DIRECT_COPY_NUMEL = saved_numel
    # Sum of gradients == Average with lr * size for SGD
    rep["sum"] = diff(hvd_run(sgd, op=Sum)[0], ddp_run(sgd, lr_scale=size))
    if Compression is not None:
        rep["fp16"] = diff(hvd_run(adam, compression=Compression.fp16)[0], ref_adam)
        w, opt = hvd_run(sgd, compression=Compression.fp16)
        rep["fp16_sgd"] = diff(w, ref_sgd)
        rep["fp16_buffer_dtypes"] = sorted({str(b.buffer.dtype) for b in opt._hvd_reducer.buckets})
    # backward_passes_per_step: local accumulation, reduced every 2nd backward
    ref2 = ddp_run(sgd, steps=3, passes=2)
    rep["bpps2"] = diff(hvd_run(sgd, steps=3, passes=2)[0], ref2)
    # options combined: accumulation + predivide + int groups (+ fp16 below)
    rep["combined"] = diff(hvd_run(sgd, steps=3, passes=2, gradient_predivide_factor=4.0, groups=2)[0], ref2)
    if Compression is not None:
        rep["combined_fp16"] = diff(hvd_run(sgd, steps=3, passes=2, gradient_predivide_factor=4.0,
                                            groups=2, compression=Compression.fp16)[0], ref2)

    # a user-defined compressor goes through its own compress/decompress, tensor by tensor
    class Float64Compressor:
        calls = 0

        @staticmethod
        def compress(t):
            Float64Compressor.calls += 1
            return t.to(torch.float64), t.dtype

        @staticmethod
        def decompress(t, ctx):
            return t.to(ctx)
    w, opt = hvd_run(adam, compression=Float64Compressor)
    rep["custom_compression"] = (diff(w, ref_adam), Float64Compressor.calls, len(opt._hvd_reducer.buckets))
    # groups: explicit lists, an int, and the deprecated num_groups
    m = make()
    plist = list(m.parameters())
    opt = DistributedOptimizer(sgd(m.parameters(), 1.0), named_parameters=m.named_parameters(),
                               groups=[[plist[0], plist[5]], [plist[2], plist[3]]])
    for i in range(4):
        opt.zero_grad()
        x, y = local(i)
        F.mse_loss(m(x), y).backward()
        opt.step()
    layout = [sorted(b.members) for b in opt._hvd_reducer.buckets]
    rep["groups_explicit"] = (diff(list(m.parameters()), ref_sgd), [0, 5] in layout and [2, 3] in layout)
    w, opt = hvd_run(sgd, groups=3)
    rep["groups_int"] = (diff(w, ref_sgd), len(opt._hvd_reducer.buckets))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, opt = hvd_run(sgd, num_groups=2)
    rep["num_groups"] = (diff(w, ref_sgd), len(opt._hvd_reducer.buckets),
                         any(issubclass(c.category, DeprecationWarning) and "num_groups" in str(c.message)
                             for c in caught))

    # explicit synchronize + skip_synchronize, and the warning without it
    m = make()
    opt = DistributedOptimizer(sgd(m.parameters(), 1.0), named_parameters=m.named_parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            opt.zero_grad()
            x, y = local(i)
            F.mse_loss(m(x), y).backward()
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
        rep["skip_sync"] = (diff(list(m.parameters()), ref_sgd), len(caught))
        opt.zero_grad()
        x, y = local(4)
        F.mse_loss(m(x), y).backward()
        opt.synchronize()
        opt.step()  # synchronizes again: warns
        rep["step_after_sync_warning"] = [str(c.message) for c in caught]

    # zero_grad while reductions are pending; one backward too many
    m = make()
    opt = DistributedOptimizer(sgd(m.parameters(), 1.0), named_parameters=m.named_parameters())
    x, y = local(0)
    F.mse_loss(m(x), y).backward()
    try:
        opt.zero_grad()
        rep["zero_grad_pending"] = None
    except AssertionError as e:
        rep["zero_grad_pending"] = str(e)
    try:
        F.mse_loss(m(x), y).backward()
        rep["too_many_backwards"] = None
    except AssertionError as e:
        rep["too_many_backwards"] = str(e)
    opt.synchronize()  # the job goes on
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()

    # parameters used on one rank only: no hang, the unused gradient is reduced as zeros
    torch.manual_seed(3)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt = DistributedOptimizer(torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1),
                               named_parameters=list(a.named_parameters(prefix="a"))
                               + list(b.named_parameters(prefix="b")))
    xin = torch.ones(2, 4) * (rank + 1)
    out = a(xin) if rank == 0 else b(a(xin))
    out.sum().backward()
    own = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in b.parameters()]
    opt.synchronize()
    gathered = [torch.zeros_like(own[0]) for _ in range(size)]
    dist.all_gather(gathered, own[0])
    rep["unused"] = ((b.weight.grad - sum(gathered) / size).abs().max().item(),
                     b.weight.grad.abs().sum().item() > 0)
    with opt.skip_synchronize():
        opt.step()

    # gradients arriving in a different order on each rank: results stay exact (no crossed data)
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    torch.manual_seed(4)
    l1, l2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt = DistributedOptimizer(torch.optim.SGD(list(l1.parameters()) + list(l2.parameters()), lr=0.1))
    xin = torch.randn(3, 4) + rank
    if rank == 0:
        loss = l1(xin).sum() + 10 * l2(l1(xin).detach()).sum()
    else:
        loss = l2(xin).pow(2).sum() + l1(l2(xin).detach()).sum()
    loss.backward()
    own = [p.grad.clone() for p in list(l1.parameters()) + list(l2.parameters())]
    opt.synchronize()
    worst = 0.0
    for p, mine in zip(list(l1.parameters()) + list(l2.parameters()), own):
        allg = [torch.zeros_like(mine) for _ in range(size)]
        dist.all_gather(allg, mine)
        worst = max(worst, (p.grad - sum(allg) / size).abs().max().item())
    rep["order"] = worst
    del os.environ["HOROVOD_FUSION_THRESHOLD"]

    # load_state_dict: 2 steps, save, restore into a fresh optimizer, 2 more == 4 straight steps
    m = make()
    opt = DistributedOptimizer(adam(m.parameters(), 1.0), named_parameters=m.named_parameters())
    for i in range(2):
        opt.zero_grad()
        x, y = local(i)
        F.mse_loss(m(x), y).backward()
        opt.step()
    saved_opt = opt.state_dict()
    saved_model = {k: v.clone() for k, v in m.state_dict().items()}
    del opt
    m2 = make(seed=9)
    m2.load_state_dict(saved_model)
    opt2 = DistributedOptimizer(adam(m2.parameters(), 1.0), named_parameters=m2.named_parameters())
    opt2.load_state_dict(saved_opt)
    for i in range(2, 4):
        opt2.zero_grad()
        x, y = local(i)
        F.mse_loss(m2(x), y).backward()
        opt2.step()
    rep["load_state_dict"] = diff(list(m2.parameters()), ref_adam)

    # op=Adasum: every rank steps locally, deltas are combined with the Adasum rule
    from horovod_compat.common.ops import adasum_pair
    m = make()
    start = [p.detach().clone() for p in m.parameters()]
    ref_m = make()
    x, y = local(0)
    F.mse_loss(ref_m(x), y).backward()
    expected, averaged = [], []
    for s0, p in zip(start, ref_m.parameters()):
        grads = [torch.zeros_like(p.grad) for _ in range(size)]
        dist.all_gather(grads, p.grad)
        expected.append(s0 + adasum_pair(-0.1 * grads[0], -0.1 * grads[1]))
        averaged.append(s0 - 0.1 * (grads[0] + grads[1]) / 2)
    opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                               op=ops.Adasum)
    opt.zero_grad()
    F.mse_loss(m(x), y).backward()
    opt.step()
    rep["adasum"] = (diff(list(m.parameters()), expected), type(opt).__name__)
    # ...and differs from plain averaging (the rule really is applied)
    rep["adasum_vs_average"] = diff(expected, averaged)

    # ranks with different models: HorovodInternalError on every rank, naming the ranks, no hang
    bad = torch.nn.Linear(4, 3 + rank)
    try:
        opt = DistributedOptimizer(torch.optim.SGD(bad.parameters(), lr=0.1), named_parameters=bad.named_parameters())
        bad(torch.ones(1, 4)).sum().backward()
        opt.step()
        rep["mismatch"] = None
    except RuntimeError as e:
        rep["mismatch"] = (type(e).__name__, str(e))

    # timeline events for every reduced tensor, under its parameter name
    try:
        from horovod_compat.common import hooks
    except ImportError:
        hooks = None
    if hooks is not None:
        events = []
        listener = lambda ev, name, info: events.append((ev, name))
        hooks.subscribe(listener)
        try:
            m = make()
            opt = DistributedOptimizer(sgd(m.parameters(), 1.0), named_parameters=m.named_parameters())
            x, y = local(0)
            opt.zero_grad()
            F.mse_loss(m(x), y).backward()
            opt.step()
        finally:
            hooks.unsubscribe(listener)
        rep["timeline"] = sorted({(ev, name) for ev, name in events if name.endswith("weight")})

    # memory: one flat copy of the gradients at most (half of it with fp16)
    m = make()
    opt = DistributedOptimizer(sgd(m.parameters(), 1.0))
    pbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    rep["bucket_bytes"] = (sum(b.buffer.numel() * b.buffer.element_size() for b in opt._hvd_reducer.buckets),
                           pbytes)
    if Compression is not None:
        opt = DistributedOptimizer(sgd(make().parameters(), 1.0), compression=Compression.fp16)
        rep["bucket_bytes_fp16"] = sum(b.buffer.numel() * b.buffer.element_size()
                                       for b in opt._hvd_reducer.buckets)
    return rep


def _sparse_scenarios():
    """Sparse embedding gradients (allgather path and sparse_as_dense) vs DDP on a dense embedding."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    _init()
    from horovod_compat.torch.optimizer import DistributedOptimizer
    rank = dist.get_rank()
    rep = {}

    def make(sparse):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(20, 5, sparse=sparse), torch.nn.Linear(5, 1))

    batches = [torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(i)) for i in range(4)]

    def loss_of(m, i):
        return m(batches[i][rank]).pow(2).mean()

    m = make(False)
    d = DDP(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    for i in range(4):
        opt.zero_grad()
        loss_of(d, i).backward()
        opt.step()
    ref = [p.detach().clone() for p in m.parameters()]
    for dense in (False, True):
        m = make(True)
        opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5),
                                   named_parameters=m.named_parameters(), sparse_as_dense=dense)
        layouts = []
        for i in range(4):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.synchronize()
            layouts.append(m[0].weight.grad.is_sparse)
            with opt.skip_synchronize():
                opt.step()
        rep["dense" if dense else "sparse"] = (
            max((a - b).abs().max().item() for a, b in zip(m.parameters(), ref)), layouts[-1])
    return rep


def _validation_and_size1():
    """ValueErrors of the constructor (any size) and the plain behaviour at size 1."""
    import warnings
    import torch
    import torch.distributed as dist
    _init()
    from horovod_compat.common import ops
    from horovod_compat.torch.optimizer import DistributedOptimizer
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    p = list(m.parameters())
    errors = {}

    def expect(key, **kw):
        try:
            DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), **kw)
            errors[key] = None
        except ValueError as e:
            errors[key] = str(e)

    expect("not_tuples", named_parameters=[p[0], p[1]])
    expect("duplicates", named_parameters=[("w", p[0]), ("w", p[1]), ("a", p[2]), ("b", p[3])])
    expect("missing", named_parameters=list(m.named_parameters())[:2])
    expect("bpps", backward_passes_per_step=0)
    expect("predivide", op=ops.Sum, gradient_predivide_factor=2.0)
    expect("groups_zero", groups=0)
    expect("groups_type", groups="two")
    expect("groups_not_tensor", groups=[[p[0], 3]])
    expect("groups_twice", groups=[[p[0]], [p[0], p[1]]])
    expect("groups_foreign", groups=[[torch.nn.Parameter(torch.zeros(2))]])
    result = {"errors": errors, "size": dist.get_world_size()}
    if dist.get_world_size() == 1:
        opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                   backward_passes_per_step=1)
        ref = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
        ref.load_state_dict(m.state_dict())
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        x = torch.randn(4, 3)
        for _ in range(3):
            for model, o in ((m, opt), (ref, ropt)):
                o.zero_grad()
                model(x).sum().backward()
                model(x).sum().backward()  # two backwards per step: fine at size 1 (no hooks)
                o.step()
        result["size1"] = (opt._hvd_reducer is None,
                           max((a - b).abs().max().item() for a, b in zip(m.parameters(), ref.parameters())))
    return result


@pytest.fixture(scope="module")
def report():
    return run_function_warm(_scenarios, num_processes=2, return_all=True, timeout=120)


def test_is_dynamic_subclass_with_same_name(report):
    assert report[0]["class"] == ("SGD", True, True)


@pytest.mark.parametrize("key", ["sgd", "adam", "predivide", "direct_copy", "sum", "bpps2",
                                 "load_state_dict"])
def test_weights_equal_ddp(report, key):
    for r in report:
        assert r[key] < TOL, (key, r[key])


def test_gradients_as_bucket_views(report):
    for r in report:
        d, views = r["grad_views"]
        assert d < TOL and views
        d, views = r["no_grad_views"]
        assert d < TOL and not views


def test_fusion_threshold_env(report):
    for r in report:
        launched, n, all_in_flight = r["launched_in_backward"]
        assert n > 1 and launched == n and all_in_flight
        d, n = r["no_fusion"]
        assert d < TOL and n == 6  # HOROVOD_FUSION_THRESHOLD=0: one tensor per reduction
        d, n = r["small_fusion"]
        assert d < TOL and 1 < n < 6


def test_combined_options_and_custom_compressor(report):
    for r in report:
        assert r["combined"] < TOL
        if "combined_fp16" in r:
            assert r["combined_fp16"] < 2e-3
        d, calls, buckets = r["custom_compression"]
        assert d < TOL and calls == 4 * 6 and buckets == 6


def test_fp16_compression(report):
    if "fp16" not in report[0]:
        pytest.skip("Compression not available from the core yet")
    for r in report:
        assert r["fp16"] < 2e-3 and r["fp16_sgd"] < 2e-3
        assert r["fp16_buffer_dtypes"] == ["torch.float16"]


def test_groups(report):
    for r in report:
        d, together = r["groups_explicit"]
        assert d < TOL and together
        d, n = r["groups_int"]
        assert d < TOL and n == 3
        d, n, warned = r["num_groups"]
        assert d < TOL and n == 2 and warned


def test_synchronize_then_step_warns_and_skip_synchronize_does_not(report):
    for r in report:
        d, n_warnings = r["skip_sync"]
        assert d < TOL and n_warnings == 0
        assert len(r["step_after_sync_warning"]) == 1
        assert "optimizer.step() called without optimizer.skip_synchronize()" in r["step_after_sync_warning"][0]


def test_misuse_assertions(report):
    for r in report:
        assert r["zero_grad_pending"].startswith("optimizer.zero_grad() was called after loss.backward()")
        assert r["too_many_backwards"].startswith(
            "Gradients were computed more than backward_passes_per_step times before call to step()")


def test_unused_parameters_and_arrival_order(report):
    for r in report:
        worst, nonzero = r["unused"]
        assert worst < 1e-6 and nonzero
        assert r["order"] < 1e-6


def test_adasum_delta_optimizer(report):
    for r in report:
        d, name = r["adasum"]
        assert d < 1e-6 and name == "SGD"
        assert r["adasum_vs_average"] > 1e-4


def test_mismatched_models_raise_on_every_rank(report):
    for r in report:
        kind, msg = r["mismatch"]
        assert kind == "HorovodInternalError"
        assert msg == ("Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape "
                       "[3, 4], but another rank sent a tensor of shape [4, 4]. Parameter "
                       "'weight': rank 0 sent shape [3, 4]; rank 1 sent shape [4, 4]."), msg


def test_timeline_events_per_parameter(report):
    if "timeline" not in report[0]:
        pytest.skip("core hooks module not available")
    events = report[0]["timeline"]
    for ev in ("NEGOTIATE_START", "ALL_READY", "OP_START", "OP_END"):
        for name in ("0.weight", "2.weight", "4.weight"):
            assert (ev, name) in events


def test_memory_one_gradient_copy(report):
    for r in report:
        used, params = r["bucket_bytes"]
        assert used == params
        if "bucket_bytes_fp16" in r:
            assert r["bucket_bytes_fp16"] * 2 == params


def test_sparse_gradients():
    rep = run_function_warm(_sparse_scenarios, num_processes=2, return_all=True, timeout=120)
    for r in rep:
        d, is_sparse = r["sparse"]
        assert d < TOL and is_sparse
        # sparse_as_dense reduces dense, then hands the optimizer a sparse gradient again, as
        # Horovod does (SparseAdam accepts nothing else)
        d, is_sparse = r["dense"]
        assert d < TOL and is_sparse


EXPECTED_ERRORS = {
    "not_tuples": "named_parameters should be a sequence of tuples (name, parameter)",
    "duplicates": "Parameter names in named_parameters must be unique. Found duplicates: w",
    "missing": "named_parameters was specified, but one or more model parameters were not named",
    "bpps": "backward_passes_per_step must be > 0",
    "predivide": "gradient_predivide_factor not supported with op != Average",
    "groups_zero": "groups should be a non-negative integer or a list of list of torch.Tensor.",
    "groups_type": "groups should be a non-negative integer or a list of list of torch.Tensor.",
    "groups_not_tensor": "groups must consist of torch.Tensor.",
    "groups_twice": "A parameter can only appear once in groups.",
    "groups_foreign": "groups contains a tensor that is not a parameter of the optimizer.",
}


def test_validation_errors_and_size_one():
    for nproc in (1,):
        r = run_function_warm(_validation_and_size1, num_processes=nproc, timeout=120)
        for key, text in EXPECTED_ERRORS.items():
            assert r["errors"][key] is not None and r["errors"][key].startswith(text), (key, r["errors"][key])
        plain, d = r["size1"]
        assert plain and d < 1e-7


def _process_set_scenarios():
    """Explicit process_set= arguments (the global set, passed by the caller)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    import horovod_compat.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    ps = hvd.global_process_set
    from horovod_compat.torch.functions import allgather_object, broadcast_parameters
    from horovod_compat.torch.optimizer import DistributedOptimizer
    rank = hvd.rank()

    def make():
        torch.manual_seed(11 + rank)
        return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    xs = [torch.randn(3, 5, generator=torch.Generator().manual_seed(i * 2 + rank)) for i in range(3)]
    ref = make()
    broadcast_parameters(ref.state_dict(), root_rank=0, process_set=ps)
    m = make()
    broadcast_parameters(m.state_dict(), root_rank=0, process_set=ps)
    d = DDP(ref)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                               process_set=ps)
    for x in xs:
        for net, o in ((d, ropt), (m, opt)):
            o.zero_grad()
            net(x).pow(2).mean().backward()
            o.step()
    return {"diff": max((a - b).abs().max().item() for a, b in zip(m.parameters(), ref.parameters())),
            "objects": allgather_object(rank * 10, process_set=ps)}


def test_explicit_process_set_argument():
    reps = run_function_warm(_process_set_scenarios, num_processes=2, return_all=True, timeout=120)
    for r in reps:
        assert r["diff"] < TOL
        assert r["objects"] == [0, 10]
