#!/usr/bin/env bash
# The CUDA / NCCL check of horovod.torch, in one go, for a machine with a GPU (it also runs, and
# skips, on a machine without one):
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# 1. tests/gpu/test_cuda.py: the whole API on CUDA tensors in 1-rank jobs (a size-1 job still moves
#    CUDA tensors through a real NCCL communicator), DistributedOptimizer / broadcast helpers /
#    SyncBatchNorm on a CUDA model, `horovodrun --check-build`, 2 ranks on ONE GPU (NCCL refuses
#    them: the runtime must say so in bounded time), and 2 ranks on 2 GPUs where there are 2.
# 2. Horovod 0.28.1's own test_torch.py (its GPU tests run where CUDA is), in 1 rank twice: as a
#    plain `pytest` process (one hvd.init for the file) and under `horovodrun -np 1` (upstream's gloo
#    mode: init and shutdown around every test, so a fresh NCCL communicator per test). Not on 2
#    ranks with one GPU: upstream places rank r's tensors on cuda:r, which a 1-GPU machine lacks.
#    Both run in the background beside step 1 (so step 1's timings are taken on a shared GPU),
#    with a third run of the file with the GPU hidden: failures there are those of any 1-rank job,
#    and the summary lists the tests that fail only with the GPU.
#
# Logs go to OUT_DIR (default $OUT when set, else a new temporary folder): gpu_check.log (this
# script's summary, also printed), pytest_gpu.log, upstream_np1.log, upstream_horovodrun_np1.log,
# upstream_np1_cpu.log (the GPU hidden: the 1-rank baseline) and env.txt. Exit status 0 when step 1
# passed (or skipped), no upstream run crashed or hung, and no upstream test failed with the GPU
# that passes without it (a 1-rank job fails 16 of upstream's tests anyway: process sets equal
# to the global set, poll() of ops it completes at once, join's return value, torch's Muon); else 1.#
# Environment knobs:
#   PYTHON                    the Python to use (default the repo's .venv, else python3); the repo is
#                             put first on PYTHONPATH, so a bare checkout works without installing it
#   HOROVOD_UPSTREAM_DIR      a Horovod 0.28.1 tree holding test/parallel/test_torch.py and
#                             test/utils/common.py (default ../shared/upstream/horovod-0.28.1 beside
#                             the checkout); absent: step 2 is skipped, saying so
#   GPU_CHECK_UPSTREAM=0      skip step 2
#   GPU_CHECK_TIMEOUT=330     seconds each step may take before it is killed (a hang)
#   HOROVOD_COMPAT_GPU_LAUNCH_TIMEOUT=90   seconds one 2-rank launch of step 1 may take
#
# On a lent GPU machine whose command gets only the checkout: copy test_torch.py and common.py
# into an ignored folder of the checkout (e.g. .device_carry/horovod-0.28.1/test/{parallel,utils},
# the folder named in .git/info/exclude), carry it, and point HOROVOD_UPSTREAM_DIR at it:
#   PYTHON=python3 HOROVOD_UPSTREAM_DIR=$PWD/.device_carry/horovod-0.28.1 bash scripts/gpu_check.sh "$OUT"
# Steps 1 and 2 overlap and each is killed at GPU_CHECK_TIMEOUT, so the whole check ends within
# about that many seconds plus a minute (give the command 420 s).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-}}
out=${out:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$out"
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
upstream=${HOROVOD_UPSTREAM_DIR:-$root/../shared/upstream/horovod-0.28.1}
step_timeout=${GPU_CHECK_TIMEOUT:-330}
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-300} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export HOROVOD_COMPAT_GPU_LAUNCH_TIMEOUT=${HOROVOD_COMPAT_GPU_LAUNCH_TIMEOUT:-90}
log=$out/gpu_check.log
: > "$log"
say() { echo "$*" | tee -a "$log"; }
cd "$root" || exit 2

