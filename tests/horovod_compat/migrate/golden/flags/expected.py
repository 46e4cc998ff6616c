import os

import torch
import horovod.torch as hvd
import atexit
import gc
import torch.distributed as dist

# TODO(horovod-compat): HOROVOD_TIMELINE: has no effect without Horovod; record with torch.profiler instead (see the guide)
os.environ["HOROVOD_TIMELINE"] = "/dbfs/ml/timeline.json"
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
hvd.init()
# TODO(horovod-compat): hvd.start_timeline: the Horovod timeline has no native form; use torch.profiler (see the guide)
hvd.start_timeline("/tmp/timeline.json")
# TODO(horovod-compat): hvd.alltoall: dist.all_to_all_single takes explicit input/output split sizes; returned splits must be exchanged first
gathered = hvd.alltoall(torch.ones(dist.get_world_size()))
# TODO(horovod-compat): hvd.allreduce_async: hvd.allreduce_async() stays while Horovod calls remain in this file (its handle goes to hvd.synchronize/hvd.poll)
handle = hvd.allreduce_async(torch.ones(1), name="x")
# TODO(horovod-compat): hvd.synchronize: hvd.synchronize() stays while Horovod calls remain in this file
out = hvd.synchronize(handle)
# TODO(horovod-compat): hvd.join: hvd.join() stays while Horovod calls remain in this file (the native join stands in only for native collectives)
last = hvd.join()
# TODO(horovod-compat): hvd.SyncBatchNorm: use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP (it syncs only inside DDP)
bn = hvd.SyncBatchNorm(8)
# TODO(horovod-compat): hvd.ProcessSet: hvd.ProcessSet() stays while Horovod calls remain in this file (they need Horovod's sets)
evens = hvd.ProcessSet([0, 2])
# TODO(horovod-compat): hvd.Adasum: Adasum has no torch.distributed/DDP equivalent
op = hvd.Adasum
try:
    dist.barrier()
# TODO(horovod-compat): hvd.HorovodInternalError: kept: Horovod calls remain in this file and work with Horovod's own exception; once the file becomes native this is dist.DistBackendError
except hvd.HorovodInternalError:
    pass
# TODO(horovod-compat): hvd.stop_timeline: the Horovod timeline has no native form; use torch.profiler (see the guide)
hvd.stop_timeline()
# TODO(horovod-compat): hvd.barrier: argument process_set= is not rewritten while Horovod calls remain in this file
hvd.barrier(process_set=evens)
