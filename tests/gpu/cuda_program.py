"""What ``tests/gpu/test_cuda.py`` runs: ``horovod.torch`` with CUDA tensors, one scenario per call.

    python tests/gpu/cuda_program.py api|train|mixed|same_gpu|same_gpu_raise

``api`` and ``train`` are meant for a 1-rank job (started directly: ``hvd.init()`` makes a size-1
job whose CUDA tensors still go through a real NCCL communicator, so every NCCL code path of the
runtime runs). ``same_gpu`` and ``same_gpu_raise`` are meant for ``horovodrun -np 2`` on a machine
with ONE GPU: both ranks put their tensors on ``cuda:0``, which NCCL refuses; they record what our
runtime makes of that (``same_gpu`` catches the error and reports it, ``same_gpu_raise`` lets it end
the rank, to show what the launcher tells the user). ``mixed`` (2 ranks, any number of GPUs) makes
device errors -- ranks on different devices, one grouped op on two -- that must fail only their op.

Every check prints one line, ``CHECK <name> ok <ms>`` or ``CHECK <name> FAIL <error>``, and
``same_gpu`` prints ``OUTCOME ...`` lines; the test file parses them. One failed check does not stop
the others (each is independent), so one run on a lent GPU says everything at once. The program
exits 1 when a check failed.

``HOROVOD_COMPAT_GPU_CHECK_ON_CPU=1`` runs the same checks on CPU tensors: not a GPU check, only a
way to verify the program's own expectations on a machine without a GPU before spending GPU time.
"""
from __future__ import annotations

import copy
import os
import sys
import time
import traceback

import torch

import horovod.torch as hvd

failures = 0
#: Where the checked tensors live: the GPU, or the CPU for a dry run of the program itself.
ON_CPU = os.environ.get("HOROVOD_COMPAT_GPU_CHECK_ON_CPU") == "1"
DEV_TYPE = "cpu" if ON_CPU else "cuda"


def check(name):
    """Run the decorated function now as check ``name`` and print its outcome line."""
    def run(fn):
        global failures
        started = time.perf_counter()
        try:
            note = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the run
            failures += 1
            text = f"{type(exc).__name__}: {exc}".replace("\n", " | ")[:600]
            print(f"CHECK {name} FAIL {text}", flush=True)
            traceback.print_exc(limit=6)
            return fn
        ms = (time.perf_counter() - started) * 1000
        print(f"CHECK {name} ok {ms:.1f}" + (f" {note}" if note else ""), flush=True)
        return fn
    return run


def same(a, b, what, atol=0.0, rtol=0.0):
    """``a`` equals ``b`` (both moved to the CPU, in float64 unless integral or bool)."""
    if a.device.type != DEV_TYPE:
        raise AssertionError(f"{what}: result is on {a.device}, not on the GPU")
    x, y = a.detach().cpu(), b.detach().cpu()
    if x.shape != y.shape or x.dtype != y.dtype:
        raise AssertionError(f"{what}: got {x.dtype}{tuple(x.shape)}, expected {y.dtype}{tuple(y.shape)}")
    if x.is_floating_point():
        ok = torch.allclose(x.double(), y.double(), atol=atol, rtol=rtol)
    else:
        ok = torch.equal(x, y)
    if not ok:
        raise AssertionError(f"{what}: values differ (max |diff| "
                             f"{(x.double() - y.double()).abs().max().item():.3g})")


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8, torch.int16]


def sample(dtype, shape=(5, 7), dev=None):
    """Small whole numbers in ``dtype`` (exact in every dtype, also after a sum over ranks)."""
    g = torch.Generator().manual_seed(7)
    t = torch.randint(0, 6, shape, generator=g).to(dtype)
    return t.to(dev or device())


def device():
    return torch.device("cpu") if ON_CPU else torch.device("cuda", torch.cuda.current_device())


