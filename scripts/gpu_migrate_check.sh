#!/usr/bin/env bash
# The rewriter's output on a GPU machine, for a machine that has one (it also runs without one):
#
#   scripts/gpu_migrate_check.sh [OUT_DIR]
#
# Three corpus programs (tests/horovod_compat/migrate/corpus): d04 (model and data on the GPU),
# a03 (model on the GPU, a metric averaged on the CPU) and a06 (a CPU model). Each runs as the
# original on horovod-compat (`python -m horovod_compat.run -np 1`) and as the rewriter's output
# under torchrun (`python -m torch.distributed.run --standalone --nproc_per_node 1`); the rewriter
# runs on that machine, so it writes for the torch it finds there. The script prints, per program,
# whether the output printed the original's losses and final weights (its CORPUS lines).
#
# Exit 0 when every output ran and printed the original's numbers, else 1. Logs in OUT_DIR (default
# $OUT when set, else a new temporary folder). PYTHON: the Python to use (default python3). The
# rewriter needs libcst there (a GPU machine without a registry: carry its wheel, see
# /work/.library/device/README.md in this workplace, and put it on PYTHONPATH).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-}}
out=${out:-$(mktemp -d /tmp/gpu_migrate_check.XXXXXX)}
mkdir -p "$out/programs"
python=${PYTHON:-python3}
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" CORPUS_TMP="$out/programs" PYTHONUNBUFFERED=1
bad=0
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
for program in d04_device_warmup a03_example_flags a06_grad_accum; do
    cp "$root/tests/horovod_compat/migrate/corpus/$program.py" "$out/programs/$program.py"
    "$python" -m horovod_compat.migrate "$out/programs/$program.py" -o "$out/programs/${program}_ddp.py" \
        > "$out/$program.migrate.log" 2>&1 || { echo "$program: the rewriter left work (see $program.migrate.log)"; bad=1; }
    for side in original ddp; do
        if [ $side = original ]; then
            cmd=("$python" -m horovod_compat.run -np 1 "$python" "$out/programs/$program.py")
        else
            cmd=("$python" -m torch.distributed.run --standalone --nproc_per_node 1 "$out/programs/${program}_ddp.py")
        fi
        (cd "$out/programs" && timeout -k 5 180 "${cmd[@]}") > "$out/$program.$side.log" 2>&1
        echo "$?" > "$out/$program.$side.rc"
        grep -oE "CORPUS rank=[0-9]+ (step=[0-9]+ loss|final)=-?[0-9.]+" "$out/$program.$side.log" | sort \
            > "$out/$program.$side.txt"
    done
    lines=$(wc -l < "$out/$program.original.txt")
    if [ "$(cat "$out/$program.ddp.rc")" != 0 ]; then
        echo "$program: the output FAILED (exit $(cat "$out/$program.ddp.rc")): $(grep -E 'Error' "$out/$program.ddp.log" | head -1 | cut -c1-200)"
        bad=1
    elif [ "$lines" -gt 0 ] && cmp -s "$out/$program.original.txt" "$out/$program.ddp.txt"; then
        echo "$program: the output printed the original's numbers ($lines lines)"
    else
        echo "$program: DIFFERENT numbers (original exit $(cat "$out/$program.original.rc"), $lines lines)"
        bad=1
    fi
done
echo "gpu_migrate_check: $( [ $bad = 0 ] && echo passed || echo FAILED ); logs in $out"
exit $bad
