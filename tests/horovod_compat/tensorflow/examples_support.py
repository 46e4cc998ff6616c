"""Test helper for test_upstream_tf_examples.py: where Horovod's examples are, the data they read,
how to launch them (`run`: a hard timeout, optionally stopped at a line or with one worker
SIGKILLed at a line, nothing left running), and how to read their losses (`step_losses`,
`epoch_progress`: Keras' progress bars, "\\r"/"\\b" updates included).

Besides tests/tf_support.py's synthetic MNIST this writes:

- `small_mnist`: the same kind of learnable digits on 8x8 images. The TensorFlow 2 MNIST examples
  (``tensorflow2_mnist.py``, ``tensorflow2_keras_mnist.py`` and their elastic versions) build their
  Conv2D model without an input shape and run a fixed number of steps (5 000 or 24 x 250 per rank,
  ``dataset.repeat()``), so the size of the data set cannot shorten them; the size of the images
  can: the model builds for what ``load_data`` returns, and an 8x8 image costs about 1/12 of a
  28x28 one. The scripts are not changed.
- `TF1_KERAS2_SITECUSTOMIZE`: the environment the examples/keras scripts were written for (see
  its docstring), for the test that runs them there.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
UPSTREAM = Path(os.environ.get("HOROVOD_UPSTREAM_DIR")
                or REPO.parent / "shared" / "upstream" / "horovod-0.28.1")
EXAMPLES = UPSTREAM / "examples"

sys.path.insert(0, str(REPO / "tests"))
from tf_support import SITE_HELPERS, keras_mnist_env, synthetic_mnist  # noqa: E402,F401 - re-exported

from tiers import CI  # noqa: E402,F401 (the example tests take it from here)


def small_digits(count: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """`count` uint8 8x8 images and their labels: class k is a horizontal bar at row 1 + k % 5
    and a vertical bar at column 2 (k < 5) or 5, of random intensity, with sparse noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count).astype(np.uint8)
    images = np.zeros((count, 8, 8), dtype=np.uint8)
    intensity = rng.integers(150, 256, size=count)
    for i, label in enumerate(labels):
        images[i, 1 + label % 5, 1:7] = intensity[i]
        images[i, 1:7, 2 if label < 5 else 5] = intensity[i]
    noise = rng.random(images.shape) < 0.05
    images[noise] = np.maximum(images[noise], rng.integers(20, 120, size=int(noise.sum())))
    return images, labels


def small_mnist(train: int = 2000, test: int = 500):
    """``(x_train, y_train), (x_test, y_test)`` of 8x8 digits, as ``mnist.load_data()`` returns."""
    return small_digits(train, 0), small_digits(test, 1)


@dataclass
class Run:
    returncode: Optional[int]   # None: killed at the timeout
    output: str                 # stdout and stderr together
    timed_out: bool
    stopped_at: Optional[int] = None  # where in `output` the `stop_when` line ends, if it came
    killed: Optional[int] = None      # the worker PID that `kill_worker_when` SIGKILLed

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.output.split("\n")[-lines:])

    @property
    def before_stop(self) -> str:
        """The output up to the end of the `stop_when` line (all of it without one)."""
        return self.output if self.stopped_at is None else self.output[:self.stopped_at]


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float,
        stop_when: Optional[str] = None, kill_worker_when: Optional[str] = None,
        worker_pids: Optional[Callable[[int], List[int]]] = None) -> Run:
    """Run `argv` in a session of its own and collect its output; nothing of that session
    outlives the call.

    - past `timeout` s the session gets SIGTERM, 20 s later SIGKILL (`timed_out`);
    - `stop_when` (a regex): at the first output line that matches it, the session gets SIGTERM
      (then SIGKILL 20 s later) -- a run stopped on purpose once it has shown what a test needs;
    - `kill_worker_when` (a regex): at the first line that matches it while two workers run, the
      newer of them (from ``worker_pids(launcher_pid)``) gets SIGKILL, once (`killed`)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    # bytes, split at "\n" only: text mode would turn a progress bar's "\r" into a line break
    proc = subprocess.Popen(list(argv), env=full_env, cwd=str(cwd), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    chunks: List[str] = []
    size = 0
    result = Run(None, "", False)
    timers: List[threading.Timer] = []

    def terminate(then_kill_after: float = 20.0) -> None:
        _killpg(proc.pid, signal.SIGTERM)
        timer = threading.Timer(then_kill_after, _killpg, (proc.pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()
        timers.append(timer)

    def on_timeout() -> None:
        result.timed_out = True
        terminate()

    deadline = threading.Timer(timeout, on_timeout)
    deadline.daemon = True
    deadline.start()
    stop = re.compile(stop_when) if stop_when else None
    kill = re.compile(kill_worker_when) if kill_worker_when else None
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            chunks.append(line)
            size += len(line)
            if kill is not None and result.killed is None and kill.search(line):
                pids = worker_pids(proc.pid)
                if len(pids) >= 2:
                    os.kill(pids[-1], signal.SIGKILL)
                    result.killed = pids[-1]
            if stop is not None and result.stopped_at is None and stop.search(line):
                result.stopped_at = size
                terminate()
        proc.wait()
    finally:
        deadline.cancel()
        for timer in timers:
            timer.cancel()
        _killpg(proc.pid, signal.SIGKILL)  # a rank that outlived its launcher, if any
        if proc.poll() is None:
            proc.wait()
    result.output = "".join(chunks)
    result.returncode = None if result.timed_out else proc.returncode
    return result


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def rank_lines(output: str, rank: int) -> List[str]:
    """Rank `rank`'s lines of horovodrun's output, prefix removed. Lines end at "\\n" only: a
    Keras progress bar's "\\r" and "\\b" updates stay in their line."""
    prefixes = (f"[{rank}]<stdout>:", f"[{rank}]<stderr>:")  # Horovod's, as horovodrun prints them
    return [line[len(prefixes[0]):] for line in output.split("\n") if line.startswith(prefixes)]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = r"([0-9.]+(?:e[-+]?\d+)?|nan|inf)"


