"""Test environment only: make ``import torchvision`` work next to the CPU torch of the test venv.

Horovod's upstream examples (which the tests run unchanged) import torchvision.  The only
torchvision built for torch 2.13.0 that the package registry serves here (0.28.0, linux x86_64) is
the CUDA build; beside torch 2.13.0+cpu its import fails with "operator torchvision::nms does not
exist", because ``torchvision/_meta_registrations.py`` registers fake kernels for the compiled
``nms``/``qnms`` ops without checking that they were loaded.  Nothing the examples use (models,
datasets, transforms) needs those compiled ops.

This script, run by ``scripts/test.sh`` with the test venv's python, installs the torchvision that
constraints.txt (the lock) pins, 0.28.0, without dependencies (so pip cannot replace the CPU torch) and guards those two registrations so
that they are skipped when the op is absent.  It is idempotent (a second run changes nothing), it
never touches the project's runtime, and a torchvision that already imports is left alone.
"""
import importlib.util
import re
import subprocess
import sys

from lock import read_lock  # scripts/lock.py, beside this file

GUARD = "_horovod_compat_test_env_fake"


def imports() -> bool:
    return subprocess.run([sys.executable, "-c", "import torchvision"],
                          capture_output=True).returncode == 0


def main() -> int:
    if imports():
        return 0
    if importlib.util.find_spec("torchvision") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--disable-pip-version-check", f"torchvision=={read_lock()['torchvision']}"],
                       check=True)
    spec = importlib.util.find_spec("torchvision")
    path = spec.submodule_search_locations[0] + "/_meta_registrations.py"
    with open(path) as f:
        text = f.read()
    if GUARD not in text:
        helper = (
            f"\n\ndef {GUARD}(op):  # added by horovod-compat's scripts/test_torchvision.py\n"
            "    ns, name = op.split('::')\n"
            "    if not hasattr(getattr(torch.ops, ns), name):\n"
            "        return lambda fn: fn\n"
            "    return torch.library.register_fake(op)\n\n")
        text, n = re.subn(r'@torch\.library\.register_fake\(("torchvision::q?nms")\)',
                          rf"@{GUARD}(\1)", text)
        if n == 0:
            print("test_torchvision: nothing to guard in", path, file=sys.stderr)
            return 1
        first_def = text.index("\n@")
        text = text[:first_def] + helper + text[first_def:]
        with open(path, "w") as f:
            f.write(text)
    if not imports():
        print("test_torchvision: torchvision still does not import", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
