"""A driver whose ranks report their PIDs and sleep; the test SIGKILLs this process."""
from distributor import run_function


def sleeper():
    import os
    import time

    print(f"PID {os.getpid()}", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    run_function(sleeper, num_processes=2)
