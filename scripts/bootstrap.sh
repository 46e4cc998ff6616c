#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its test extra into it. Idempotent: a second
# run only checks that everything is present. Prints the venv's python path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${HOROVOD_COMPAT_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
stamp="$venv/.horovod-compat-installed"
if [ ! -f "$stamp" ] || [ "$root/setup.cfg" -nt "$stamp" ] || [ "$root/constraints.txt" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    -c "$root/constraints.txt" -e "$root[test]" >&2
  touch "$stamp"
fi
echo "$venv/bin/python"
