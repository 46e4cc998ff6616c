"""An elastic horovodrun job across the simulated hosts: it starts on one host, a second host
that the discovery script adds joins, then that whole host is lost (every process on it killed,
its address dropped from the discovery script's answer) and the job goes on and finishes on the
first. Unchanged Horovod elastic code (hvd.elastic.run, TorchState, commit)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

TRAIN = textwrap.dedent("""\
    import socket, time
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = hvd.elastic.TorchState(model, optimizer, batch=0, most=0, after=0)

    @hvd.elastic.run
    def train(state):
        while state.after < 5:  # five committed steps back on one host after both were up
            size = int(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
            hosts = sorted(set(hvd.allgather_object(socket.gethostname())))
            if hvd.rank() == 0:
                print(f"step {state.batch} size {size} hosts {','.join(hosts)}", flush=True)
            state.batch += 1
            state.most = max(state.most, size)
            state.after += state.most == 4 and size == 2
            if state.batch > 3000:
                raise RuntimeError("the job never grew to 4 and back")
            time.sleep(0.05)
            state.commit()

    train(state)
    print(f"done rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()}", flush=True)
""")


def test_a_host_joins_then_is_lost_and_the_job_finishes(cluster, tmp_path):
    (first, a), (second, b) = cluster.hosts
    (tmp_path / "train.py").write_text(TRAIN)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{a}:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovod_compat.run", "-np", "2", "--min-np", "2", "--max-np", "4",
         "--host-discovery-script", str(discover), sys.executable, str(tmp_path / "train.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines, phase, lost_at = [], "one host", None
    deadline = time.monotonic() + 300
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if phase == "one host" and f"size 2 hosts {first}" in line:
                hosts.write_text(f"{a}:2\n{b}:2\n")  # the second host appears
                phase = "joining"
            elif phase == "joining" and f"size 4 hosts {first},{second}" in line:
                hosts.write_text(f"{a}:2\n")  # ... and is lost: gone from discovery, all killed
                lost_at = len(lines)
                cluster.kill_all(second)
                phase = "lost"
            assert time.monotonic() < deadline, "\n".join(lines[-40:])
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "\n".join(lines)
    assert proc.returncode == 0, output[-6000:]
    assert phase == "lost" and lost_at is not None, output[-4000:]
    after = lines[lost_at:]
    assert any(f"size 2 hosts {first}" in line for line in after), output[-4000:]
    done = sorted(line.split(">:", 1)[-1] for line in lines if "done rank" in line)
    assert done == [f"done rank 0 of 2 on {first}", f"done rank 1 of 2 on {first}"], output[-4000:]
