#!/usr/bin/env bash
# Installs the project with its test extra into .venv (first run only) and runs the whole suite.
#
# Two workers (pytest-xdist), one test file at a time each (tests/conftest.py groups them);
# HOROVOD_COMPAT_TEST_WORKERS=0 runs everything in this process, one test after another.
# --time-table PATH writes what each file and test cost (tests/timetable.py).
# HOROVOD_COMPAT_TEST_LOAD=N runs N busy loops beside the suite, for the whole run (docs/testing.md:
# no test may depend on the machine's speed; this is how that is checked). They are stopped by PID
# when pytest ends, whatever its outcome.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
cd "$root"
# Test environment only: Horovod's upstream examples import torchvision (see the script).
"$python" scripts/test_torchvision.py
load=${HOROVOD_COMPAT_TEST_LOAD:-0}
if ! [[ "$load" =~ ^[0-9]+$ ]]; then
  echo "scripts/test.sh: HOROVOD_COMPAT_TEST_LOAD must be a number of busy loops (0, 1, 2...), got '$load'" >&2
  exit 2
fi
if [ "$load" -eq 0 ]; then
  exec "$python" -m pytest -n "${HOROVOD_COMPAT_TEST_WORKERS:-2}" --dist loadfile tests "$@"
fi
busy=()
pytest_pid=
stop() {
  [ -z "$pytest_pid" ] || kill "$pytest_pid" 2>/dev/null || true
  kill "${busy[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for _ in $(seq "$load"); do
  ( while :; do :; done ) &
  busy+=($!)
done
echo "scripts/test.sh: $load busy loop(s) beside the suite (PIDs ${busy[*]})" >&2
# pytest in the background and `wait`, so that a TERM or INT stops it and the loops at once
"$python" -m pytest -n "${HOROVOD_COMPAT_TEST_WORKERS:-2}" --dist loadfile tests "$@" &
pytest_pid=$!
status=0
wait "$pytest_pid" || status=$?
pytest_pid=
exit "$status"
