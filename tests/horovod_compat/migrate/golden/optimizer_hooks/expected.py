"""A trainer class holding model and optimizer, as real projects write it: the model travels, so
no DDP wrap can be proven, and its forward() is handed out as a value, to be called past the hooks
of a replicated module; under --emulate the optimizer averages the gradients itself (gradient hooks)."""
import torch
import atexit
import gc
import os
import torch.distributed as dist


def _native_wire_dtype(compression):
    """The dtype Horovod's compression sent tensors in: None (no compression), or float16 for
    hvd.Compression.fp16, which became DDP's default_hooks.fp16_compress_hook (bf16 likewise)."""
    import torch

    if compression is None:
        return None
    wire = {"fp16_compress_hook": torch.float16, "bf16_compress_hook": torch.bfloat16}.get(
        getattr(compression, "__name__", None))
    if wire is None:
        raise ValueError(f"compression={compression!r}: expected None or DDP's fp16_compress_hook")
    return wire


def _native_distributed_optimizer(optimizer, named_parameters=None, compression=None,
                                  backward_passes_per_step=1, op="average",
                                  gradient_predivide_factor=1.0, num_groups=0, groups=None,
                                  sparse_as_dense=False, process_set=None, bucket_mb=25):
    """hvd.DistributedOptimizer on torch.distributed, with Horovod's parameters: `optimizer`,
    whose step() first averages (op="sum": sums) every gradient over the ranks (of process_set,
    a _NativeProcessSet, when given). compression=default_hooks.fp16_compress_hook (what
    hvd.Compression.fp16 became) reduces in float16. gradient_predivide_factor f divides by f
    before the sum and by size/f after it. sparse_as_dense=True reduces sparse gradients as dense
    ones. named_parameters is checked as Horovod checked it; num_groups/groups only chose how
    Horovod fused tensors: here parameters go in buckets of about `bucket_mb` MB.

    As in Horovod, a gradient is reduced as soon as backward has produced it
    (backward_passes_per_step times since the last step), so communication overlaps the rest of
    backward: the buckets are reduced with asynchronous dist.all_reduce in the same order on every
    rank. step() waits for them (a parameter that got no gradient counts as a zero gradient, as in
    Horovod), writes the results back and steps. synchronize() and skip_synchronize() work as in
    Horovod. The object is still an instance of the optimizer's class (LR schedulers accept it)
    and shares its param groups; like Horovod's, it starts without the optimizer's state (so
    broadcast_optimizer_state or load_state_dict goes after the wrap).
    """
    import collections
    import contextlib

    import torch
    import torch.distributed as dist

    if op not in ("average", "sum"):
        raise ValueError(
            f"DistributedOptimizer op={op!r}: gradients are averaged or summed"
            + ("; Horovod's Adasum has no torch.distributed equivalent: train with averaging (and "
               "retune the learning rate). See migration_guide/differences.md" if op == "adasum" else ""))
    if gradient_predivide_factor != 1.0 and op != "average":
        raise ValueError("gradient_predivide_factor is only supported with op=average")
    wire = _native_wire_dtype(compression)
    if named_parameters is not None:
        named = list(named_parameters)
        names = [name for name, _ in named]
        if len(set(names)) < len(names):
            raise ValueError("named_parameters has duplicate names: "
                             + ", ".join(sorted({n for n in names if names.count(n) > 1})))
        known = {id(p) for _, p in named}
        if any(id(p) not in known for group in optimizer.param_groups for p in group["params"]):
            raise ValueError("named_parameters was given, but some of the optimizer's parameters "
                             "are not in it")
    group = process_set.group if process_set is not None else None
    world = dist.get_world_size(group)
    pre, post = (1.0 / gradient_predivide_factor, gradient_predivide_factor / world)         if op == "average" else (1.0, 1.0)

    class DistributedOptimizer(optimizer.__class__):
        def __init__(self):
            # `optimizer`'s param groups (the same dicts: a scheduler made on either sees the
            # other's lr) and hooks, but no state yet: Horovod's wrapper started without it too
            self.__dict__.update(optimizer.__dict__)
            self.state = collections.defaultdict(dict)
            self._buckets, self._works, self._skip = [], {}, False
            self._passes, self._ready, self._launched, self._announced = {}, [], 0, False
            # every rank makes its optimizers in the same order: the index names this one to
            # ranks that called hvd.join() (_native_join), which stand in for its reductions
            instances = _native_distributed_optimizer.__dict__.setdefault("instances", [])
            self._index = len(instances)
            instances.append(self)
            self._join = globals().get("_native_join_announce")  # the program calls hvd.join()
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

        def _announce(self):
            if self._join is not None and group is None and not self._announced:
                self._join(1, self._index)
                self._announced = True

        def _stand_in(self):
            """Zeros for every bucket's reduction, for a rank that has joined (_native_join)."""
            for bucket in self._buckets:
                dtype = wire if wire is not None and bucket[0].is_floating_point() else bucket[0].dtype
                dist.all_reduce(torch.zeros(sum(p.numel() for p in bucket), dtype=dtype,
                                            device=bucket[0].device))

        def _gradient_ready(self, p):
            if self._join is not None:
                self._announce()
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
                elif p.grad.is_sparse:
                    if not sparse_as_dense:
                        raise RuntimeError("a sparse gradient (nn.Embedding(sparse=True)): pass "
                                           "sparse_as_dense=True to reduce it as a dense one")
                    p.grad = p.grad.to_dense()
                grads.append(p.grad.reshape(-1))
            # one large gradient is reduced where it is (as Horovod did), several are packed
            flat = grads[0] if len(grads) == 1 and grads[0].data_ptr() == self._buckets[i][0].grad.data_ptr() \
                else torch.cat(grads)
            if wire is not None and flat.is_floating_point():
                flat = flat.to(wire)
            if pre != 1.0:
                flat.mul_(pre)
            elif op == "average":
                flat.div_(world)  # before the sum, as DDP does (f == 1: the same average)
            self._works[i] = (dist.all_reduce(flat, group=group, async_op=True), flat)
            self._launched = i + 1

        def synchronize(self):
            """Wait for every gradient's reduction (starting the ones backward did not)."""
            self._announce()
            for i in range(self._launched, len(self._buckets)):
                self._launch(i)
            for i, (work, flat) in sorted(self._works.items()):
                work.wait()
                if pre != 1.0:
                    flat.mul_(post)
                offset = 0
                for p in self._buckets[i]:
                    n = p.numel()
                    if flat.data_ptr() != p.grad.data_ptr():  # packed, or cast to the wire's dtype
                        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                    offset += n
            self._works, self._passes, self._launched, self._announced = {}, {}, 0, False
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


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(8, 1)
        self.unused = torch.nn.Linear(3, 3)  # never in the forward pass: a zero gradient

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def evaluate(forward, x):
    with torch.no_grad():
        return forward(x).mean().item()