say "gpu_check: $(date -u +%FT%TZ) in $root; logs in $out"
{
    echo "python: $python"
    "$python" - <<'EOF'
import sys, torch, torch.distributed as dist
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "nccl", torch.cuda.nccl.version(),
          "nccl backend", dist.is_nccl_available())
EOF
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    git -C "$root" log -1 --format='commit %H %s' 2>/dev/null
    git -C "$root" status --short 2>/dev/null | sed 's/^/  /'
} > "$out/env.txt" 2>&1
sed 's/^/  /' "$out/env.txt" | tee -a "$log"
has_gpu=$("$python" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)

# ---- step 2, in the background: upstream's test_torch.py in one rank
upstream_pids=()
upstream_names=()
if [ "${GPU_CHECK_UPSTREAM:-1}" = 0 ]; then
    say "upstream: skipped (GPU_CHECK_UPSTREAM=0)"
elif [ ! -f "$upstream/test/parallel/test_torch.py" ] || [ ! -f "$upstream/test/utils/common.py" ]; then
    say "upstream: skipped: no test/parallel/test_torch.py and test/utils/common.py under $upstream" \
        "(set HOROVOD_UPSTREAM_DIR)"
else
    # upstream_conformance.sh's pytest plugin (stand-ins for the test helpers that are not part of
    # horovod.torch), taken from that script so that there is one copy of it
    mkdir -p "$out/plugin"
    sed -n '/^cat > "$out\/hvd_conformance_plugin.py" <<.EOF.$/,/^EOF$/p' "$root/scripts/upstream_conformance.sh" \
        | sed '1d;$d' > "$out/plugin/hvd_conformance_plugin.py"
    test_dir=$upstream/test/parallel
    pytest_args=(-v -rfEs --tb=short -p no:cacheprovider -p hvd_conformance_plugin --timeout=120
                 "$test_dir/test_torch.py")
    (cd "$test_dir" && PYTHONPATH="$out/plugin:$PYTHONPATH" timeout -k 20 "$step_timeout" \
        "$python" -m pytest "${pytest_args[@]}" > "$out/upstream_np1.log" 2>&1) &
    upstream_pids+=($!); upstream_names+=(upstream_np1)
    (cd "$test_dir" && PYTHONPATH="$out/plugin:$PYTHONPATH" HOROVOD_COMPAT_OP_TIMEOUT=120 \
        timeout -k 20 "$step_timeout" "$python" -m horovod_compat.run -np 1 \
        "$python" -m pytest "${pytest_args[@]}" > "$out/upstream_horovodrun_np1.log" 2>&1) &
    upstream_pids+=($!); upstream_names+=(upstream_horovodrun_np1)
    # the same file with the GPU hidden: the baseline that tells a CUDA failure from a test that
    # fails in any 1-rank job (process sets equal to the global set, poll() of ops a 1-rank job
    # completes at once, join's return value)
    (cd "$test_dir" && PYTHONPATH="$out/plugin:$PYTHONPATH" CUDA_VISIBLE_DEVICES= \
        timeout -k 20 "$step_timeout" "$python" -m pytest "${pytest_args[@]}" > "$out/upstream_np1_cpu.log" 2>&1) &
    upstream_pids+=($!); upstream_names+=(upstream_np1_cpu)
    say "upstream: $test_dir/test_torch.py running in the background (plain pytest, horovodrun -np 1," \
        "and plain pytest with the GPU hidden)"
fi

# ---- step 1: our CUDA tests
started=$(date +%s)
timeout -k 20 "$step_timeout" "$python" -m pytest -v -s -rA --tb=short -p no:cacheprovider --noconftest \
    "$root/tests/gpu/test_cuda.py" > "$out/pytest_gpu.log" 2>&1
