#!/usr/bin/env bash
# Builds a REAL Horovod 0.28.1 (CPU, gloo, PyTorch only) into its own venv, for the benchmarks'
# `--horovod-python` comparison:
#
#   bash scripts/build_real_horovod.sh [VENV_DIR]        # default /tmp/real-horovod
#   .venv/bin/python benchmarks/collectives.py --horovod-python /tmp/real-horovod/bin/python
#   .venv/bin/python benchmarks/train_step.py  --horovod-python /tmp/real-horovod/bin/python
#
# Horovod's last release asks for C++14, while torch 2.13's headers require C++17: the only change
# made to its sources is that standard, in its two CMakeLists.txt files.  cmake < 4 because cmake 4
# rejects the old minimum versions its bundled gloo declares.  Takes ~3 minutes on 2 cores.
# Nothing from Horovod enters this repository: the source package is unpacked under VENV_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-/tmp/real-horovod}
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
"${pip[@]}" install -c "$root/constraints.txt" torch numpy "cmake<4" wheel packaging cloudpickle psutil pyyaml
src="$venv/src"
rm -rf "$src" && mkdir -p "$src"
"${pip[@]}" download --no-deps --no-binary :all: -d "$src" horovod==0.28.1
tar -xzf "$src"/horovod-0.28.1.tar.gz -C "$src"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
  "$src/horovod-0.28.1/CMakeLists.txt" "$src/horovod-0.28.1/horovod/torch/CMakeLists.txt"
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j2 CMAKE_BUILD_PARALLEL_LEVEL=2 \
PATH="$venv/bin:$PATH" "${pip[@]}" install --no-build-isolation --no-cache-dir "$src/horovod-0.28.1"
cd "$src" && "$venv/bin/python" -c "import horovod.torch as hvd; hvd.init(); print('real Horovod', \
  __import__('horovod').__version__, 'size', hvd.size())"
echo "$venv/bin/python"