class Trainer:
    def __init__(self, model, lr, passes, fp16):
        self.model = model
        self.optimizer = _native_distributed_optimizer(
            torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
            named_parameters=model.named_parameters(),
            compression=None,
            backward_passes_per_step=passes)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.passes = passes

    def step(self, batches):
        self.optimizer.zero_grad()
        for x, y in batches[:self.passes]:
            torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.synchronize()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        self.scheduler.step()
        return norm.item()


def main():
    if not dist.is_initialized():
        import torch.distributed.nn as dist_nn  # first, so that the group is freed at exit (troubleshooting.md)
        # no launcher (torchrun sets RANK, mpirun its own): rank 0 of 1, as Horovod ran without one
        if not any(name in os.environ for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
            os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        atexit.register(gc.collect)  # runs first: dropped DDP modules release the group
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    model = Net()
    for tensor in model.state_dict().values():  # hvd.broadcast_parameters
        dist.broadcast(tensor, src=0)
    trainer = Trainer(model, lr=0.05, passes=2, fp16=False)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for step in range(6):
        batches = [(torch.randn(5 + dist.get_rank(), 6, generator=g), torch.randn(5 + dist.get_rank(), 1, generator=g))
                   for _ in range(2)]
        norm = trainer.step(batches)
        print(f"rank {dist.get_rank()} step {step} norm {norm:.6f} eval {evaluate(model.forward, batches[0][0]):.6f}")
    total = sum(p.sum().item() for p in model.parameters())
    print(f"rank {dist.get_rank()} final {total:.6f}")


if __name__ == "__main__":
    main()
