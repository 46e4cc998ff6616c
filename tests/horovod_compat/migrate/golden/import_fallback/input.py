"""Horovod imported if present, as libraries and shared training scripts do."""
import torch

try:
    import horovod.torch as hvd
except (ImportError, ModuleNotFoundError):
    hvd = None


def main():
    assert hvd is not None, "Horovod is not installed"  # the import's own check: it goes with it
    hvd.init()
    torch.set_num_threads(int(hvd.local_size()))  # one int() in the output
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    print(f"rank {hvd.rank()} total {total.item()}")


if __name__ == "__main__":
    main()
