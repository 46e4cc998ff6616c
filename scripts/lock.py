"""The test environment's lock, constraints.txt: read it, compare a venv with it, rewrite it.

    python scripts/lock.py drift PYTHON   # what PYTHON's environment has that the lock does not pin
    python scripts/lock.py write PYTHON   # rewrite constraints.txt from PYTHON's environment

`scripts/bootstrap.sh` installs with ``-c constraints.txt``; `scripts/test_latest.sh` prints the
drift of the newest releases and, with ``--lock``, writes them here once the suite passes on them;
`tests/test_environment.py` checks that the test venv is the lock.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Dict, List

LOCK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "constraints.txt")

HEADER = """\
# The lock of the test environment: every package that `scripts/bootstrap.sh` installs (the project's
# dependencies, its extras and everything they pull in), at the version the suite last passed on.
# `pip install -c constraints.txt -e .[all,test,docs]` gives the same environment on every fresh machine.
# Rewritten by `bash scripts/test_latest.sh --lock` (the newest releases, once the suite passes on them).
# torch 2.13.0 is the CPU build that pip finds on local disk here; torchvision is installed without its
# dependencies by scripts/test_torchvision.py (see there); tf-keras is installed without its dependencies
# by scripts/test_tf_keras.py (it requires `tensorflow`, the full wheel; tensorflow-cpu stands in for it).
"""

#: Installed with every venv, not by the project: left out of the lock and of the comparison
#: (uv: the installer `scripts/bootstrap.sh` pins and installs first, where it can use it).
TOOLING = frozenset({"pip", "setuptools", "wheel", "distribute", "horovod-compat", "uv"})


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares names."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """The version without its local label: pip's ``torch==2.13.0`` matches ``2.13.0+cpu``."""
    return version.split("+", 1)[0]


def read_lock(path: str = LOCK) -> Dict[str, str]:
    """``{normalized name: version}`` of every ``name==version`` line of the lock."""
    pins: Dict[str, str] = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, version = line.partition("==")
            if not sep or not version.strip():
                raise ValueError(f"{path}:{number}: expected 'name==version', got {line!r}")
            pins[normalize(name.strip())] = version.strip()
    return pins


_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json;"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def installed(python: str) -> Dict[str, str]:
    """``{name: version}`` of what the environment of the interpreter `python` has installed,
    tooling (pip, setuptools, the project itself) left out."""
    out = subprocess.run([python, "-c", _LIST_DISTRIBUTIONS], check=True, capture_output=True,
                         text=True).stdout
    return {name: version for name, version in json.loads(out).items()
            if normalize(name) not in TOOLING}


def drift(lock: Dict[str, str], have: Dict[str, str]) -> List[str]:
    """One line per package whose installed version differs from the lock, or that only one
    of the two has; empty when the environment is the lock."""
    have_normalized = {normalize(name): (name, version) for name, version in have.items()}
    lines = []
    for key in sorted(set(lock) | set(have_normalized)):
        name, version = have_normalized.get(key, (key, None))
        locked = lock.get(key)
        if version is None:
            lines.append(f"{name}: locked {locked}, not installed")
        elif locked is None:
            lines.append(f"{name}: {version} installed, not in the lock")
        elif public_version(version) != public_version(locked):
            lines.append(f"{name}: locked {locked}, installed {version}")
    return lines


def render(have: Dict[str, str]) -> str:
    """The lock's text for an environment (local version labels dropped)."""
    pins = sorted(have.items(), key=lambda item: normalize(item[0]))
    return HEADER + "".join(f"{name}=={public_version(version)}\n" for name, version in pins)


def main(argv: List[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("drift", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    command, python = argv
    have = installed(python)
    if command == "write":
        with open(LOCK, "w") as f:
            f.write(render(have))
        print(f"lock: wrote {len(have)} pins to {LOCK}")
        return 0
    lines = drift(read_lock(), have)
    print(f"lock: {len(lines)} package(s) differ from {os.path.basename(LOCK)}"
          + (":" if lines else ""))
    for line in lines:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
