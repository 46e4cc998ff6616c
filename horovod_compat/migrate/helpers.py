"""Small native functions the rewriter inserts when a Horovod call has no one-line equivalent.

Each helper is plain ``torch.distributed`` code that reproduces what the Horovod call did (the
facts are in docs/horovod_torch_api.md), and imports what it uses inside its body, so it works
wherever it is pasted, including in a notebook cell or a function pickled by TorchDistributor.
They are inserted at module level after the file's leading imports, once per file.
"""
from __future__ import annotations

from typing import Dict, List

HELPERS: Dict[str, str] = {
    "_native_wire_dtype": '''
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
''',
    "_native_sum_gradients": '''
def _native_sum_gradients(process_group, bucket):
    """DDP comm hook for hvd.DistributedOptimizer(op=hvd.Sum): each gradient bucket summed over
    the ranks (process_group None: all of them), where DDP's own reduction averages."""
    import torch.distributed as dist

    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])
''',
    # What an asynchronous op returned (hvd.allreduce_async, hvd.broadcast_async): a handle.
    "_NativeHandle": '''
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
''',
    # One source for the blocking and the asynchronous form: the blocking one waits on the other.
    "_native_allreduce": '''
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
''',
    # hvd.allreduce(tensor) as metrics use it (average, nothing else): _native_sum, divided.
    "_native_average": '''
def _native_average(tensor):
    """hvd.allreduce(tensor): the average over all ranks, in a new tensor (differentiable, as
    Horovod's; integer tensors truncate, as Horovod's did)."""
    import torch
    import torch.distributed as dist

    total = _native_sum(tensor)
    if total.is_floating_point() or total.is_complex():
        return total / dist.get_world_size()
    return torch.div(total, dist.get_world_size(), rounding_mode="trunc")
''',
    # hvd.allreduce(tensor, op=hvd.Sum) (average=False), nothing else. A tensor that requires grad
    # goes through torch's differentiable all_reduce; any other through dist.all_reduce on a copy
    # (torch 2.13 warns that the differentiable one is deprecated).
    "_native_sum": '''
def _native_sum(tensor):
    """hvd.allreduce(tensor, op=hvd.Sum): the sum over all ranks, in a new tensor (differentiable,
    as Horovod's)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn

    if tensor.requires_grad and torch.is_grad_enabled():
        return dist_nn.all_reduce(tensor)
    total = tensor.clone()
    dist.all_reduce(total)
    return total
''',
    "_native_broadcast": '''
def _native_broadcast(tensor, root_rank, inplace=False, process_set=None):
    """hvd.broadcast on torch.distributed: root_rank's values, in a new tensor (or in place).
    root_rank is a global rank, also with a process_set (a _NativeProcessSet), as in Horovod."""
    import torch
    import torch.distributed as dist

    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        raise RuntimeError("hvd.broadcast was differentiable; broadcast tensor.detach() instead")
    out = tensor if inplace else tensor.detach().clone()
    with torch.no_grad():
        dist.broadcast(out, src=root_rank, group=process_set.group if process_set is not None else None)
    return out
''',
    "_native_broadcast_async": '''
def _native_broadcast_async(tensor, root_rank, inplace=False, process_set=None):
    """hvd.broadcast_async on torch.distributed: starts root_rank's values into a new tensor (or in
    place) and returns its handle: handle.wait() (hvd.synchronize) returns them,
    handle.is_completed() is hvd.poll. root_rank is a global rank, as in Horovod."""
    import torch.distributed as dist

    out = tensor if inplace else tensor.detach().clone()
    work = dist.broadcast(out, src=root_rank, group=process_set.group if process_set is not None else None,
                          async_op=True)
    return _NativeHandle(work, lambda: out)
''',
    "_native_broadcast_parameters": '''
def _native_broadcast_parameters(params, root_rank):
    """hvd.broadcast_parameters on torch.distributed: copy root_rank's tensors to every rank.

    Accepts what Horovod accepted: a state_dict (broadcast in sorted key order), or a list of
    (name, tensor) pairs or of tensors.
    """
    import torch
    import torch.distributed as dist

    if isinstance(params, dict):
        tensors = [t for _, t in sorted(params.items())]
    elif isinstance(params, list):
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    with torch.no_grad():
        for t in tensors:
            if isinstance(t, torch.Tensor):
                dist.broadcast(t.data, src=root_rank)
''',
    "_native_broadcast_optimizer_state": '''
def _native_broadcast_optimizer_state(optimizer, root_rank):
    """hvd.broadcast_optimizer_state: root_rank's state and options on every rank. A fresh optimizer
    first steps on zero gradients, as Horovod's did (weights put back; differences.md)."""
    import torch
    import torch.distributed as dist

    if not optimizer.state:
        saved = [(p, p.detach().clone()) for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p, _ in saved:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
    state = [optimizer.state_dict()]
    dist.broadcast_object_list(state, src=root_rank)
    optimizer.load_state_dict(state[0])
''',
    "_native_broadcast_object": '''
def _native_broadcast_object(obj, root_rank=0, process_set=None):
    """hvd.broadcast_object on torch.distributed: root_rank's (picklable) object on every rank
    (of process_set, a _NativeProcessSet, when given; root_rank is a global rank)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=root_rank, group=process_set.group if process_set is not None else None)
    return box[0]
''',
    "_native_allgather": '''
def _native_allgather(tensor, process_set=None):
    """hvd.allgather on torch.distributed: every rank's tensor (of process_set, a
    _NativeProcessSet, when given) concatenated along dim 0, in rank order. The first dimension
    may differ between ranks: the sizes are gathered first and each tensor is padded to the
    largest. Differentiable as Horovod's was: the gradient is averaged over the ranks and each
    rank keeps the rows it gave.
    """
    import torch
    import torch.distributed as dist

    group = process_set.group if process_set is not None else None

    def gather(t):
        t = t.contiguous()
        rows = torch.tensor([t.shape[0]], device=t.device)
        sizes = [torch.zeros_like(rows) for _ in range(dist.get_world_size(group))]
        dist.all_gather(sizes, rows, group=group)
        sizes = [int(s.item()) for s in sizes]
        padded = t.new_zeros((max(sizes), *t.shape[1:]))
        padded[:t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)]), sizes

    class AllGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            out, sizes = gather(t)
            ctx.rows = (sum(sizes[:dist.get_rank(group)]), t.shape[0])
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous().clone()
            dist.all_reduce(grad, group=group)
            start, count = ctx.rows
            return grad[start:start + count] / dist.get_world_size(group)

    if tensor.requires_grad and torch.is_grad_enabled():
        return AllGather.apply(tensor)
    return gather(tensor.detach())[0]
''',
    # hvd.allgather_async: torch has no asynchronous gather of uneven rows, so it gathers at once
    "_native_allgather_async": '''
def _native_allgather_async(tensor, process_set=None):
    """hvd.allgather_async on torch.distributed: _native_allgather at once (the rows per rank may
    differ, which torch's asynchronous all_gather does not allow), behind a handle whose wait()
    (hvd.synchronize) returns it."""
    gathered = _native_allgather(tensor, process_set=process_set)
    return _NativeHandle(None, lambda: gathered)
''',
    "_native_distributed_optimizer": '''
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
    pre, post = (1.0 / gradient_predivide_factor, gradient_predivide_factor / world) \
        if op == "average" else (1.0, 1.0)

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
                if last is None or size + p.numel() * p.element_size() > limit \\
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
                while self._launched < len(self._buckets) and \\
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
            flat = grads[0] if len(grads) == 1 and grads[0].data_ptr() == self._buckets[i][0].grad.data_ptr() \\
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
''',
    "_NativeProcessSet": '''
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
''',
    "_native_join": '''
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
''',
    "_native_allgather_object": '''
def _native_allgather_object(obj):
    """hvd.allgather_object on torch.distributed: the list of every rank's object, in rank order."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
''',
    "_NativeElasticState": '''
class _NativeElasticState:
    """hvd.elastic.TorchState for torchrun --max-restarts: the job's state, checkpointed by rank 0.

    torchrun restarts *every* worker when one fails or the membership changes, so recovery is a
    fresh start that resumes from the last commit: commit() saves the model, the optimizer, the
    samplers' progress and every other attribute given to the constructor to `path` (rank 0 writes
    it, atomically); the constructor loads it when it exists (rank 0 reads it and broadcasts it)
    and then runs the reset callbacks, as Horovod ran them after a reset. check_host_updates() has
    nothing to do: torchrun itself restarts the workers when hosts come or go.
    The checkpoint goes to $ELASTIC_CHECKPOINT, else elastic_checkpoint.pt in the working directory.
    """

    def __init__(self, model=None, optimizer=None, path=None, **values):
        import os

        import torch
        import torch.distributed as dist

        self.model, self.optimizer, self._names = model, optimizer, list(values)
        self._path = path or os.environ.get("ELASTIC_CHECKPOINT", "elastic_checkpoint.pt")
        self._reset_callbacks = []
        for name, value in values.items():
            setattr(self, name, value)
        box = [None]
        if dist.get_rank() == 0 and os.path.exists(self._path):
            box[0] = torch.load(self._path, map_location="cpu", weights_only=False)
        dist.broadcast_object_list(box, src=0)
        self.restored = box[0] is not None
        if self.restored:
            self._load(box[0])

    def _module(self):
        return getattr(self.model, "module", self.model)

    def _load(self, saved):
        if self.model is not None:
            self._module().load_state_dict(saved["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        for name in self._names:
            value = getattr(self, name)
            if hasattr(value, "load_state_dict") and hasattr(value, "record_batch"):
                value.load_state_dict(saved["values"][name])
            else:
                setattr(self, name, saved["values"][name])

    def register_reset_callbacks(self, callbacks):
        """Run `callbacks` now if this start resumed from a commit (a torchrun restart is the reset)."""
        self._reset_callbacks.extend(callbacks)
        if self.restored:
            for callback in callbacks:
                callback()

    def commit(self):
        """Save the state from rank 0 (every rank calls it: the samplers' progress is gathered)."""
        import os

        import torch
        import torch.distributed as dist

        values = {}
        for name in self._names:
            value = getattr(self, name)
            values[name] = value.state_dict() if hasattr(value, "record_batch") else value
        saved = {"model": self._module().state_dict() if self.model is not None else None,
                 "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                 "values": values}
        if dist.get_rank() == 0:
            tmp = self._path + ".tmp"
            torch.save(saved, tmp)
            os.replace(tmp, self._path)

    save = commit

    def check_host_updates(self):
        """Nothing to check: torchrun restarts every worker when the membership changes."""
''',
    "_NativeElasticSampler": '''
class _NativeElasticSampler:
    """hvd.elastic.ElasticSampler on torch.distributed: shards what is left of the epoch over the ranks.

    record_batch()/record_indices() mark samples processed; state_dict() gathers every rank's marks
    (a collective: every rank calls it, from commit()), so after a torchrun restart the samples
    of the epoch not yet processed are sharded over however many ranks there are now.  Shuffling
    is by epoch and seed, padding as DistributedSampler's, so every rank has the same length.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch, self.processed = 0, set()
        self._reshard()

    def _reshard(self):
        import random

        import torch.distributed as dist

        rank, size = dist.get_rank(), dist.get_world_size()
        order = list(range(len(self.dataset)))
        if self.shuffle:  # Horovod's order: one shuffle by seed + epoch
            random.Random(self.seed + self.epoch).shuffle(order)
        remaining = [i for i in order if i not in self.processed]
        per_rank = -(-len(remaining) // size)
        padded = remaining + remaining[: per_rank * size - len(remaining)]
        self.indices = padded[rank:per_rank * size:size]

    def set_epoch(self, epoch):
        self.epoch, self.processed = epoch, set()
        self._reshard()

    def record_batch(self, batch_idx, batch_size):
        self.record_indices(self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size])

    def record_indices(self, indices):
        self.processed.update(indices)

    def state_dict(self):
        import torch.distributed as dist

        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(self.processed))
        return {"epoch": self.epoch, "processed": sorted({i for part in everyone for i in part})}

    def load_state_dict(self, state):
        self.epoch, self.processed = state["epoch"], set(state["processed"])
        self._reshard()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)
''',
}

#: The helpers each helper calls: inserted with it, before it.
REQUIRES: Dict[str, List[str]] = {
    "_native_allreduce": ["_native_wire_dtype", "_NativeHandle"],
    "_native_average": ["_native_sum"],
    "_native_broadcast_async": ["_NativeHandle"],
    "_native_allgather_async": ["_native_allgather", "_NativeHandle"],
    "_native_distributed_optimizer": ["_native_wire_dtype"],
}