def sync():
    """Wait for the GPU's queued work (timings, results read on the host)."""
    if not ON_CPU:
        torch.cuda.synchronize()


def set_device(index):
    if not ON_CPU:
        torch.cuda.set_device(index)


# ----------------------------------------------------------------------------------------- api

def scenario_api() -> None:
    hvd.init()
    set_device(hvd.local_rank())
    n = hvd.size()
    print(f"INFO size={n} nccl_built={hvd.nccl_built()} cuda_built={hvd.cuda_built()} "
          f"gpu={'none (dry run on CPU)' if ON_CPU else torch.cuda.get_device_name()} torch={torch.__version__}", flush=True)

    @check("nccl_built")
    def _():
        if ON_CPU:
            return "not checked (dry run on CPU)"
        v = hvd.nccl_built()
        assert isinstance(v, int) and v > 20000, f"nccl_built() = {v!r}"
        assert hvd.cuda_built() is True
        return f"version={v}"

    for dtype in DTYPES:
        @check(f"allreduce_sum[{str(dtype)[6:]}]")
        def _():
            t = sample(dtype)
            same(hvd.allreduce(t, op=hvd.Sum), t * n, "sum")
            assert t.dtype == dtype

        @check(f"allreduce_average[{str(dtype)[6:]}]")
        def _():
            t = sample(dtype)
            same(hvd.allreduce(t), t, "average")

    for op, name in ((hvd.Min, "min"), (hvd.Max, "max"), (hvd.Product, "product")):
        for dtype in (torch.float32, torch.int32, torch.float16):
            @check(f"allreduce_{name}[{str(dtype)[6:]}]")
            def _():
                t = sample(dtype)
                # every rank holds the same numbers: min = max = t, product = t ** n
                same(hvd.allreduce(t, op=op), t ** n if op == hvd.Product else t, name)

    @check("allreduce_prescale_postscale[float16]")
    def _():
        t = sample(torch.float16)
        same(hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0), t * (2.0 * n),
             "scaled", atol=1e-2)

    @check("allreduce_scale_factor_rounding[float16]")
    def _():
        # Horovod scales a half tensor on a GPU in half precision, the factor rounded to half
        # first, and on CPU in float32; upstream's prescale / postscale tests compare exactly
        t = (sample(torch.float32) * 1.37).half()
        f = 0.3

        def scaled(x):
            if ON_CPU:
                return (x.float() * f).half()
            return x * torch.tensor(f, dtype=torch.float16, device=x.device)

        same(hvd.allreduce(t, op=hvd.Sum, prescale_factor=f), scaled(t) * n, "prescale 0.3")
        same(hvd.allreduce(t, op=hvd.Sum, postscale_factor=f), scaled(t * n), "postscale 0.3")
        same(hvd.reducescatter(t, op=hvd.Sum, prescale_factor=f),
             (scaled(t) * n).chunk(n)[hvd.rank()] if n > 1 else scaled(t), "reducescatter prescale 0.3")

    @check("allreduce_noncontiguous")
    def _():
        t = sample(torch.float32, (6, 8)).t()
        same(hvd.allreduce(t, op=hvd.Sum), t * n, "transposed input")

    @check("allreduce_inplace")
    def _():
        t = sample(torch.float32)
        want = t * n
        out = hvd.allreduce_(t, op=hvd.Sum)
        assert out is t, "allreduce_ returned another tensor"
        same(t, want, "in place")

    @check("allreduce_async_poll_synchronize")
    def _():
        ts = [sample(torch.float32) + i for i in range(4)]
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name=f"async.{i}") for i, t in enumerate(ts)]
        deadline = time.monotonic() + 30
        while not all(hvd.poll(h) for h in handles):
            assert time.monotonic() < deadline, "poll() never became true"
            time.sleep(0.001)
        for h, t in zip(handles, ts):
            same(hvd.synchronize(h), t * n, "async")
        h = hvd.allreduce_async_(ts[0], op=hvd.Sum)
        hvd.synchronize(h)

    @check("allreduce_large_timing")
    def _():
        t = torch.ones(64 << 20, dtype=torch.float32, device=device())  # 256 MB
        hvd.allreduce_(t, op=hvd.Sum, name="warm")
        sync()
        rounds = 10
        started = time.perf_counter()
        for i in range(rounds):
            hvd.allreduce_(t, op=hvd.Average, name="timed")
        sync()
        seconds = (time.perf_counter() - started) / rounds
        same(t[:16], torch.full((16,), float(n), device=device()), "256 MB allreduce")
        return f"256MB_allreduce_ms={seconds * 1000:.2f}"

    @check("allreduce_small_latency")
    def _():
        t = torch.ones(256, device=device())
        for _ in range(20):
            hvd.allreduce(t)
        sync()
        started = time.perf_counter()
        for _ in range(200):
            hvd.allreduce(t)
        sync()
        return f"1KB_allreduce_us={(time.perf_counter() - started) / 200 * 1e6:.0f}"

    @check("grouped_allreduce_fused_and_large")
    def _():
        ts = [sample(torch.float32, (3, 3)) + i for i in range(20)] + [sample(torch.float16, (4,))]
        ts.append(torch.ones(1 << 19, device=device()))  # 2 MB: travels alone
        outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
        for o, t in zip(outs, ts):
            same(o, t * n, "grouped")

    @check("grouped_allreduce_inplace_and_async")
    def _():
        ts = [sample(torch.float64) + i for i in range(5)]
        want = [t * n for t in ts]
        hvd.grouped_allreduce_(ts, op=hvd.Sum)
        for t, w in zip(ts, want):
            same(t, w, "grouped in place")
        h = hvd.grouped_allreduce_async(ts, op=hvd.Average)
        for o, t in zip(hvd.synchronize(h), ts):
            same(o, t, "grouped async")

    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8, torch.int16):
        @check(f"allgather[{str(dtype)[6:]}]")
        def _():
            t = sample(dtype, (3, 4))
            same(hvd.allgather(t), torch.cat([t] * n), "allgather")

    @check("grouped_allgather")
    def _():
        ts = [sample(torch.float32, (2, 3)), sample(torch.int32, (4,))]
        for o, t in zip(hvd.grouped_allgather(ts), ts):
            same(o, torch.cat([t] * n), "grouped allgather")

    for dtype in (torch.float32, torch.float16, torch.int16, torch.bool):
        @check(f"broadcast[{str(dtype)[6:]}]")
        def _():
            t = sample(dtype)
            same(hvd.broadcast(t, root_rank=0), t, "broadcast")
            u = t.clone()
            assert hvd.broadcast_(u, root_rank=0) is u
            same(u, t, "broadcast_")

    @check("broadcast_async")
    def _():
        t = sample(torch.float32)
        same(hvd.synchronize(hvd.broadcast_async(t, 0)), t, "broadcast_async")
        u = t.clone()
        hvd.synchronize(hvd.broadcast_async_(u, 0))
        same(u, t, "broadcast_async_")

    @check("alltoall")
    def _():
        t = sample(torch.float32, (4 * n, 3))
        r = hvd.rank()
        same(hvd.alltoall(t), torch.cat([t[4 * r:4 * r + 4]] * n), "alltoall")
        # every rank sends all its rows to rank 0
        out, received = hvd.alltoall(t, splits=torch.tensor([4 * n] + [0] * (n - 1)))
        want = [4 * n] * n if hvd.rank() == 0 else [0] * n
        assert received.tolist() == want, (received, want)
        assert received.device.type == "cpu", f"received splits on {received.device}, splits on the CPU"
        same(out, torch.cat([t] * n) if hvd.rank() == 0 else t[:0], "alltoall with splits")
        # received splits come on the splits' device (Horovod: ``splits.new()``)
        _, received = hvd.alltoall(t, splits=torch.tensor([4] * n, dtype=torch.int32, device=device()))
        assert received.device.type == DEV_TYPE, f"received splits on {received.device}, splits on {DEV_TYPE}"
        assert received.tolist() == [4] * n, received

    @check("alltoall_async")
    def _():
        t = sample(torch.int64, (2 * n, 2))
        out, received = hvd.synchronize(hvd.alltoall_async(t))  # Horovod's pair, splits or not
        same(out, torch.cat([t[2 * hvd.rank():2 * hvd.rank() + 2]] * n), "alltoall_async")
        assert received.tolist() == [2] * n, received

    for dtype in (torch.float32, torch.float16, torch.int32):
        @check(f"reducescatter[{str(dtype)[6:]}]")
        def _():
            t = sample(dtype, (2 * n, 3))
            same(hvd.reducescatter(t, op=hvd.Sum), (t * n)[2 * hvd.rank():2 * hvd.rank() + 2], "sum")
            same(hvd.reducescatter(t, op=hvd.Average), t[2 * hvd.rank():2 * hvd.rank() + 2], "average")

    @check("grouped_reducescatter")
    def _():
        ts = [sample(torch.float32, (2 * n, 3)), sample(torch.float32, (n, 5))]
        outs = hvd.grouped_reducescatter(ts, op=hvd.Sum)
        same(outs[0], (ts[0] * n)[2 * hvd.rank():2 * hvd.rank() + 2], "grouped reducescatter")

    @check("adasum")
    def _():
        t = sample(torch.float32) + 1
        same(hvd.allreduce(t, op=hvd.Adasum), t, "adasum", atol=1e-5, rtol=1e-5)

    @check("autograd_allreduce_allgather_broadcast")
    def _():
        x = sample(torch.float32).requires_grad_()
        (hvd.allreduce(x, op=hvd.Sum) * 2).sum().backward()
        same(x.grad, torch.full_like(x, 2.0 * n), "allreduce grad")
        y = sample(torch.float32, (2, 3)).requires_grad_()
        hvd.allgather(y).sum().backward()
        same(y.grad, torch.ones_like(y), "allgather grad")  # Horovod averages it over the ranks
        z = sample(torch.float32).requires_grad_()
        hvd.broadcast(z, 0).sum().backward()
        assert z.grad is not None and z.grad.device.type == DEV_TYPE

    @check("sparse_allreduce")
    def _():
        dense = torch.zeros(6, 3, device=device())
        dense[1] = 1.0
        dense[4] = 2.0
        s = dense.to_sparse()
        out = hvd.synchronize(hvd.sparse_allreduce_async(s, name="sparse", op=hvd.Sum))
        same(out.to_dense(), dense * n, "sparse")

    @check("mixed_cpu_gpu_grouped_allreduce_is_refused")
    def _():
        ts = [torch.ones(4, device=device()), torch.ones(4)]
        try:
            outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
        except (ValueError, RuntimeError, TypeError) as exc:
            return f"raised {type(exc).__name__}: {str(exc)[:160]!r}"
        # accepted: then every result must be right and where its input was
        for o, t in zip(outs, ts):
            assert o.device == t.device, f"result on {o.device}, input on {t.device}"
            assert torch.equal(o.cpu(), (t * n).cpu())
        return "accepted (results correct, each on its input's device)"

    @check("cpu_tensor_in_gpu_job")
    def _():
        t = torch.arange(10.0)
        out = hvd.allreduce(t, op=hvd.Sum)
        assert out.device.type == "cpu" and torch.equal(out, t * n)

    @check("objects_join_barrier")
    def _():
        assert hvd.broadcast_object({"a": torch.ones(2, device=device())}, 0)["a"].device.type == DEV_TYPE
        assert hvd.allgather_object(hvd.rank()) == list(range(n))
        hvd.barrier()
        assert hvd.join() in range(n)

    @check("reinit_keeps_nccl_working")
    def _():
        hvd.shutdown()
        hvd.init()
        t = sample(torch.float32)
        same(hvd.allreduce(t, op=hvd.Sum), t * hvd.size(), "after re-init")

    hvd.shutdown()


