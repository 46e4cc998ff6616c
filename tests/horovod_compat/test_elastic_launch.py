"""Elastic jobs through Horovod's front ends, end to end: `horovodrun --host-discovery-script` where
the script's answer changes so a third worker joins, and `horovod.run(min_num_proc=...)` where a
worker is SIGKILLed. Real processes, the real elastic engine and hvd.elastic."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import horovod

TRAIN = textwrap.dedent("""\
    import sys, time
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = hvd.elastic.TorchState(model, optimizer, batch=0, at_three=0)

    @hvd.elastic.run
    def train(state):
        while state.at_three < 5:  # five committed steps with three workers, then done
            size = int(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
            if hvd.rank() == 0:
                print(f"step {state.batch} size {size}", flush=True)
            state.batch += 1
            state.at_three += size == 3
            if state.batch > 2000:
                raise RuntimeError("the third worker never joined")
            time.sleep(0.05)
            state.commit()
        return state.batch

    train(state)
    print(f"done rank {hvd.rank()} of {hvd.size()}", flush=True)
""")


def test_horovodrun_discovery_adds_a_third_worker_while_the_job_runs(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovod_compat.run", "-np", "2", "--min-np", "1", "--max-np", "3",
         "--host-discovery-script", str(discover), sys.executable, str(train)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "size 2" in line and hosts.read_text() == "localhost:2\n":
                hosts.write_text("localhost:3\n")  # discovery now offers a third slot
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "\n".join(lines)
    assert code == 0, output
    assert any("size 2" in line for line in lines) and any("size 3" in line for line in lines), output
    done = sorted(line.split(">:", 1)[1] for line in lines if "done rank" in line)
    assert done == ["done rank 0 of 3", "done rank 1 of 3", "done rank 2 of 3"], output
    assert any(line.startswith("[2]<stdout>:") for line in lines), "worker id 2 was never started"


def _train_and_kill_one(marker):
    import os
    import signal

    import torch

    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    state = hvd.elastic.ObjectState(batch=0, total=0.0)

    @hvd.elastic.run
    def train(state):
        while state.batch < 20:
            if state.batch == 8 and hvd.rank() == 1 and not os.path.exists(marker):
                open(marker, "w").write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            state.total += hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
            state.batch += 1
            state.commit()
        return state.batch, hvd.size()

    return train(state)


def test_horovod_run_finishes_after_a_worker_is_sigkilled(tmp_path):
    marker = tmp_path / "killed"
    results = horovod.run(_train_and_kill_one, args=(str(marker),), num_proc=2, min_num_proc=1)
    killed = int(marker.read_text())
    assert results and all(batch == 20 for batch, _ in results), results
    assert all(size in (1, 2) for _, size in results), results
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{killed}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{killed}") or \
        open(f"/proc/{killed}/stat").read().split()[2] == "Z", "the killed worker still runs"


def test_horovodrun_elastic_does_not_retry_a_user_exception_forever(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent("""\
        import horovod.torch as hvd

        hvd.init()
        state = hvd.elastic.ObjectState(step=0)

        @hvd.elastic.run
        def train(state):
            raise ValueError("bug in the training code")

        train(state)
    """))
    done = subprocess.run([sys.executable, "-m", "horovod_compat.run", "-np", "1", "--min-np", "1",
                           sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "The elastic job failed" in done.stderr and "bug in the training code" in done.stderr
