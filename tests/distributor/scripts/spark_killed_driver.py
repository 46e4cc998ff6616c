"""A Spark driver with its own local-cluster whose ranks report their PIDs and sleep; the test
SIGKILLs this process and checks that nothing it started on the executors survives."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spark_clusters import start_session  # noqa: E402

from distributor import TorchDistributor  # noqa: E402


def sleeper():
    import time

    print(f"PID {os.getpid()}", flush=True)
    time.sleep(300)


if __name__ == "__main__":
    start_session("local-cluster[1,2,1024]", "killed-driver", executors=1)
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(sleeper)
