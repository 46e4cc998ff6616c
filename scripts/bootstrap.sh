#!/usr/bin/env bash
# Creates .venv (once) and installs the project with every extra (`all`, plus `test` and `docs` for
# contributors) into it, every package at the version that constraints.txt (the lock) pins, so that
# every fresh machine gets the same test environment. pip's progress goes to stderr (a fresh machine
# takes a few minutes). As root on Debian it also installs Chromium (the docs' screenshot test) when
# it is missing. Also installs, beside it, the oldest cloudpickle that setup.cfg allows, for the
# tests that run the ranks with it (tests/test_environment.py), and tf-keras without its dependencies
# (scripts/test_tf_keras.py), and compiles the project's sources to .pyc. Idempotent: a second run
# only checks that everything is present.
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
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --no-warn-script-location --progress-bar off)
stamp="$venv/.horovod-compat-installed"
#: The installer for the lock (below), itself pinned.
UV_VERSION=0.13.9
upgrade=()
if [ "${HOROVOD_COMPAT_UPGRADE:-0}" = 1 ]; then
  upgrade=(--upgrade --upgrade-strategy eager)
  rm -f "$stamp"
fi
if [ ! -f "$stamp" ] || [ "$root/setup.cfg" -nt "$stamp" ] || [ "$root/setup.py" -nt "$stamp" ] \
    || [ "$constraints" -nt "$stamp" ]; then
  # uv installs the same lock as pip in about 70 s on a fresh 2-core machine, every .pyc compiled,
  # where pip takes about 115 s. It does not read pip's configuration, so it is used only where the
  # lock's CPU torch lies in pip's find-links folder for it to take (else it would fetch a
  # multi-GB CUDA build), and not for HOROVOD_COMPAT_UPGRADE=1 (pip's eager upgrade strategy).
  torch_pin=$(sed -n 's/^torch==\([^[:space:]]*\).*$/\1/p' "$constraints")
  links=$("$venv/bin/python" -m pip config get global.find-links 2>/dev/null | awk '{print $1}' || true)
  if [ ${#upgrade[@]} = 0 ] && [ -n "$torch_pin" ] && [ -d "$links" ] \
      && compgen -G "$links/torch-$torch_pin[+-]*.whl" >/dev/null \
      && "${pip[@]}" --quiet "uv==$UV_VERSION" >&2; then
    echo "bootstrap: installing the project, its extras and the test tools into $venv with uv (about a minute on a fresh machine)" >&2
    "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --compile-bytecode \
      --find-links "$links" -c "$constraints" -e "$root[all,test,docs]" >&2
  else
    echo "bootstrap: installing the project, its extras and the test tools into $venv (a few minutes on a fresh machine; pip's lines follow)" >&2
    "${pip[@]}" ${upgrade[@]+"${upgrade[@]}"} -c "$constraints" -e "$root[all,test,docs]" \
      | { grep --line-buffered -E '^(Collecting|Installing|Successfully)' || true; } >&2
  fi
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
# The project's own sources, compiled (about a second). An editable install has no .pyc of them,
# and where PYTHONDONTWRITEBYTECODE=1 (as on these machines) no import ever writes one: every rank,
# launcher and Spark Python worker compiled the project again, 0.1-0.3 s of CPU each.
# checked-hash: a .pyc is used only while its source is byte for byte the one compiled.
"$venv/bin/python" -m compileall -q -j 0 --invalidation-mode checked-hash \
    "$root/horovod_compat" "$root/distributor" "$root/horovod" "$root/sparkdl" "$root/tests" >&2 \
  || echo "bootstrap: some sources did not compile (see above); they are compiled at import instead" >&2
# Chromium for the docs' screenshot test (tests/test_docs.py), from Debian's packages
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "bootstrap: installing chromium (apt-get) for the docs' screenshot test" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } >&2 \
    || echo "bootstrap: could not install chromium; tests/test_docs.py's screenshot test will say so" >&2
fi
echo "$venv/bin/python"