# --------------------------------------------------------------------------------------- train

class Net(torch.nn.Module):
    def __init__(self, bn=torch.nn.BatchNorm1d):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.bn = bn(32)
        self.fc2 = torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def batches(steps, dev):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 12, generator=g).to(dev), torch.randint(0, 3, (16,), generator=g).to(dev))
            for _ in range(steps)]


def train(model, opt, data, passes=1):
    for x, y in data:
        opt.zero_grad()
        for _ in range(passes):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    sync()


def scenario_train() -> None:
    hvd.init()
    set_device(hvd.local_rank())
    dev = device()
    n = hvd.size()
    data = batches(6, dev)
    torch.manual_seed(0)
    base = Net().to(dev)

    def compare(a, b, what, atol=1e-5):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            same(p, q, f"{what}: {name}", atol=atol, rtol=1e-4)

    for opt_name, make in (("SGD", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
                           ("Adam", lambda ps: torch.optim.Adam(ps, lr=0.01))):
        @check(f"distributed_optimizer_matches_plain[{opt_name}]")
        def _():
            plain = copy.deepcopy(base)
            plain_opt = make(plain.parameters())
            # broadcast_optimizer_state first makes the state exist with one zero-gradient step
            # (Horovod's way: Adam's step count then starts at 1); the plain run does the same
            hvd.broadcast_optimizer_state(plain_opt, root_rank=0)
            train(plain, plain_opt, data)
            model = copy.deepcopy(base)
            opt = hvd.DistributedOptimizer(make(model.parameters()),
                                           named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            train(model, opt, data)
            compare(model, plain, opt_name)

    @check("distributed_optimizer_fp16_compression")
    def _():
        plain = copy.deepcopy(base)
        train(plain, torch.optim.SGD(plain.parameters(), lr=0.1), data)
        model = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=hvd.Compression.fp16)
        train(model, opt, data)
        compare(model, plain, "fp16", atol=2e-3)

    @check("distributed_optimizer_backward_passes_per_step_2")
    def _():
        plain = copy.deepcopy(base)
        train(plain, torch.optim.SGD(plain.parameters(), lr=0.1), data, passes=2)
        model = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=2)
        train(model, opt, data, passes=2)
        compare(model, plain, "two passes")

    @check("distributed_optimizer_sum_op_and_groups")
    def _():
        model = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       op=hvd.Sum, groups=2)
        train(model, opt, data[:2])
        assert all(p.grad.device.type == DEV_TYPE for p in model.parameters())

    @check("distributed_optimizer_adasum")
    def _():
        model = copy.deepcopy(base)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), op=hvd.Adasum)
        train(model, opt, data[:2])
        assert all(torch.isfinite(p).all() for p in model.parameters())

    @check("broadcast_parameters_and_optimizer_state_from_cuda")
    def _():
        model = copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        train(model, opt, data[:2])
        before = {k: v.clone() for k, v in model.state_dict().items()}
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for k, v in model.state_dict().items():
            assert v.device.type == DEV_TYPE, k
            if v.is_floating_point():
                same(v, before[k], k)
        for state in opt.state.values():
            assert state["exp_avg"].device.type == DEV_TYPE

    @check("sync_batch_norm_size1_matches_batch_norm")
    def _():
        torch.manual_seed(1)
        ref = Net().to(dev)
        model = Net(bn=hvd.SyncBatchNorm).to(dev)
        model.load_state_dict(ref.state_dict())
        x, y = data[0]
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        compare(model, ref, "SyncBatchNorm")
        same(model.bn.running_mean, ref.bn.running_mean, "running_mean", atol=1e-6)

    @check("sync_batch_norm_sync_path_on_cuda")
    def _():
        # In a size-1 job SyncBatchNorm takes plain batch norm; a process set that claims two
        # ranks makes it take the synchronised path (sums, one allreduce through the coordinator,
        # autograd's backward) on this rank's CUDA tensors, which must give batch norm's numbers.
        class TwoRankView:
            def __init__(self, ps):
                self._ps = ps

            def size(self):
                return 2

            def __getattr__(self, name):
                return getattr(self._ps, name)

        torch.manual_seed(2)
        ref = torch.nn.BatchNorm2d(4).to(dev)
        bn = hvd.SyncBatchNorm(4).to(dev)
        bn.load_state_dict(ref.state_dict())
        if n == 1:
            bn.process_set = TwoRankView(hvd.global_process_set)
        x = torch.randn(8, 4, 5, 5, generator=torch.Generator().manual_seed(5)).to(dev).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        want = ref(x2)
        got = bn(x)
        # every rank holds the same batch: the global statistics are the local ones
        same(got, want, "output", atol=1e-4, rtol=1e-4)
        if n > 1:
            return "output only (gradients and unbiased variance depend on the rank count)"
        want.pow(2).sum().backward()
        got.pow(2).sum().backward()
        same(x.grad, x2.grad, "input grad", atol=1e-4, rtol=1e-4)
        same(bn.weight.grad, ref.weight.grad, "weight grad", atol=1e-3, rtol=1e-4)
        same(bn.running_var, ref.running_var, "running_var", atol=1e-5, rtol=1e-5)

    @check("training_step_timing")
    def _():
        width = 256 if ON_CPU else 2048
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)]).to(dev)
        plain_model = copy.deepcopy(model)  # without the DistributedOptimizer's gradient hooks
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                       named_parameters=model.named_parameters())
        x = torch.randn(256, width, device=dev)
        plain_opt = torch.optim.SGD(plain_model.parameters(), lr=1e-4)

        def step_ms(net, optimizer) -> float:
            """Milliseconds per training step of `net`, after 3 warm-up steps."""
            def step():
                optimizer.zero_grad()
                net(x).square().mean().backward()
                optimizer.step()

            for _ in range(3):
                step()
            sync()
            started = time.perf_counter()
            for _ in range(20):
                step()
            sync()
            return (time.perf_counter() - started) / 20 * 1000

        hvd_ms = step_ms(model, opt)
        plain_ms = step_ms(plain_model, plain_opt)
        return (f"step_ms hvd={hvd_ms:.2f} plain={plain_ms:.2f} (8 layers of {width}x{width}, "
                f"{8 * width * (width + 1) * 4 / 1e6:.0f} MB of gradients)")

    hvd.shutdown()


