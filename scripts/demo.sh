#!/usr/bin/env bash
# Installs the project into .venv (first run only) and runs the demo on 2 local CPU ranks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
cd "$root"
exec "$python" examples/demo_torch_distributor.py "$@"
