"""Style: classic horovod example script: argparse with --fp16-allreduce and --batches-per-allreduce, Compression chosen from the flag, `if __name__ == "__main__": main()`.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import horovod.torch as hvd


def get_args():
    parser = argparse.ArgumentParser(description="PyTorch synthetic Horovod example",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8, help="input batch size")
    parser.add_argument("--num-steps", type=int, default=5, help="number of optimizer steps")
    parser.add_argument("--lr", type=float, default=0.0125, help="learning rate for a single GPU")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--wd", type=float, default=5e-5, help="weight decay")
    parser.add_argument("--no-cuda", action="store_true", default=True, help="disables CUDA training")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--batches-per-allreduce", type=int, default=1,
                        help="number of batches processed locally before executing allreduce "
                             "across workers; it multiplies total batch size.")
    parser.add_argument("--use-adasum", action="store_true", default=False,
                        help="use adasum algorithm to do reduction")
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                        help="apply gradient predivide factor in optimizer (default: 1.0)")
    args, _unknown = parser.parse_known_args()
    return args


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, kernel_size=3)
        self.conv2 = nn.Conv2d(6, 8, kernel_size=3)
        self.fc1 = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.conv2(x))
        x = x.view(-1, 8 * 2 * 2)
        return F.log_softmax(self.fc1(x), dim=1)


def main():
    args = get_args()
    allreduce_batch_size = args.batch_size * args.batches_per_allreduce

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = Net()
    lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler,
                          momentum=args.momentum, weight_decay=args.wd)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(args.seed + hvd.rank())
    model.train()
    for step in range(args.num_steps):
        data = torch.randn(allreduce_batch_size, 3, 10, 10, generator=gen)
        target = torch.randint(0, 10, (allreduce_batch_size,), generator=gen)
        optimizer.zero_grad()
        # Split data into sub-batches of size batch_size
        for i in range(0, len(data), args.batch_size):
            data_batch = data[i:i + args.batch_size]
            target_batch = target[i:i + args.batch_size]
            output = model(data_batch)
            loss = F.nll_loss(output, target_batch)
            # Average gradients among sub-batches
            loss.div_(math.ceil(float(len(data)) / args.batch_size))
            loss.backward()
        # Gradient is applied across all ranks
        optimizer.step()
        print(f"CORPUS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"CORPUS rank={hvd.rank()} final={total:.6f}", flush=True)


if __name__ == "__main__":
    main()