# ------------------------------------------------------------------------------------ same GPU

def scenario_same_gpu(catch: bool) -> None:
    """Both ranks on ``cuda:0`` (a one-GPU machine): CPU tensors first (gloo, must work), then a
    CUDA allreduce, whose outcome -- result, error and how long it took -- is printed."""
    hvd.init()
    rank = hvd.rank()
    print(f"OUTCOME rank={rank} size={hvd.size()} local_size={hvd.local_size()} "
          f"gpus={torch.cuda.device_count()}", flush=True)
    t = torch.full((4,), float(rank + 1))
    out = hvd.allreduce(t, op=hvd.Sum)
    print(f"OUTCOME rank={rank} cpu_allreduce={'ok' if torch.equal(out, torch.full((4,), 3.0)) else out}",
          flush=True)
    g = torch.full((4,), float(rank + 1), device="cpu" if ON_CPU else "cuda:0")
    started = time.monotonic()
    try:
        out = hvd.allreduce(g, op=hvd.Sum)
        sync()
        ok = torch.equal(out.cpu(), torch.full((4,), 3.0))
        print(f"OUTCOME rank={rank} cuda_allreduce={'ok' if ok else 'WRONG ' + str(out.tolist())} "
              f"seconds={time.monotonic() - started:.2f}", flush=True)
    except Exception as exc:
        text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}".replace("\n", " | ")[:1500]
        print(f"OUTCOME rank={rank} cuda_allreduce=error seconds={time.monotonic() - started:.2f} "
              f"error={text}", flush=True)
        if not catch:
            raise
    started = time.monotonic()
    try:
        out = hvd.allreduce(t, op=hvd.Sum, name="cpu.after")
        print(f"OUTCOME rank={rank} cpu_after={'ok' if torch.equal(out, torch.full((4,), 3.0)) else out} "
              f"seconds={time.monotonic() - started:.2f}", flush=True)
    except Exception as exc:
        print(f"OUTCOME rank={rank} cpu_after=error seconds={time.monotonic() - started:.2f} "
              f"error={type(exc).__name__}: {str(exc)[:300]}".replace("\n", " | "), flush=True)
    started = time.monotonic()
    hvd.shutdown()
    print(f"OUTCOME rank={rank} shutdown_seconds={time.monotonic() - started:.2f}", flush=True)


