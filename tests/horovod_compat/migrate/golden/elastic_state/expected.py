import torch
import atexit
import gc
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


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
dataset = list(range(64))
sampler = _NativeElasticSampler(dataset, shuffle=False)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * dist.get_world_size())
ddp_model = DDP(model, forward_sync_buffers=False)


def train(state):
    for state.epoch in range(state.epoch, 3):
        for state.batch, x in enumerate(loader):
            state.optimizer.zero_grad()
            state.model(x.float().unsqueeze(1)).sum().backward()
            state.optimizer.step()
            state.sampler.record_batch(state.batch, 8)
            state.commit()
        state.sampler.set_epoch(state.epoch + 1)


def on_reset():
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * dist.get_world_size()


state = _NativeElasticState(ddp_model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_reset])
train(state)
