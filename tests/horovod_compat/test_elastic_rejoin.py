"""A worker of an elastic job whose ``init_process_group`` failed in one round forms the next
round with a member that never failed (`lifecycle._forget_failed_init`).

torch names the default group by a counter that a failed init leaves advanced; without the reset
the two would wait for each other's keys under different prefixes of the round's store (the
elastic ``init`` chaos case hung so, about once in 30 runs under load). Two real processes, a
real store, gloo."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]

#: Both members: round 2's init, then one allreduce. The one that failed round 1 first joins it
#: through a store whose round lost its other member, as `RoundStore` ends such a join.
MEMBER = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from distributor.elastic.store import RoundStore
    from horovod_compat.common import lifecycle

    port, rank, failed_before, reset = (int(a) for a in sys.argv[1:])
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    if failed_before:
        lost_round = RoundStore(dist.PrefixStore("round1", client), 1, lambda: 1)
        try:
            dist.init_process_group("gloo", store=lost_round, rank=rank, world_size=2)
        except Exception as exc:
            print("round 1 failed:", type(exc).__name__, flush=True)
        else:
            sys.exit("round 1 formed although its other member was lost")
        if reset:
            lifecycle._forget_failed_init()
    dist.init_process_group("gloo", store=dist.PrefixStore("round2", client), rank=rank,
                            world_size=2, timeout=timedelta(seconds=8))
    t = torch.ones(1)
    dist.all_reduce(t)
    print("allreduce", t.item(), flush=True)
    dist.destroy_process_group()
""")


def _round_two(reset: bool) -> list:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, str(server.port), str(rank),
                               str(int(rank == 0)), str(int(reset))],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
             for rank in (0, 1)]
    try:
        return [(p.wait(timeout=90), p.stdout.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_worker_whose_init_failed_forms_the_next_round_with_a_fresh_member():
    results = _round_two(reset=True)
    for rc, output in results:
        assert rc == 0, output
        assert "allreduce 2.0" in output, output
    assert "round 1 failed" in results[0][1]


def test_without_the_reset_the_two_wait_for_each_other_until_the_timeout():
    """The regression it guards: the failed init's counter splits the round's keys."""
    results = _round_two(reset=False)
    assert all(rc != 0 for rc, _ in results), results
    # each waited under its own group's prefix: "/round2/0//..." and "/round2/1//..."
    assert all("wait timeout" in output for _, output in results), results
