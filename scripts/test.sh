#!/usr/bin/env bash
# Installs the project with its test extra into .venv (first run only) and runs the whole suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
cd "$root"
# Test environment only: Horovod's upstream examples import torchvision (see the script).
"$python" scripts/test_torchvision.py
# Two workers (pytest-xdist), one test file at a time each (tests/conftest.py groups them);
# HOROVOD_COMPAT_TEST_WORKERS=0 runs everything in this process, one test after another.
# --time-table PATH writes what each file and test cost (tests/timetable.py).
exec "$python" -m pytest -n "${HOROVOD_COMPAT_TEST_WORKERS:-2}" --dist loadfile tests "$@"
