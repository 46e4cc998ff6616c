"""Small native functions the rewriter inserts when a Horovod call has no one-line equivalent.

Each helper is plain ``torch.distributed`` code that reproduces what the Horovod call did (the
facts are in docs/horovod_torch_api.md), and imports what it uses inside its body, so it works
wherever it is pasted, including in a notebook cell or a function pickled by TorchDistributor.
They are inserted at module level after the file's leading imports, once per file.
"""
from __future__ import annotations

from typing import Dict

HELPERS: Dict[str, str] = {
    "_native_allreduce": '''
def _native_allreduce(tensor, op="average", inplace=False, compression=None, prescale_factor=1.0,
                      postscale_factor=1.0):
    """hvd.allreduce on torch.distributed: reduce over all ranks into a new tensor (or in place).

    op is "average" (sum, then divide by the world size; integer tensors truncate, as Horovod
    did), "sum", "min", "max" or "product". compression=default_hooks.fp16_compress_hook (what
    hvd.Compression.fp16 became) reduces a floating tensor in float16; the scale factors multiply
    before and after the reduction. A tensor that requires grad goes through
    torch.distributed.nn, which is differentiable.
    """
    import torch
    import torch.distributed as dist

    ops = {"average": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
    if op not in ops:
        raise ValueError(f"allreduce op {op!r}: torch.distributed reduces with one of {sorted(ops)}"
                         + (" (Adasum has no torch.distributed equivalent)" if op == "adasum" else ""))
    world = dist.get_world_size()
    wire = None
    if compression is not None:
        wire = {"fp16_compress_hook": torch.float16, "bf16_compress_hook": torch.bfloat16}.get(
            getattr(compression, "__name__", None))
        if wire is None:
            raise ValueError(f"compression={compression!r}: expected None or DDP's fp16_compress_hook")
    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        if op not in ("average", "sum"):
            raise RuntimeError("differentiable allreduce supports only average and sum")
        import torch.distributed.nn.functional as dist_nn

        out = dist_nn.all_reduce(tensor * prescale_factor, op=dist.ReduceOp.SUM)
        return (out / world if op == "average" else out) * postscale_factor
    out = tensor.detach().clone() if not inplace or prescale_factor != 1.0 else tensor
    if prescale_factor != 1.0:
        out.mul_(prescale_factor)
    wired = out.to(wire) if wire is not None and out.is_floating_point() else out
    dist.all_reduce(wired, op=ops[op])
    if op == "average":  # in the wire's dtype, as Horovod scaled its compressed buffer
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
        return tensor
    return out
''',
    "_native_broadcast": '''
def _native_broadcast(tensor, root_rank, inplace=False):
    """hvd.broadcast on torch.distributed: root_rank's values, in a new tensor (or in place)."""
    import torch
    import torch.distributed as dist

    if tensor.requires_grad and torch.is_grad_enabled() and not inplace:
        raise RuntimeError("hvd.broadcast was differentiable; broadcast tensor.detach() instead")
    out = tensor if inplace else tensor.detach().clone()
    with torch.no_grad():
        dist.broadcast(out, src=root_rank)
    return out
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
    """hvd.broadcast_optimizer_state on torch.distributed, with Horovod's exact behaviour.

    Like Horovod, an optimizer with no state yet first takes one step on zero gradients to
    create its state (this advances e.g. Adam's step counter); then root_rank's state and
    options (lr, momentum, ...) are loaded on every rank.  On a fresh optimizer under DDP the
    call is not needed at all; removing it changes the trajectory slightly for stateful optimizers.
    """
    import torch
    import torch.distributed as dist

    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        optimizer.step()
        state_dict = optimizer.state_dict()
    box = [state_dict]
    dist.broadcast_object_list(box, src=root_rank)
    optimizer.load_state_dict(box[0])
''',
    "_native_broadcast_object": '''
def _native_broadcast_object(obj, root_rank=0):
    """hvd.broadcast_object on torch.distributed: root_rank's (picklable) object on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]
''',
    "_native_allgather": '''
def _native_allgather(tensor):
    """hvd.allgather on torch.distributed: every rank's tensor concatenated along dim 0, in rank
    order. The first dimension may differ between ranks: the sizes are gathered first and each
    tensor is padded to the largest. Differentiable as Horovod's was: the gradient is averaged
    over the ranks and each rank keeps the rows it gave.
    """
    import torch
    import torch.distributed as dist

    def gather(t):
        t = t.contiguous()
        rows = torch.tensor([t.shape[0]], device=t.device)
        sizes = [torch.zeros_like(rows) for _ in range(dist.get_world_size())]
        dist.all_gather(sizes, rows)
        sizes = [int(s.item()) for s in sizes]
        padded = t.new_zeros((max(sizes), *t.shape[1:]))
        padded[:t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)]), sizes

    class AllGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            out, sizes = gather(t)
            ctx.rows = (sum(sizes[:dist.get_rank()]), t.shape[0])
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous().clone()
            dist.all_reduce(grad)
            start, count = ctx.rows
            return grad[start:start + count] / dist.get_world_size()

    if tensor.requires_grad and torch.is_grad_enabled():
        return AllGather.apply(tensor)
    return gather(tensor.detach())[0]
''',
    "_native_distributed_optimizer": '''
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

        def _gradient_ready(self, p):
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
                grads.append(p.grad.reshape(-1))
            # one large gradient is reduced where it is (as Horovod did), several are packed
            flat = grads[0] if len(grads) == 1 and grads[0].data_ptr() == self._buckets[i][0].grad.data_ptr() \\
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
