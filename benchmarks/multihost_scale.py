"""How hvd.allreduce's cost grows with ranks and hosts, measured on the simulated cluster and
extrapolated with a fitted model.

    python benchmarks/multihost_scale.py [--layouts 2x1,2x2,2x4,2x8,4x1,4x2,4x4] [--mib 1]

Needs root: it brings up `scripts/cluster.sh up 4` (no link cap: this measures per-op costs, not
bandwidth) and takes it down at the end. For each layout HOSTSxRANKS it runs the job of
benchmarks/multihost_allreduce.py and prints rank 0's medians: a 4-byte ``hvd.allreduce`` (the
per-op cost: one negotiation round over the set's mesh plus the data) beside gloo's
``dist.all_reduce``, and a --mib MiB allreduce.

Then it fits, by least squares over the layouts, the model of docs/multihost.md:

    per-op time(n, h) = a + b * (n - 1) + c * (h - 1)

n ranks, h hosts. The b term is a negotiation round, in which each rank exchanges one frame with
each of its n - 1 peers on the full mesh. The c term is the host-aware allreduce's 2(h - 1) ring
steps across hosts. The script prints the fitted a, b and c, and the model's per-op time for
256 and 1,024 ranks (8 ranks per host), with the mesh's connections and socket memory at those
sizes.

Caveat: this machine has 2 cores, so beyond 2 ranks the ranks share them and b includes
scheduling. Read the extrapolation as an order of magnitude.
"""
from __future__ import annotations

import argparse
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


def fit(rows: list) -> tuple:
    """Least squares of t = a + b (n - 1) + c (h - 1) over rows of (n, h, t)."""
    import numpy as np

    design = np.array([[1.0, n - 1, h - 1] for n, h, _ in rows])
    times = np.array([t for _, _, t in rows])
    (a, b, c), *_ = np.linalg.lstsq(design, times, rcond=None)
    return float(a), float(b), float(c)


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
                rows.append((n, hosts, f["hvd_4b"]))
                print(f"{hosts}x{per_host:<5} {n:5d} {f['hvd_4b'] * 1e6:9.0f} "
                      f"{f['gloo_4b'] * 1e6:10.0f} {f['hvd'] * 1e3:12.1f} {f['gloo'] * 1e3:13.1f}",
                      flush=True)
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], check=True)
    a, b, c = fit(rows)
    print(f"\nfit: per-op 4-byte time = {a * 1e6:.0f} us + {b * 1e6:.0f} us x (n - 1) "
          f"+ {c * 1e6:.0f} us x (h - 1)")
    buffer = _socket_buffer_cap()
    for n in (256, 1024):
        h = n // 8
        connections = n * (n - 1) // 2
        per_rank_mib = (n - 1) * 2 * buffer / 2**20
        print(f"  {n:5d} ranks on {h} hosts: model {1e3 * (a + b * (n - 1) + c * (h - 1)):.1f} ms "
              f"per op; the full mesh would hold {connections} connections, up to "
              f"{per_rank_mib:.0f} MiB of socket buffers per rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
