"""Horovod imported if present, as libraries and shared training scripts do."""
import torch

try:
    import horovod.torch as hvd
except (ImportError, ModuleNotFoundError):
    hvd = None


def main():
    hvd.init()
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    print(f"rank {hvd.rank()} total {total.item()}")


if __name__ == "__main__":
    main()