def scenario_mixed() -> None:
    """2 ranks, user errors about devices that must fail only the op that made them: rank 0 on the
    GPU and rank 1 on the CPU for one allreduce (Horovod's "Mismatched device" error on both
    ranks), then one grouped allreduce mixing CPU and GPU tensors on every rank (refused); after
    both, a CPU allreduce must still work. No NCCL communicator is needed: a 1-GPU machine runs
    it."""
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    dev = torch.device("cpu") if ON_CPU else torch.device("cuda", 0)

    def after(what):
        t = torch.full((3,), float(rank + 1))
        out = hvd.allreduce(t, op=hvd.Sum, name=f"after.{what}")
        assert torch.equal(out, torch.full((3,), float(n * (n + 1) // 2))), out

    @check("ranks_on_different_devices_is_refused")
    def _():
        t = torch.ones(5, device=dev if rank == 0 else "cpu")
        try:
            hvd.allreduce(t, name="mixed.ranks")
        except Exception as exc:  # noqa: BLE001
            assert "device" in str(exc).lower(), f"{type(exc).__name__}: {exc}"
            return f"{type(exc).__name__}: {str(exc)[:150]!r}"
        raise AssertionError("an allreduce of a GPU tensor on rank 0 and a CPU tensor on rank 1 "
                             "was accepted")

    @check("set_still_works_after_device_mismatch")
    def _():
        after("mismatch")

    @check("grouped_cpu_gpu_mix_is_refused")
    def _():
        ts = [torch.ones(4), torch.ones(4, device=dev)]
        try:
            hvd.grouped_allreduce(ts, op=hvd.Sum, name="mixed.group")
        except (RuntimeError, ValueError) as exc:
            return f"{type(exc).__name__}: {str(exc)[:150]!r}"
        raise AssertionError("a grouped allreduce of a CPU and a GPU tensor was accepted")

    @check("set_still_works_after_grouped_mix")
    def _():
        after("grouped")

    hvd.shutdown()


def main(argv) -> int:
    if not (ON_CPU or torch.cuda.is_available()):
        print("SKIP needs a CUDA GPU (torch.cuda.is_available() is False)", flush=True)
        return 0
    scenario = argv[1] if len(argv) > 1 else "api"
    if scenario == "api":
        scenario_api()
    elif scenario == "train":
        scenario_train()
    elif scenario == "mixed":
        scenario_mixed()
    elif scenario in ("same_gpu", "same_gpu_raise"):
        scenario_same_gpu(catch=scenario == "same_gpu")
    else:
        print(f"unknown scenario {scenario!r}", file=sys.stderr)
        return 2
    print(f"DONE failures={failures}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv))
