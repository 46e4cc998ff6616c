import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.Adam(model.parameters())
if hvd.rank() == 0:
    model.load_state_dict(torch.load("/tmp/ckpt.pt"))
# Only rank 0 loaded the checkpoint: these broadcasts must stay.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
start_epoch = hvd.broadcast_object(7, root_rank=0)
best = hvd.broadcast_object(0.5, 0, "best_metric")  # the name as the third positional argument
everyone = hvd.allgather_object({"rank": hvd.rank()})
weights = hvd.broadcast(torch.ones(3), 0)
