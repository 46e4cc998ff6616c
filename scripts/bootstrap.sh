#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its test extra into it, every package at the
# version that constraints.txt (the lock) pins, so that every fresh machine gets the same test
# environment. Also installs, beside it, the oldest cloudpickle that setup.cfg allows, for the
# tests that run the ranks with it (tests/test_environment.py), and tf-keras without its dependencies
# (scripts/test_tf_keras.py). Idempotent: a second run only checks that everything is present.
# Prints the venv's python path on its last line.
#
# HOROVOD_COMPAT_VENV picks another venv, HOROVOD_COMPAT_CONSTRAINTS another constraints file, and
# HOROVOD_COMPAT_UPGRADE=1 installs again, upgrading everything to the newest releases those
# constraints allow (scripts/test_latest.sh uses the three).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${HOROVOD_COMPAT_VENV:-$root/.venv}"
constraints="${HOROVOD_COMPAT_CONSTRAINTS:-$root/constraints.txt}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location)
stamp="$venv/.horovod-compat-installed"
upgrade=()
if [ "${HOROVOD_COMPAT_UPGRADE:-0}" = 1 ]; then
  upgrade=(--upgrade --upgrade-strategy eager)
  rm -f "$stamp"
fi
if [ ! -f "$stamp" ] || [ "$root/setup.cfg" -nt "$stamp" ] || [ "$constraints" -nt "$stamp" ]; then
  echo "bootstrap: installing the project and its test dependencies into $venv (a few minutes on a fresh machine)" >&2
  "${pip[@]}" ${upgrade[@]+"${upgrade[@]}"} -c "$constraints" -e "$root[test]" >&2
  oldest=$(sed -n 's/^[[:space:]]*cloudpickle>=\([0-9][0-9.]*\)[[:space:]]*$/\1/p' "$root/setup.cfg")
  if [ -z "$oldest" ]; then
    echo "bootstrap: setup.cfg names no 'cloudpickle>=X.Y' minimum" >&2
    exit 1
  fi
  rm -rf "$venv/cloudpickle-oldest"
  "${pip[@]}" --no-deps --target "$venv/cloudpickle-oldest" "cloudpickle==$oldest" >&2
  touch "$stamp"
fi
# tf-keras, which pip would pair with the full `tensorflow` wheel: without dependencies, at the
# constraints' pin (a no-op once installed; see the script)
"$venv/bin/python" "$root/scripts/test_tf_keras.py" "$constraints" >&2
echo "$venv/bin/python"
