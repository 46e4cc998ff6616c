import os

import torch
import horovod.torch as hvd

os.environ["HOROVOD_TIMELINE"] = "/dbfs/ml/timeline.json"
hvd.init()
hvd.start_timeline("/tmp/timeline.json")
gathered = hvd.alltoall(torch.ones(hvd.size()))
handle = hvd.allreduce_async(torch.ones(1), name="x")
out = hvd.synchronize(handle)
last = hvd.join()
bn = hvd.SyncBatchNorm(8)
evens = hvd.ProcessSet([0, 2])
op = hvd.Adasum
try:
    hvd.barrier()
except hvd.HorovodInternalError:
    pass
hvd.stop_timeline()
hvd.barrier(process_set=evens)
