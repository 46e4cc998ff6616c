#!/usr/bin/env bash
# Installs the project with its test extra into .venv (first run only) and runs the whole suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
cd "$root"
# Test environment only: Horovod's upstream examples import torchvision (see the script).
"$python" scripts/test_torchvision.py
exec "$python" -m pytest tests "$@"
