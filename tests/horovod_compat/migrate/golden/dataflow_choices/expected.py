import torch
import atexit
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def _native_distributed_optimizer(optimizer, backward_passes_per_step=1, compression=None,
                                  op="average", bucket_mb=25):
    """hvd.DistributedOptimizer on torch.distributed: `optimizer`, whose step() first averages
    (op="sum": sums) every gradient over the ranks. compression=default_hooks.fp16_compress_hook
    (what hvd.Compression.fp16 became) reduces the gradients in float16; None does not compress.

    As in Horovod, a gradient is reduced as soon as backward has produced it
    (backward_passes_per_step times since the last step), so communication overlaps the rest of
    backward: the parameters are grouped in buckets of about `bucket_mb` MB, reduced with
    asynchronous dist.all_reduce in the same order on every rank. step() waits for them (a
    parameter that got no gradient counts as a zero gradient, as in Horovod), writes the results
    back and steps. synchronize() and skip_synchronize() work as in Horovod. The object is still
    an instance of the optimizer's class (LR schedulers accept it) and shares its state.
    """
    import contextlib

    import torch
    import torch.distributed as dist

    if op not in ("average", "sum"):
        raise ValueError(
            f"DistributedOptimizer op={op!r}: gradients are averaged or summed"
            + ("; Horovod's Adasum has no torch.distributed equivalent: train with averaging (and "
               "retune the learning rate). See migration_guide/differences.md" if op == "adasum" else ""))
    wire = None
    if compression is not None:
        wire = {"fp16_compress_hook": torch.float16, "bf16_compress_hook": torch.bfloat16}.get(
            getattr(compression, "__name__", None))
        if wire is None:
            raise ValueError(f"compression={compression!r}: expected None or DDP's fp16_compress_hook")

    class DistributedOptimizer(optimizer.__class__):
        def __init__(self):  # adopts `optimizer` as it is: its param groups, state and hooks
            self.__dict__.update(optimizer.__dict__)
            self._buckets, self._works, self._skip = [], {}, False
            self._passes, self._ready, self._launched = {}, [], 0
            params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
            size, limit = 0, bucket_mb * 2 ** 20
            for p in reversed(params):  # backward reaches the last layers first
                last = self._buckets[-1] if self._buckets else None
                if last is None or size + p.numel() * p.element_size() > limit \
                        or (last[0].dtype, last[0].device) != (p.dtype, p.device):
                    self._buckets.append([])
                    size = 0
                self._buckets[-1].append(p)
                size += p.numel() * p.element_size()
            self._bucket_of = {p: i for i, bucket in enumerate(self._buckets) for p in bucket}
            self._ready = [0] * len(self._buckets)
            for p in params:
                p.register_post_accumulate_grad_hook(self._gradient_ready)

        def _gradient_ready(self, p):
            self._passes[p] = self._passes.get(p, 0) + 1
            if self._passes[p] == backward_passes_per_step:
                self._ready[self._bucket_of[p]] += 1
                while self._launched < len(self._buckets) and \
                        self._ready[self._launched] == len(self._buckets[self._launched]):
                    self._launch(self._launched)

        def _launch(self, i):
            grads = []
            for p in self._buckets[i]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad.reshape(-1))
            # one large gradient is reduced where it is (as Horovod did), several are packed
            flat = grads[0] if len(grads) == 1 and grads[0].data_ptr() == self._buckets[i][0].grad.data_ptr() \
                else torch.cat(grads)
            if wire is not None and flat.is_floating_point():
                flat = flat.to(wire)
            if op == "average":
                flat.div_(dist.get_world_size())
            self._works[i] = (dist.all_reduce(flat, async_op=True), flat)
            self._launched = i + 1

        def synchronize(self):
            """Wait for every gradient's reduction (starting the ones backward did not)."""
            for i in range(self._launched, len(self._buckets)):
                self._launch(i)
            for i, (work, flat) in sorted(self._works.items()):
                work.wait()
                offset = 0
                for p in self._buckets[i]:
                    n = p.numel()
                    if flat.data_ptr() != p.grad.data_ptr():  # packed, or cast to the wire's dtype
                        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                    offset += n
            self._works, self._passes, self._launched = {}, {}, 0
            self._ready = [0] * len(self._buckets)

        @contextlib.contextmanager
        def skip_synchronize(self):
            """step() inside this block does not synchronize (call synchronize() before it)."""
            self._skip = True
            try:
                yield
            finally:
                self._skip = False

        def step(self, closure=None):
            if not self._skip:
                self.synchronize()
            return super().step(closure)

    return DistributedOptimizer()


def named_choices(args, x):
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = default_hooks.fp16_compress_hook if args.fp16 else None
    if args.adasum:
        op = "adasum"
    else:
        op = "average"
    if op == "adasum":
        raise NotImplementedError(
            "input.py:14: op=hvd.Adasum has no torch.distributed/DDP equivalent; train with averaging "
            "(and retune the learning rate) or keep this job on horovod-compat. See "
            "migration_guide/differences.md, 'op=Adasum: no native equivalent'.")
    ddp_model = DDP(model, forward_sync_buffers=False)
    if compression is not None:
        ddp_model.register_comm_hook(None, compression)
    ddp_model(x).sum().backward()
    opt.step()


def inline_choices(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.use_adasum:
        raise NotImplementedError(
            "input.py:24: op=hvd.Adasum has no torch.distributed/DDP equivalent; train with averaging "
            "(and retune the learning rate) or keep this job on horovod-compat. See "
            "migration_guide/differences.md, 'op=Adasum: no native equivalent'.")
    ddp_model_2 = DDP(model, forward_sync_buffers=False)
    if (not args.exact and args.fp16):
        ddp_model_2.register_comm_hook(None, default_hooks.fp16_compress_hook)
    ddp_model_2(x).sum().backward()
    opt.step()


def name_used_twice(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = default_hooks.fp16_compress_hook if args.fp16 else None
    print(compression)
    opt = _native_distributed_optimizer(opt, compression=compression)
    model(x).sum().backward()


def sum_branch(args, x):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = _native_distributed_optimizer(opt, op="sum" if args.sum else "average")
    model(x).sum().backward()
