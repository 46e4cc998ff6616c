"""Collectives of horovod_compat.torch on 2 real ranks.

Each launch runs many checks inside the ranks (every dtype x op, every variant) and returns a report
of (check name, ok, detail); the outer test asserts that the report is complete and has no failure.
Inputs are deterministic per rank, so each rank computes the exact expected value independently.
Both data transports run every check: shared memory (the default when the ranks share a host) and
gloo (``HOROVOD_COMPAT_SHM_DATA=0``, what ranks on several hosts use).
"""
from __future__ import annotations

import pytest

from warm import run_function_warm


DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


class _Report:
    def __init__(self):
        self.rows = []

    def check(self, name, ok, detail=""):
        self.rows.append((name, bool(ok), "" if ok else str(detail)))

    def equal(self, name, got, want):
        import torch
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape \
            and torch.equal(got, want)
        self.check(name, ok, f"got {got!r}, want {want!r}")

    def close(self, name, got, want, tol=1e-3):
        import torch
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape \
            and torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)
        self.check(name, ok, f"got {got!r}, want {want!r}")

    def raises(self, name, exc_type, fn, match=""):
        try:
            fn()
        except exc_type as e:
            self.check(name, match in str(e), f"message {e!r} lacks {match!r}")
            return
        except Exception as e:  # wrong type
            self.check(name, False, f"raised {type(e).__name__}: {e}")
            return
        self.check(name, False, "did not raise")


def _dtype_op_matrix():
    import torch
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rep = _Report()
    ops = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max,
           "Product": hvd.Product}
    for dn in DTYPES:
        dt = getattr(torch, dn)
        base = [torch.tensor([3, 4, 1, 2]), torch.tensor([6, 8, 2, 1])]
        mine, other = base[r].to(dt), base[1 - r].to(dt)
        for on, op in ops.items():
            a, b = mine.double(), other.double()
            if on == "Average":
                want = (a + b) / 2
                want = want.trunc() if not dt.is_floating_point else want
            elif on == "Sum":
                want = a + b
            elif on == "Min":
                want = torch.minimum(a, b)
            elif on == "Max":
                want = torch.maximum(a, b)
            else:
                want = a * b
            want = want.to(dt)
            rep.equal(f"allreduce {dn} {on}", hvd.allreduce(mine, op=op), want)
            t = mine.clone()
            out = hvd.allreduce_(t, op=op, name=f"ip.{dn}.{on}")
            rep.equal(f"allreduce_ {dn} {on}", t, want)
            rep.check(f"allreduce_ returns its input {dn} {on}", out is t)
            h = hvd.allreduce_async(mine, op=op, name=f"as.{dn}.{on}")
            rep.equal(f"allreduce_async {dn} {on}", hvd.synchronize(h), want)
            t2 = mine.clone()
            h = hvd.allreduce_async_(t2, op=op)
            hvd.synchronize(h)
            rep.equal(f"allreduce_async_ {dn} {on}", t2, want)
            if on == "Sum":
                outs = hvd.grouped_allreduce([mine, mine * 0 + 1], op=op, name="grp")
                rep.equal(f"grouped_allreduce {dn}", outs[0], want)
                rep.equal(f"grouped_allreduce[1] {dn}", outs[1], (mine * 0 + 2).to(dt))
        # allgather with different first dimensions (rank r sends r+1 rows)
        g = hvd.allgather(torch.full((r + 1, 2), r + 1).to(dt))
        rep.equal(f"allgather {dn}", g, torch.tensor([[1, 1], [2, 2], [2, 2]]).to(dt))
        # broadcast from root 1, out of place and in place
        src = (torch.arange(3) + 10 * r).to(dt)
        rep.equal(f"broadcast {dn}", hvd.broadcast(src, 1), (torch.arange(3) + 10).to(dt))
        rep.equal(f"broadcast keeps input {dn}", src, (torch.arange(3) + 10 * r).to(dt))
        t = src.clone()
        hvd.broadcast_(t, root_rank=0)
        rep.equal(f"broadcast_ {dn}", t, torch.arange(3).to(dt))
        # alltoall with splits
        x = (torch.arange(3) + 10 * r).to(dt)
        splits = [1, 2] if r == 0 else [2, 1]
        out, recv = hvd.alltoall(x, splits=splits)
        want = torch.tensor([0, 10, 11]) if r == 0 else torch.tensor([1, 2, 12])
        rep.equal(f"alltoall {dn}", out, want.to(dt))
        rep.check(f"alltoall received_splits {dn}", recv.tolist() == ([1, 2] if r == 0 else [2, 1]),
                  recv)
        # reducescatter Sum: 5 rows -> rank 0 gets 3, rank 1 gets 2
        if dt != torch.uint8 or True:
            rs = hvd.reducescatter(torch.arange(5).to(dt), op=hvd.Sum)
            rep.equal(f"reducescatter {dn}", rs, (torch.arange(5) * 2)[:3].to(dt) if r == 0
                      else (torch.arange(5) * 2)[3:].to(dt))
    hvd.shutdown()
    return rep.rows


