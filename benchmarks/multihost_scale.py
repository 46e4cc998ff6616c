"""How hvd.allreduce's cost grows with ranks and hosts, measured on the simulated cluster and
extrapolated with a fitted model.

    python benchmarks/multihost_scale.py [--layouts 2x1,2x2,2x4,2x8,4x1,4x2,4x4] [--mib 1]

Needs root: it brings up `scripts/cluster.sh up 4` (no link cap: this measures per-op costs, not
bandwidth) and takes it down at the end. For each layout HOSTSxRANKS it runs the job of
benchmarks/multihost_allreduce.py and prints rank 0's medians: a 4-byte ``hvd.allreduce`` (the
per-op cost: one negotiation round over the set's mesh plus the data) beside gloo's
``dist.all_reduce``, and a --mib MiB allreduce.

Then it fits, by least squares over the layouts, the model of docs/multihost.md:

    per-op time(n) = o(n) * (a + b * (n - 1)),   o(n) = max(1, n / cores)

n ranks. The b term is the negotiation round: each rank exchanges one frame with each of its
n - 1 peers on the full mesh, then takes part in the 4-byte allreduce. o(n) is how many ranks
share each of this machine's cores: the ranks of one op all have to run. The script prints the
fitted a and b, and the model's per-op time for 256 and 1,024 ranks (8 per host) with a core per
rank. It also prints what a two-level negotiation among the h host leaders would take,
a + b * (h - 1), and the full mesh's connections and socket memory at those sizes.

Caveat: the fit comes from at most 16 ranks on 2 cores, so read the extrapolation as an order of
magnitude.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multihost_allreduce import CLUSTER, run_layout  # noqa: E402  (beside this script)

#: Socket buffer bytes a mesh connection may hold per direction (the mesh asks 4 MiB; Linux caps
#: it at net.core.{r,w}mem_max, read at run time).
def _socket_buffer_cap() -> int:
    caps = []
    for name in ("rmem_max", "wmem_max"):
        try:
            caps.append(int(Path(f"/proc/sys/net/core/{name}").read_text()))
        except (OSError, ValueError):
            caps.append(4 << 20)
    return min(4 << 20, max(caps))


def fit(rows: list, cores: int) -> tuple:
    """Least squares of t / o(n) = a + b (n - 1) over rows of (n, t), o(n) = max(1, n / cores)."""
    import numpy as np

    design = np.array([[1.0, n - 1] for n, _ in rows])
    times = np.array([t / max(1.0, n / cores) for n, t in rows])
    (a, b), *_ = np.linalg.lstsq(design, times, rcond=None)
    return float(a), float(b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="2x1,2x2,2x4,2x8,4x1,4x2,4x4")
    parser.add_argument("--mib", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    layouts = [tuple(int(v) for v in item.split("x")) for item in args.layouts.split(",")]
    up = subprocess.run(["bash", str(CLUSTER), "up", str(max(h for h, _ in layouts))],
                        capture_output=True, text=True)
    if up.returncode != 0:
        print(up.stderr, file=sys.stderr)
        return 1
    rows = []
    try:
        addresses = [line.split()[1] for line in up.stdout.splitlines() if line.strip()]
        print(f"uncapped links; medians (4 B: of 200, {args.mib} MiB: of {args.iters})")
        print(f"{'layout':>7} {'ranks':>5} {'hvd 4B us':>9} {'gloo 4B us':>10} "
              f"{f'hvd {args.mib}MiB ms':>12} {f'gloo {args.mib}MiB ms':>13}")
        with tempfile.TemporaryDirectory() as tmp:
            for hosts, per_host in layouts:
                f = run_layout(addresses[:hosts], per_host, args.mib, args.iters, Path(tmp))
                n = hosts * per_host
                rows.append((n, f["hvd_4b"]))
                print(f"{hosts}x{per_host:<5} {n:5d} {f['hvd_4b'] * 1e6:9.0f} "
                      f"{f['gloo_4b'] * 1e6:10.0f} {f['hvd'] * 1e3:12.1f} {f['gloo'] * 1e3:13.1f}",
                      flush=True)
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], check=True)
    cores = os.cpu_count() or 1
    a, b = fit(rows, cores)
    print(f"\nfit ({cores} cores): per-op 4-byte time = max(1, n/{cores}) x ({a * 1e6:.0f} us + "
          f"{b * 1e6:.0f} us x (n - 1))")
    buffer = _socket_buffer_cap()
    for n in (256, 1024):
        h = n // 8
        connections = n * (n - 1) // 2
        per_rank_mib = (n - 1) * 2 * buffer / 2**20
        print(f"  {n:5d} ranks on {h} hosts, a core each: full mesh {1e3 * (a + b * (n - 1)):.1f} ms "
              f"per op, {connections} connections, up to {per_rank_mib:.0f} MiB of socket buffers "
              f"per rank; negotiation among the {h} host leaders {1e3 * (a + b * (h - 1)):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