status=$?
bad=0
say ""
say "tests/gpu/test_cuda.py: exit $status in $(( $(date +%s) - started )) s"
# (-s: a test's output stands between its name and its outcome; -rA lists the outcomes at the end)
grep -E '^(PASSED|SKIPPED|FAILED|ERROR) ' "$out/pytest_gpu.log" | cut -c1-600 | sed 's/^/  /' | tee -a "$log"
grep -hoE 'CHECK .* FAIL.*|CHECK [a-z_]+(\[[^]]*\])? ok [0-9.]+ .*|OUTCOME.*|INFO size=.*' "$out/pytest_gpu.log" \
    | sed -E 's/^\[[0-9]+\]<std(out|err)>://' | sort -u | sed 's/^/  /' | tee -a "$log"
case "$status" in 0|5) ;; *) bad=1 ;; esac

# ---- step 2's results
# failed NAME -> the tests that log NAME reports FAILED or ERROR, one per line
failed() { grep -oE '::test_[A-Za-z0-9_]+ (FAILED|ERROR)' "$out/$1.log" | cut -d' ' -f1 | cut -c3- | sort -u; }
for i in "${!upstream_pids[@]}"; do
    wait "${upstream_pids[$i]}"
    code=$?
    name=${upstream_names[$i]}
    file=$out/$name.log
    # horovodrun prefixes each line with the rank's "[0]<stdout>:"
    sed -i -E 's/^\[[0-9]+\]<std(out|err)>://' "$file"
    say ""
    say "$name: exit $code$( [ "$code" = 124 ] || [ "$code" = 137 ] && echo ' (killed at the step timeout: hung or too slow)')"
    say "  passed $(grep -cE '::test_[A-Za-z0-9_]+ PASSED' "$file")" \
        "failed $(grep -cE '::test_[A-Za-z0-9_]+ (FAILED|ERROR)' "$file")" \
        "skipped $(grep -cE '::test_[A-Za-z0-9_]+ SKIPPED' "$file")"
    grep -E '^=+ .* in [0-9.]+s' "$file" | tail -n 1 | sed -E 's/^=+ (.*) =+$/  \1/' | tee -a "$log"
    grep -E '^(FAILED|ERROR) ' "$file" | cut -c1-400 | sed 's/^/  /' | tee -a "$log"
    grep -E '^SKIPPED ' "$file" | cut -c1-200 | sort | uniq -c | sed 's/^/  /' | tee -a "$log"
    # 1: some tests failed, which a 1-rank job always has (see the GPU-only list below); more is a
    # crash, a hang or a file that did not run
    case "$code" in 0|1|5) ;; *) bad=1 ;; esac
done
# GPU-only upstream tests that fail in a 1-rank job under any implementation, with the reason
size_one_failures=(
    "test_horovod_sync_batch_norm: its reference torch.nn.BatchNorm1d gets a batch of one value per
    channel (the second input is [size, 4, 1]) and raises 'Expected more than 1 value per channel
    when training' on 1 rank"
)
if [ -f "$out/upstream_np1_cpu.log" ] && [ "$has_gpu" = 1 ]; then
    say ""
    say "upstream GPU tests that fail in any 1-rank job (not counted):"
    for reason in "${size_one_failures[@]}"; do say "  $(echo $reason)"; done
    say ""
    say "upstream tests that fail with the GPU and pass without it (the CUDA failures):"
    for name in upstream_np1 upstream_horovodrun_np1; do
        gpu_only=$(comm -23 <(failed "$name") <(failed upstream_np1_cpu) \
                   | grep -vxF -f <(printf '%s\n' "${size_one_failures[@]}" | grep -o '^test_[a-z_0-9]*'))
        [ -z "$gpu_only" ] || bad=1
        echo "${gpu_only:-(none)}" | sed "s/^/  $name: /" | tee -a "$log"
    done
fi
rm -rf "$out/plugin"
say ""
say "gpu_check: $( [ "$bad" = 0 ] && echo passed || echo FAILED ); logs in $out"
exit "$bad"
