#!/usr/bin/env bash
# The suite on the newest releases instead of the lock, so that an upstream change is found by us
# and not by a user. In .venv-latest (HOROVOD_COMPAT_LATEST_VENV picks another), every dependency
# is upgraded to its newest release; the script prints what differs from constraints.txt, then runs
# the whole suite there (extra arguments go to pytest). With --lock as the first argument, and only
# when the suite passes, it rewrites constraints.txt from that environment.
#
# torch and torchvision stay at the lock's versions: a newer torch from the registry is a
# multi-GB CUDA build. HOROVOD_COMPAT_LATEST_TORCH=1 takes their newest releases too (not with --lock).
# tf-keras, which the constraints here do not pin, is the newest release of the installed TensorFlow's
# minor version, installed without dependencies (scripts/test_tf_keras.py, run by bootstrap.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lock=0
if [ "${1:-}" = --lock ]; then
  lock=1
  shift
fi
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
if [ "${HOROVOD_COMPAT_LATEST_TORCH:-0}" = 1 ]; then
  if [ "$lock" = 1 ]; then
    echo "test_latest: --lock keeps the lock's CPU torch; run it without HOROVOD_COMPAT_LATEST_TORCH=1" >&2
    exit 2
  fi
else
  grep -E '^(torch|torchvision)==' "$root/constraints.txt" > "$pins"
fi
export HOROVOD_COMPAT_VENV="${HOROVOD_COMPAT_LATEST_VENV:-$root/.venv-latest}"
export HOROVOD_COMPAT_CONSTRAINTS="$pins"
python=$(HOROVOD_COMPAT_UPGRADE=1 bash "$root/scripts/bootstrap.sh" | tail -n 1)
if [ "${HOROVOD_COMPAT_LATEST_TORCH:-0}" = 1 ]; then
  "$python" -m pip install --quiet --disable-pip-version-check --upgrade torchvision >&2
fi
"$python" "$root/scripts/test_torchvision.py"  # as scripts/test.sh does: part of the environment
"$python" "$root/scripts/lock.py" drift "$python"
export HOROVOD_COMPAT_UNLOCKED=1  # tests/test_environment.py: this venv is not the lock
status=0
bash "$root/scripts/test.sh" "$@" || status=$?
if [ "$lock" = 1 ] && [ "$status" = 0 ]; then
  "$python" "$root/scripts/lock.py" write "$python"
fi
exit "$status"
