"""A script written for torchrun: reads its rank from the environment, takes argv."""
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

dist.init_process_group("gloo")
value = torch.tensor([args.scale * (dist.get_rank() + 1)])
dist.all_reduce(value)
with open(f"{args.out}.{dist.get_rank()}", "w") as f:
    f.write(f"{value.item()} {os.environ['LOCAL_RANK']} {__name__}")
print(f"rank {dist.get_rank()} sum {value.item()}")
dist.destroy_process_group()