TRANSPORTS = pytest.mark.parametrize("shm_data", ["1", "0"], ids=["shm", "gloo"])


@TRANSPORTS
def test_every_dtype_and_op_on_two_ranks(shm_data):
    reports = run_function_warm(_dtype_op_matrix, num_processes=2, return_all=True, timeout=180,
                           env={"HOROVOD_COMPAT_SHM_DATA": shm_data})
    for rows in reports:
        failures = [r for r in rows if not r[1]]
        assert not failures, failures[:10]
        # 8 dtypes x 5 ops x 5 checks + grouped + 6 other collectives per dtype
        assert len(rows) >= len(DTYPES) * (5 * 5 + 2 + 7)


def _n(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _semantics():
    import warnings
    import torch
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rep = _Report()
    rep.check("op codes", (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product)
              == (0, 1, 2, 3, 4, 5))
    x = torch.tensor([3.0, 4.0]) if r == 0 else torch.tensor([6.0, 8.0])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = hvd.allreduce(x, average=False)
    rep.equal("average=False is Sum", s, torch.tensor([9.0, 12.0]))
    rep.check("average= warns DeprecationWarning", any(issubclass(i.category, DeprecationWarning)
                                                        for i in w), [str(i.message) for i in w])
    rep.raises("average and op -> ValueError", ValueError,
               lambda: hvd.allreduce(x, average=True, op=hvd.Sum))
    rep.equal("integer Average truncates", hvd.allreduce(x.long()), torch.tensor([4, 6]))
    rep.close("prescale/postscale", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                                  postscale_factor=0.5), torch.tensor([9.0, 12.0]))
    rep.close("prescale Average", hvd.allreduce(x, prescale_factor=3.0), torch.tensor([13.5, 18.0]))
    c = hvd.allreduce(x, compression=hvd.Compression.fp16)
    rep.close("fp16 compression keeps dtype", c, torch.tensor([4.5, 6.0]))
    # grouped names: <name>_{i}of{n} reach the hooks
    seen = []
    hvd.hooks.subscribe(lambda ev, name, info: seen.append((ev, name, info)))
    hvd.grouped_allreduce([x, x], name="grp")
    hvd.allreduce(x, name="hooked")
    hvd.hooks._listeners.clear()
    hvd.hooks.active = False
    evs = [e for e, nm, _ in seen if nm == "hooked"]
    rep.check("hooks: events of one op", set(evs) == {"NEGOTIATE_START", "ALL_READY", "OP_START", "OP_END"}, evs)
    start = [i for e, nm, i in seen if nm == "hooked" and e == "OP_START"]
    rep.check("hooks: OP_START has dtype and shape", start and start[0]["dtype"] == "float32"
              and tuple(start[0]["shape"]) == (2,), start)
    rep.check("grouped names", any(nm == "grp" and i.get("tensor_names") == ["grp_0of2", "grp_1of2"]
                                   for e, nm, i in seen if e == "OP_START"), seen[:3])
    # async: poll is False right after submission of a real op, True after synchronize
    big = torch.ones(4 << 20)
    h = hvd.allreduce_async(big, name="big")
    first = hvd.poll(h)
    out = hvd.synchronize(h)
    rep.check("poll False right after submit", first is False, first)
    rep.close("big async result", out[:4], torch.ones(4))
    rep.raises("synchronize twice -> ValueError", ValueError, lambda: hvd.synchronize(h))
    # duplicate in-flight name
    h1 = hvd.allreduce_async(x, name="dup")
    rep.raises("duplicate in-flight name -> ValueError", ValueError,
               lambda: hvd.allreduce_async(x, name="dup"), "same name")
    hvd.synchronize(h1)
    # autograd
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    (hvd.allreduce(t, op=hvd.Sum) * torch.tensor([1.0, 3.0])).sum().backward()
    rep.close("allreduce grad = allreduce(grad, Sum)", t.grad, torch.tensor([2.0, 6.0]))
    t = torch.ones(r + 1, 2, requires_grad=True)
    g = hvd.allgather(t)
    (g * torch.arange(3.0).view(3, 1)).sum().backward()
    want = torch.zeros(1, 2) if r == 0 else torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    rep.close("allgather grad = own rows of averaged grad", t.grad, want)
    t = torch.ones(2, requires_grad=True)
    (hvd.broadcast(t, root_rank=1) * (r + 1)).sum().backward()
    rep.close("broadcast grad: averaged on root, zero elsewhere", t.grad,
              torch.full((2,), 1.5) if r == 1 else torch.zeros(2))
    # Horovod's reducescatter gradient: allgather of the output gradients, times size for Sum and
    # times the scale factors
    t = torch.ones(4, requires_grad=True)
    (hvd.reducescatter(t, op=hvd.Sum) * 1.0).sum().backward()
    rep.close("reducescatter grad (Sum)", t.grad, torch.full((4,), 2.0))
    t = torch.ones(4, requires_grad=True)
    (hvd.reducescatter(t, op=hvd.Average, postscale_factor=3.0) * (r + 1)).sum().backward()
    rep.close("reducescatter grad (Average, postscale)", t.grad, torch.tensor([3.0, 3.0, 6.0, 6.0]))
    ts = [torch.ones(4, requires_grad=True), torch.ones(2, 3, requires_grad=True)]
    sum(o.sum() for o in hvd.grouped_reducescatter(ts, op=hvd.Sum)).backward()
    rep.close("grouped reducescatter grad", torch.cat([ts[0].grad, ts[1].grad.flatten()]),
              torch.full((10,), 2.0))
    ts = [torch.full((r + 1, 2), 1.0, requires_grad=True), torch.ones(3, requires_grad=True)]
    outs = hvd.grouped_allgather(ts)
    (outs[0].sum() * (r + 1) + outs[1].sum()).backward()
    rep.close("grouped allgather grad (averaged, own rows)",
              torch.cat([ts[0].grad.flatten(), ts[1].grad]),
              torch.full((2 * (r + 1) + 3,), 1.0) * torch.tensor([1.5] * 2 * (r + 1) + [1.0] * 3))
    # grouped allgather mixing dtypes, uneven, empty and 0-d tensors: packed into one byte buffer
    # per rank, and tensor by tensor when the group is above FUSED_ALLGATHER_BYTES: both give every
    # rank's tensors concatenated, in their dtypes
    from horovod_compat.common import collectives as coll

    def mixed(k):
        return [torch.arange(3 * (k + 1), dtype=torch.float64).reshape(k + 1, 3) + k,
                torch.full((2 - k, 2), -k - 1, dtype=torch.int16),
                torch.tensor([k % 2 == 0] * (k + 2)),
                torch.zeros(0, 4) if k == 0 else torch.ones(1, 4),
                torch.tensor(k + 0.5, dtype=torch.bfloat16),
                torch.full((1,), 200 + k, dtype=torch.uint8)]
    want = [torch.cat([t0.reshape(-1) if t0.dim() == 0 else t0, t1.reshape(-1) if t1.dim() == 0 else t1])
            for t0, t1 in zip(mixed(0), mixed(1))]
    for label, limit in (("packed", coll.FUSED_ALLGATHER_BYTES), ("tensor by tensor", 0)):
        coll.FUSED_ALLGATHER_BYTES, saved = limit, coll.FUSED_ALLGATHER_BYTES
        try:
            got = hvd.grouped_allgather(mixed(r), name=f"mixed.gather.{limit}")
        finally:
            coll.FUSED_ALLGATHER_BYTES = saved
        for i, (g, w) in enumerate(zip(got, want)):
            rep.equal(f"grouped allgather mixed, {label} [{i}]", g, w)
    # grouped allreduce mixing dtypes and sizes: the small tensors of each dtype travel fused, the
    # 2 MB one alone; results land in the right tensors, in and out of place
    shapes = [(3,), (5, 2), (0,), (1 << 19,), (7,), (4,)]
    dts = [torch.float32, torch.float32, torch.float32, torch.float32, torch.int16, torch.float64]
    mk = [lambda k, s=s, dt=dt: (torch.arange(_n(s)).reshape(s) % 7 + k).to(dt)
          for s, dt in zip(shapes, dts)]
    for op, on in ((hvd.Sum, "Sum"), (hvd.Average, "Average")):
        want = [f(0) + f(1) if on == "Sum" else
                ((f(0) + f(1)) / 2 if f(0).is_floating_point() else (f(0) + f(1)) // 2)
                for f in mk]
        got = hvd.grouped_allreduce([f(r) for f in mk], op=op, name=f"mixed.{on}")
        rep.check(f"grouped mixed {on}", all(g.dtype == w.dtype and torch.equal(g, w)
                                             for g, w in zip(got, want)), got)
        mine = [f(r) for f in mk]
        hvd.grouped_allreduce_(mine, op=op, name=f"mixed.{on}.inplace")
        rep.check(f"grouped mixed {on} in place", all(torch.equal(g, w) for g, w in zip(mine, want)),
                  mine)
    # alltoall without splits, ranks with different first dimensions (2 and 4 rows): the gradient
    # goes back along the rows each rank received
    t = (torch.arange(2.0 * (r + 1)) + 10 * r).requires_grad_()
    out = hvd.alltoall(t)
    (out * out).sum().backward()
    rep.close("alltoall even-split grad", t.grad, 2 * t.detach())
    rep.check("alltoall even-split grad returns a tensor, not a tuple", isinstance(out, torch.Tensor),
              type(out))
    # reducescatter restrictions
    rep.raises("reducescatter scalar -> ValueError", ValueError,
               lambda: hvd.reducescatter(torch.tensor(1.0)))
    for op_name in ("Max", "Adasum"):
        rep.raises(f"reducescatter {op_name} -> HorovodInternalError", hvd.HorovodInternalError,
                   lambda: hvd.reducescatter(torch.ones(2), op=getattr(hvd, op_name)))
    rs = hvd.reducescatter(torch.arange(4.0) * (r + 1))
    rep.close("reducescatter Average", rs, torch.tensor([0.0, 1.5]) if r == 0 else torch.tensor([3.0, 4.5]))
    gr = hvd.grouped_reducescatter([torch.ones(2), torch.ones(4)], op=hvd.Sum)
    rep.close("grouped_reducescatter", gr[1], torch.full((2,), 2.0))
    h = hvd.reducescatter_async(torch.ones(2), op=hvd.Sum)
    rep.close("reducescatter_async", hvd.synchronize(h), torch.full((1,), 2.0))
    # grouped allgather / async variants
    ga = hvd.grouped_allgather([torch.full((1,), float(r)), torch.full((r + 1, 1), 5.0)])
    rep.close("grouped_allgather", ga[0], torch.tensor([0.0, 1.0]))
    rep.check("grouped_allgather[1] rows", ga[1].shape == (3, 1), ga[1].shape)
    h = hvd.allgather_async(torch.full((1,), float(r)))
    rep.close("allgather_async", hvd.synchronize(h), torch.tensor([0.0, 1.0]))
    h = hvd.broadcast_async(torch.full((1,), float(r)), 1)
    rep.close("broadcast_async", hvd.synchronize(h), torch.tensor([1.0]))
    t = torch.full((1,), float(r))
    hvd.synchronize(hvd.broadcast_async_(t, 1))
    rep.close("broadcast_async_", t, torch.tensor([1.0]))
    h = hvd.grouped_allreduce_async([x], op=hvd.Sum)
    rep.close("grouped_allreduce_async", hvd.synchronize(h)[0], torch.tensor([9.0, 12.0]))
    ts = [x.clone()]
    hvd.grouped_allreduce_(ts, op=hvd.Sum)
    rep.close("grouped_allreduce_", ts[0], torch.tensor([9.0, 12.0]))
    h = hvd.alltoall_async(torch.arange(2.0) + 2 * r)
    out, received = hvd.synchronize(h)  # Horovod: (output, received_splits), splits or not
    rep.close("alltoall default splits", out,
              torch.tensor([0.0, 2.0]) if r == 0 else torch.tensor([1.0, 3.0]))
    rep.equal("alltoall default received splits", received, torch.tensor([1, 1], dtype=torch.int32))
    # edge cases: scalars, empty tensors, empty groups, non-contiguous in-place, bool
    rep.close("scalar allreduce", hvd.allreduce(torch.tensor(float(r + 1))), torch.tensor(1.5))
    rep.equal("empty allreduce", hvd.allreduce(torch.ones(0)), torch.ones(0))
    rep.check("empty grouped lists", hvd.grouped_allreduce([]) == [] and hvd.grouped_allgather([]) == []
              and hvd.synchronize(hvd.grouped_allreduce_async([])) == [])
    rep.equal("allgather with an empty rank", hvd.allgather(torch.ones(r, 2)), torch.ones(1, 2))
    nc = torch.arange(6.0).view(2, 3).t()
    hvd.allreduce_(nc, op=hvd.Sum)
    rep.equal("non-contiguous in place", nc, (torch.arange(6.0).view(2, 3).t() * 2))
    rep.equal("bool Max", hvd.allreduce(torch.tensor([r == 0, False]), op=hvd.Max),
              torch.tensor([True, False]))
    # alltoall argument errors (Horovod: ValueError)
    rep.raises("alltoall default split needs a multiple of size", ValueError,
               lambda: hvd.alltoall(torch.ones(3)))
    rep.raises("alltoall splits must be integers", ValueError,
               lambda: hvd.alltoall(torch.ones(2), torch.ones(2)))
    rep.raises("alltoall splits must sum to dim 0", ValueError,
               lambda: hvd.alltoall(torch.ones(1), torch.tensor([1, 1], dtype=torch.int32)))
    # prescale on integers is done in float64 then truncated; on float16 in float32
    xi = torch.tensor([7, -7, 100])
    rep.equal("int prescale", hvd.allreduce(xi, op=hvd.Sum, prescale_factor=0.3),
              (xi.double() * 0.3).long() * 2)
    xh = torch.tensor([1.1, 2.2], dtype=torch.float16)
    rep.equal("half postscale", hvd.allreduce(xh, op=hvd.Sum, postscale_factor=0.7),
              ((xh.float() * 2).half().float() * 0.7).half())
    # sparse
    sp = torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([1.0 + r]), (3,))
    h = hvd.sparse_allreduce_async(sp, name="sp", op=hvd.Sum)
    rep.close("sparse_allreduce_async", hvd.synchronize(h).to_dense(), torch.tensor([1.0, 2.0, 0.0]))
    # Horovod's own contract: the handle is a function that waits for the result
    h = hvd.sparse_allreduce_async(sp, name="sp", op=hvd.Average)
    rep.close("sparse_allreduce_async handle()", h().to_dense(), torch.tensor([0.5, 1.0, 0.0]))
    # Adasum: orthogonal gradients add up; identical ones stay as they are
    a = torch.tensor([1.0, 0.0]) if r == 0 else torch.tensor([0.0, 1.0])
    rep.close("Adasum orthogonal", hvd.allreduce(a, op=hvd.Adasum), torch.tensor([1.0, 1.0]))
    rep.close("Adasum parallel", hvd.allreduce(torch.tensor([2.0, 2.0]), op=hvd.Adasum),
              torch.tensor([2.0, 2.0]))
    # large outputs are recycled only once the caller dropped them (output pool)
    big = torch.full((2 << 20,), float(r + 1))
    a = hvd.allreduce(big, op=hvd.Sum)
    pa = a.data_ptr()
    b = hvd.allreduce(big * 2, op=hvd.Sum)
    rep.check("pool: held output not reused", b.data_ptr() != pa and a[0].item() == 3.0
              and a[-1].item() == 3.0, (a[0], b[0]))
    view = b[:4]
    del a, b
    c = hvd.allreduce(big * 3, op=hvd.Sum)
    rep.check("pool: dropped output reused", c.data_ptr() == pa and c[0].item() == 9.0, c[0])
    rep.check("pool: a live view keeps its buffer", view.tolist() == [6.0] * 4, view)
    # barrier + join
    hvd.barrier()
    if r == 0:
        last = hvd.join()
        rep.check("join returns last rank", last == 1, last)
    else:
        rep.raises("allgather while a rank joined -> HorovodInternalError", hvd.HorovodInternalError,
                   lambda: hvd.allgather(torch.ones(2)), "join")
        rep.raises("broadcast while a rank joined -> HorovodInternalError", hvd.HorovodInternalError,
                   lambda: hvd.broadcast(torch.ones(2), 1), "join")
        z = hvd.allreduce(torch.tensor([4.0, 8.0]), name="after-join")
        rep.close("joined rank contributes zeros, Average divides by size", z,
                  torch.tensor([2.0, 4.0]))
        z = hvd.allreduce(torch.tensor([4.0]), op=hvd.Sum)
        rep.close("second op while joined", z, torch.tensor([4.0]))
        last = hvd.join()
        rep.check("join returns last rank", last == 1, last)
    rep.close("works after join", hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.tensor([2.0]))
    hvd.shutdown()
    return rep.rows


@TRANSPORTS
def test_semantics_async_autograd_join_on_two_ranks(shm_data):
    reports = run_function_warm(_semantics, num_processes=2, return_all=True, timeout=180,
                           env={"HOROVOD_COMPAT_SHM_DATA": shm_data})
    for rows in reports:
        failures = [r for r in rows if not r[1]]
        assert not failures, failures
        assert len(rows) >= 57
