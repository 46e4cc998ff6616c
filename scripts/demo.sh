#!/usr/bin/env bash
# Installs the project into .venv (first run only) and runs the demo: an unchanged Horovod
# training function on 2 local CPU ranks (HorovodRunner(np=-2), the driver-only mode).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
cd "$root"
exec "$python" examples/demo_horovod.py "$@"
