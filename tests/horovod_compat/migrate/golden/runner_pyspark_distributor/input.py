# Half migrated: one job already runs on PySpark's TorchDistributor, one still on HorovodRunner.
# Either TorchDistributor has the same API, so the existing import is kept and none is added.
from pyspark.ml.torch.distributor import TorchDistributor
from sparkdl import HorovodRunner


def train(lr=0.01):
    return lr


TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 0.1)
HorovodRunner(np=-2).run(train, lr=0.1)
