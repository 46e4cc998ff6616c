"""hvd.allreduce inside horovod.ray's RayExecutor actors beside the same program under horovodrun,
on one node (shared memory) and, with --hosts, across the simulated hosts (the TCP mesh).

    python benchmarks/ray_allreduce.py [--repeats 3]               # one node: local Ray, 2 workers
    python benchmarks/ray_allreduce.py --hosts [--rate 1gbit]      # 2 simulated hosts, 2x1 and 2x2

Both sides run one rank function (RANK_PROGRAM): ``hvd.allreduce(x, op=Sum)`` of 4 B, 1 MiB and
64 MiB of float32, each round timed after a barrier, the median of its rounds, the slowest rank's;
each side also names the path that carried each size (``transport_name``: SHM, TCP or HOSTS, the
host-aware one). In every repeat the two sides take turns, so a change of load spreads over both;
the table gives the medians over the repeats and their ratio Ray / horovodrun (issue 45's target:
the same figures, ~1.0).

* One node: a local Ray cluster with one CPU per worker, ``RayExecutor(num_workers=2)``, against
  ``horovodrun -np 2``.
* ``--hosts`` (root): ``scripts/cluster.sh up 2 RATE`` (each host's link capped both ways), a Ray
  head here and a Ray node of 2 CPUs on each host (scripts/ray_nodes.py); per layout HOSTSxRANKS
  ``RayExecutor(num_hosts=H, num_workers_per_host=R)`` against ``horovodrun -np H*R -H
  a:R,b:R`` over ssh. The cluster is taken down at the end, whatever happened.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "cluster.sh"

RANK_PROGRAM = textwrap.dedent("""\
    import json, socket, statistics, time
    import torch
    import horovod.torch as hvd
    from horovod_compat.common.collectives import transport_name

    SIZES = ((1, 200), (1 << 18, 20), (1 << 24, 10))  # float32 elements, timed rounds

    def allreduce_figures():
        torch.set_num_threads(1)
        hvd.init()
        seconds, paths = {}, {}
        for elements, rounds in SIZES:
            x = torch.ones(elements)
            spans = []
            for _ in range(rounds + 1):  # the first: warm-up (connections, buffers)
                hvd.barrier()
                start = time.perf_counter()
                out = hvd.allreduce(x, op=hvd.Sum, name=f"bench.{elements}")
                spans.append(time.perf_counter() - start)
            assert out[0].item() == hvd.size(), out[0]
            seconds[elements * 4] = statistics.median(spans[1:])
            paths[elements * 4] = transport_name(x, hvd.Sum, None) or "backend"
        return {"rank": hvd.rank(), "host": socket.gethostname(), "seconds": seconds, "paths": paths}

    if __name__ == "__main__":
        print("BENCH " + json.dumps(allreduce_figures()), flush=True)
    """)


def slowest(ranks: list) -> dict:
    """{bytes: the slowest rank's seconds}, {bytes: path} from every rank's figures."""
    sizes = ranks[0]["seconds"]
    return ({int(b): max(r["seconds"][b] for r in ranks) for b in sizes},
            {int(b): "/".join(sorted({r["paths"][b] for r in ranks})) for b in sizes})


def under_horovodrun(program: Path, np: int, hosts: str = None) -> list:
    done = subprocess.run(
        [sys.executable, "-m", "horovod_compat.run", "-np", str(np), *(["-H", hosts] if hosts else []),
         sys.executable, str(program)],
        capture_output=True, text=True, timeout=900, cwd=program.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    ranks = [json.loads(m) for m in re.findall(r"BENCH (\{.*\})", done.stdout)]
    if done.returncode != 0 or len(ranks) != np:
        raise RuntimeError(f"horovodrun -np {np} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return ranks


def in_ray(module, **placement) -> list:
    from horovod.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), **placement)
    executor.start()
    try:
        return executor.run(module.allreduce_figures)
    finally:
        executor.shutdown()


def compare(label: str, module, program: Path, repeats: int, placement: dict, np: int,
            hosts: str = None) -> None:
    ray_runs, hvd_runs = [], []
    for _ in range(repeats):
        ray_runs.append(slowest(in_ray(module, **placement)))
        hvd_runs.append(slowest(under_horovodrun(program, np, hosts)))
    for size in ray_runs[0][0]:
        ray_s = statistics.median(run[0][size] for run in ray_runs)
        hvd_s = statistics.median(run[0][size] for run in hvd_runs)
        paths = {run[1][size] for run in ray_runs + hvd_runs}
        shown = f"{size} B" if size < 1 << 20 else f"{size >> 20} MiB"
        print(f"{label:<10} {shown:>7} {'/'.join(sorted(paths)):>8} {ray_s * 1e3:>12.3f} "
              f"{hvd_s * 1e3:>14.3f} {ray_s / hvd_s:>7.2f}   Ray rounds: "
              + ", ".join(f"{run[0][size] * 1e3:.3f}" for run in ray_runs), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", action="store_true", help="across 2 simulated hosts (root)")
    parser.add_argument("--rate", default="1gbit", help="each host's link cap with --hosts (tc rate)")
    args = parser.parse_args()

    import ray
    import ray.cloudpickle

    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "ray_allreduce_rank.py"
        program.write_text(RANK_PROGRAM)
        sys.path.insert(0, tmp)
        import ray_allreduce_rank

        ray.cloudpickle.register_pickle_by_value(ray_allreduce_rank)
        print(f"hvd.allreduce(op=Sum), float32, median of each size's rounds, slowest rank; "
              f"median of {args.repeats} repeats (Ray {ray.__version__})")
        print(f"{'layout':<10} {'size':>7} {'path':>8} {'Ray ms':>12} {'horovodrun ms':>14} {'ratio':>7}")
        if not args.hosts:
            ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False,
                     log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
            try:
                compare("1 node x2", ray_allreduce_rank, program, args.repeats, {"num_workers": 2}, 2)
            finally:
                ray.shutdown()
            return 0
        sys.path.insert(0, str(ROOT / "scripts"))
        from ray_nodes import ray_on_hosts

        up = subprocess.run(["bash", str(CLUSTER), "up", "2", args.rate], capture_output=True, text=True)
        if up.returncode != 0:
            print(up.stderr, file=sys.stderr)
            return 1
        try:
            hosts = [tuple(line.split()) for line in up.stdout.splitlines() if line.strip()]

            # (the hosts' Ray nodes are ended with every other process there by `cluster.sh down`)
            with ray_on_hosts(hosts, 2, Path(tmp), stop_host=lambda name: None):
                print(f"(links capped at {args.rate} per host both ways)")
                for per_host in (1, 2):
                    spec = ",".join(f"{address}:{per_host}" for _, address in hosts)
                    compare(f"2 hosts x{per_host}", ray_allreduce_rank, program, args.repeats,
                            {"num_hosts": 2, "num_workers_per_host": per_host}, 2 * per_host, spec)
        finally:
            subprocess.run(["bash", str(CLUSTER), "down"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