def step_losses(lines: Sequence[str]) -> List[Tuple[int, float]]:
    """``Step #N\\tLoss: X`` lines (the TensorFlow 2 MNIST examples): [(N, X), ...]."""
    found = []
    for line in lines:
        match = re.search(r"Step #(\d+)\s+Loss: " + _NUMBER, line)
        if match:
            found.append((int(match.group(1)), float(match.group(2))))
    return found


def epoch_progress(lines: Sequence[str]) -> List[Tuple[int, float, float]]:
    """Keras' progress bar, per epoch: [(epoch, first loss shown, last loss shown), ...].

    Keras 3 and tf-keras print ``Epoch N/M`` and then the epoch's progress on one line (updates
    separated by ``\\r`` or ``\\b``, or one after another through a pipe). The first ``loss: X``
    of that line is the mean over the epoch's first step (Keras updates the bar after step 1),
    the last one the epoch's mean training loss. A fit of one epoch prints no ``Epoch`` line
    (Keras 3) and is not counted."""
    found: List[Tuple[int, float, float]] = []
    epoch = None
    shown: List[float] = []
    for raw in lines:
        line = _ANSI.sub("", raw)
        match = re.match(r"\s*Epoch (\d+)/(\d+)\s*$", line)
        if match:
            if epoch is not None and shown:
                found.append((epoch, shown[0], shown[-1]))
            epoch, shown = int(match.group(1)), []
            continue
        if epoch is not None:
            shown += [float(x) for x in re.findall(r"(?<![a-z_])loss: " + _NUMBER, line)]
    if epoch is not None and shown:
        found.append((epoch, shown[0], shown[-1]))
    return found


def epoch_losses(lines: Sequence[str]) -> List[Tuple[int, float]]:
    """[(epoch, the epoch's mean training loss), ...] from Keras' progress bar."""
    return [(epoch, last) for epoch, _, last in epoch_progress(lines)]


TF1_KERAS2_SITECUSTOMIZE = textwrap.dedent('''\
    """Test only, written by horovod-compat's tests/horovod_compat/tensorflow/examples_support.py:
    the environment Horovod's examples/keras scripts were written for -- TensorFlow 1 and the
    standalone Keras 2 package -- emulated on TensorFlow 2 with tf-keras (TF_USE_LEGACY_KERAS=1):

    - ``tf.ConfigProto`` and ``tf.Session`` are ``tf.compat.v1``'s (TensorFlow 2 keeps them only
      there; the examples build a session config for the GPU they pin and give it to Keras);
    - ``import keras`` (and ``keras.*``) is tf-keras, the Keras 2 that TensorFlow 2 still ships
      (``keras`` is Keras 3 otherwise, which has no ImageDataGenerator, fit_generator, set_session);
    - ``keras.backend.set_session`` is tf-keras' TF1 one (``tf.compat.v1.keras.backend``).

    Nothing else changes: horovod.keras, TensorFlow and tf-keras run as installed. The scripts
    themselves are not modified."""
''') + SITE_HELPERS + textwrap.dedent('''\


    class _Alias(importlib.abc.Loader):
        def __init__(self, target):
            self.target = target

        def create_module(self, spec):
            module = importlib.import_module(self.target)
            if self.target == "tf_keras.backend" or self.target == "tf_keras":
                backend = importlib.import_module("tf_keras.backend")
                if not hasattr(backend, "set_session"):
                    from tf_keras.src.backend import set_session
                    backend.set_session = set_session
            return module

        def exec_module(self, module):
            pass


    class _Keras2(importlib.abc.MetaPathFinder):
        """``keras`` and ``keras.*`` are tf-keras'."""

        def find_spec(self, fullname, path, target=None):
            if fullname == "keras" or fullname.startswith("keras."):
                return importlib.machinery.ModuleSpec(fullname, _Alias("tf_" + fullname))
            return None


    def _tf1_names(tensorflow):
        tensorflow.ConfigProto = tensorflow.compat.v1.ConfigProto
        tensorflow.Session = tensorflow.compat.v1.Session


    if not getattr(sys, "_horovod_compat_tf1_keras2", False):
        sys._horovod_compat_tf1_keras2 = True
        sys.meta_path[:0] = [_Keras2(), _PatchAfterImport({"tensorflow": _tf1_names})]
        _run_next_sitecustomize()  # tf_support's
''')


def tf1_keras2_env(tmp: Path, base: Dict[str, str]) -> Dict[str, str]:
    """`base` (tf_support's variables) with TF1_KERAS2_SITECUSTOMIZE first on PYTHONPATH, under
    tf-keras (TF_USE_LEGACY_KERAS=1)."""
    site = Path(tmp) / "tf1-keras2-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(TF1_KERAS2_SITECUSTOMIZE)
    return {**base, "PYTHONPATH": os.pathsep.join([str(site), base["PYTHONPATH"]]),
            "TF_USE_LEGACY_KERAS": "1"}
