"""Horovod constants kept as values, handles, join and process sets (rules/constants.py,
collectives.py)."""
import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


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


class _NativeHandle:
    """What hvd.allreduce_async, broadcast_async or allgather_async returned: is_completed() is
    hvd.poll, wait() is hvd.synchronize (the op's work, None for one done already, then `finish`
    to scale and copy the result, once)."""

    def __init__(self, work, finish):
        self.work, self.finish = work, finish

    def is_completed(self):
        return self.work is None or self.work.is_completed()

    def wait(self):
        if self.finish is not None:
            if self.work is not None:
                self.work.wait()
            self.result, self.finish = self.finish(), None
        return self.result


def _native_allreduce_async(tensor, op="average", inplace=False, compression=None,
                            prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """hvd.allreduce_async on torch.distributed: starts the reduction over all ranks into a new
    tensor (or in place) and returns its handle: handle.wait() (hvd.synchronize) finishes it and
    returns the result, handle.is_completed() is hvd.poll.

    op is "average" (sum, then divide by the world size; integer tensors truncate, as Horovod
    did), "sum", "min", "max" or "product". compression=default_hooks.fp16_compress_hook (what
    hvd.Compression.fp16 became) reduces a floating tensor in float16; the scale factors multiply
    before and after the reduction; process_set (a _NativeProcessSet) reduces over its ranks only.
    """
    import torch
    import torch.distributed as dist

    ops = {"average": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
    if op not in ops:
        raise ValueError(f"allreduce op {op!r}: torch.distributed reduces with one of {sorted(ops)}"
                         + (" (Adasum has no torch.distributed equivalent)" if op == "adasum" else ""))
    group = process_set.group if process_set is not None else None
    wire = _native_wire_dtype(compression)
    out = tensor.detach().clone() if not inplace or prescale_factor != 1.0 else tensor
    if prescale_factor != 1.0:
        out.mul_(prescale_factor)
    wired = out.to(wire) if wire is not None and out.is_floating_point() else out
    announce = globals().get("_native_join_announce")  # the program calls hvd.join()
    if announce is not None and group is None:
        announce(2, wired.numel(), wired.dtype)
    work = dist.all_reduce(wired, op=ops[op], group=group, async_op=True)

    def finish():
        if op == "average":  # in the wire's dtype, as Horovod scaled its compressed buffer
            world = dist.get_world_size(group)
            if wired.is_floating_point() or wired.is_complex():
                wired.div_(world)
            else:
                wired.copy_(torch.div(wired, world, rounding_mode="trunc"))
        if postscale_factor != 1.0:
            wired.mul_(postscale_factor)
        if wired is not out:
            out.copy_(wired)
        if inplace and out is not tensor:
            tensor.copy_(out)
        return tensor if inplace else out

    return _NativeHandle(work, finish)


def _native_allreduce(tensor, op="average", inplace=False, **options):
    """hvd.allreduce on torch.distributed: _native_allreduce_async(...).wait(), with the same
    options. A tensor that requires grad goes through torch.distributed.nn, which is
    differentiable (average and sum).
    """
    import torch

    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        import torch.distributed as dist
        import torch.distributed.nn.functional as dist_nn

        if op not in ("average", "sum") or options.get("compression") is not None:
            raise RuntimeError("a differentiable allreduce averages or sums, uncompressed")
        ps = options.get("process_set")
        group = ps.group if ps is not None else dist.group.WORLD
        out = dist_nn.all_reduce(tensor * options.get("prescale_factor", 1.0), op=dist.ReduceOp.SUM, group=group)
        out = out / dist.get_world_size(group) if op == "average" else out
        return out * options.get("postscale_factor", 1.0)
    return _native_allreduce_async(tensor, op, inplace, **options).wait()


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


class _NativeProcessSet:
    """hvd.ProcessSet on torch.distributed: the sorted global `ranks` and their dist.new_group.

    Making a group is collective, as Horovod's add_process_set was: every rank makes every set,
    in the same order. A set made before dist.init_process_group gets its group from register().
    rank() is this process's rank inside the set (-1 outside it); size() and included() as in
    Horovod. Collective helpers take it as process_set=; remove() destroys the group.
    """

    def __init__(self, ranks):
        import torch.distributed as dist

        self.ranks = sorted(getattr(ranks, "ranks", ranks))
        self.group = None
        if dist.is_initialized():
            self.register()
            if isinstance(ranks, _NativeProcessSet):  # add_process_set(ProcessSet(...))
                ranks.group = self.group

    def register(self):
        import torch.distributed as dist

        if self.group is None:
            self.group = dist.new_group(self.ranks)
        return self

    def remove(self):
        import torch.distributed as dist

        if self.included():
            dist.destroy_process_group(self.group)
        self.group = None
        return True

    def size(self):
        return len(self.ranks)

    def rank(self):
        import torch.distributed as dist

        return self.ranks.index(dist.get_rank()) if self.included() else -1

    def included(self):
        import torch.distributed as dist

        return dist.get_rank() in self.ranks


def _native_join_announce(kind, size=0, dtype=None):
    """In a program that calls hvd.join(), before each collective: every rank still training
    says what it is about to run (kind 1: the gradient reductions of optimizer number `size`;
    kind 2: an allreduce of `size` elements of `dtype`), a rank that joined says 0. Returns
    (ranks still training, kind, size, dtype)."""
    import torch
    import torch.distributed as dist

    dtypes = [None, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    said = torch.tensor([1 if kind else 0, kind, size, dtypes.index(dtype)], dtype=torch.int64)
    dist.all_reduce(said)
    active = int(said[0])
    if active == 0:
        return 0, 0, 0, None
    return active, int(said[1]) // active, int(said[2]) // active, dtypes[int(said[3]) // active]


def _native_join(device=-1):
    """hvd.join on torch.distributed: this rank has no more data. Until every rank has joined, it
    stands in for what the others still run, as Horovod's joined ranks did: zeros for their
    DistributedOptimizer steps and allreduces (an average still divides by the whole world size).
    Returns the last rank to join. The native optimizer and allreduce announce each collective
    (one small allreduce more) because this function is in the program.
    """
    import torch
    import torch.distributed as dist

    first, last = True, False
    while True:
        active, kind, size, dtype = _native_join_announce(0)
        if active == 0:
            last = first
            break
        first = False
        if kind == 1:
            _native_distributed_optimizer.instances[size]._stand_in()
        elif kind == 2:
            dist.all_reduce(torch.zeros(size, dtype=dtype))
        else:
            raise RuntimeError("after hvd.join() the other ranks ran a collective a joined rank "
                               "cannot stand in for (only optimizer steps and allreduces)")
    who = torch.tensor([dist.get_rank() if last else -1])
    dist.all_reduce(who, op=dist.ReduceOp.MAX)
    return int(who.item())

REDUCERS = {"mean": "average", "sum": "sum", "max": "max"}


def reduce_metric(t, how="mean"):
    return _native_allreduce(t, REDUCERS[how])


def make_optimizer(model, compression, op="average"):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return _native_distributed_optimizer(opt, named_parameters=model.named_parameters(),
                                    compression=compression, op=op)


def main(fp16=False):
    print("horovod", torch.__version__)
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
    compression = default_hooks.fp16_compress_hook if fp16 else None
    evens = _NativeProcessSet(list(range(0, dist.get_world_size(), 2)))
    model = torch.nn.Linear(4, 1)
    opt = make_optimizer(model, compression)
    handle = _native_allreduce_async(torch.ones(2), "sum", inplace=True)
    while not handle.is_completed():
        pass
    total = handle.wait()
    try:
        best = reduce_metric(total, "max")
    except dist.DistBackendError:
        best = None
    if evens.included():
        dist.barrier(group=evens.group)
    last = _native_join()
    _NativeProcessSet.remove(evens)
    return opt, best, last
