"""A driver script whose training function lives in __main__; prints rank 0's result."""
import sys

from distributor import TorchDistributor


def train(base):
    import os

    return base + int(os.environ["RANK"]) + int(os.environ["WORLD_SIZE"])


class Box:
    """A class defined in __main__ travels by value too."""

    def __init__(self, v):
        self.v = v


def train_box(box):
    return Box(box.v * 2)


if __name__ == "__main__":
    print("RESULT", TorchDistributor(num_processes=2, use_gpu=False).run(train, 40))
    print("BOX", TorchDistributor(num_processes=2, use_gpu=False).run(train_box, Box(21)).v)
    sys.stdout.flush()
