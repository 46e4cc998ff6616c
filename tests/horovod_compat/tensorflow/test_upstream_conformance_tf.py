"""Horovod's own TensorFlow test files, each in ONE horovodrun launch on 2 ranks, as users run them.

For every file of scripts/upstream_conformance.sh's TENSORFLOW_FILES (test_tensorflow.py,
test_tensorflow2_keras.py, test_tensorflow_keras.py, test_keras.py, test_tensorflow_process_sets.py)
this runs ``scripts/upstream_conformance.sh --framework tensorflow --runs 1 FILE`` (in CI less the
files of CI_LONG_ROUND_FILES, each with where CI runs its paths): the script picks
the Keras the file runs under (its LEGACY_KERAS_FILES run with TF_USE_LEGACY_KERAS=1, the others
under Keras 3). Each file must run to its end on both ranks with no rank dying and no hang, and the
tests that fail must be exactly those that UNSUPPORTED lists for it, each with its reason — no more
(a regression, or a file that does not even import) and no fewer (an entry that passes now must
leave the list).

The upstream files are not in this repository: the tests skip, saying so, when
../shared/upstream/horovod-0.28.1 (or $HOROVOD_UPSTREAM_DIR) is absent, and when TensorFlow is not
installed.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tiers import CI  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "upstream_conformance.sh"
UPSTREAM = Path(os.environ.get("HOROVOD_UPSTREAM_DIR", ROOT.parent / "shared" / "upstream" / "horovod-0.28.1"))
PARALLEL = UPSTREAM / "test" / "parallel"
# The files, from the script (the one place that lists them and says which Keras each runs under).
FILES = re.search(r"^TENSORFLOW_FILES=\(([^)]*)\)", SCRIPT.read_text(), re.M).group(1).split()

#: The upstream tests that fail here, per file: {test name as the script prints it (the test
#: method's name) -> why}. Every entry must fail, and every failure must have an entry. Two kinds,
#: documented in docs/tensorflow.md: Keras-2 test code that Keras 3 rejects (the same tests pass
#: under tf-keras: test_keras_tests_of_test_tensorflow_pass_under_tf_keras), and test code that
#: NumPy 2 breaks. (The graph-mode *_error tests pass because the binding's compiled check op,
#: horovod_compat/tensorflow/_native, builds here: the machine has a C++ compiler.)
UNSUPPORTED: Dict[str, Dict[str, str]] = {
    "test_tensorflow.py": {
        "test_horovod_syncbn_cpu": "Keras-2 test code: tf.keras.layers.BatchNormalization(fused=False), "
                                   "which Keras 3 rejects; passes under tf-keras",
        "test_partial_distributed_gradient_tape": "Keras-2 test code: var.ref() on Keras 3 variables, "
                                                  "which have no ref(); passes under tf-keras",
    },
    "test_tensorflow2_keras.py": {},
    "test_tensorflow_keras.py": {},
    "test_keras.py": {},
    "test_tensorflow_process_sets.py": {
        "test_horovod_reducescatter_grad_cpu_process_sets": (
            "NumPy 2 test code: for float16 the test asserts np.float16 error < 1e-08, which NumPy 2 "
            "compares in float16 (1e-08 rounds to 0.0), so an exact gradient (error 0.0) fails"),
    },
}
#: The tests of test_tensorflow.py that use Keras (on CPU; test_horovod_syncbn_gpu needs a GPU): they
#: run under Keras 3 with the whole file, and again under tf-keras, where they all pass. The file's
#: other tests never touch Keras, so under tf-keras they would run the same code again; the whole
#: file under tf-keras is the long round's (docs/testing.md).
KERAS_TESTS = ("test_horovod_syncbn_cpu", "test_partial_distributed_gradient_tape",
               "test_model_parallel_model")

#: Whole files CI leaves to the long round, and what runs their paths in CI.
CI_LONG_ROUND_FILES: Dict[str, str] = {
    # 78 s on 2 idle cores (37 s even less its 13 slowest graph-mode tests: 120 worker-s in a busy
    # CI run)
    "test_tensorflow.py": (
        "CI runs its ops (allreduce with its ops, scales, compression and IndexedSlices, grouped "
        "allreduce and allgather, broadcast, alltoall, reducescatter; eager and in tf.function; "
        "their gradients; DistributedGradientTape; Adasum) through binding_program.py in "
        "test_tensorflow_binding.py, its Keras through test_keras_binding.py and Horovod's "
        "test_tensorflow2_keras.py here, and its error cases (shapes, types, ranks that disagree) "
        "through the same core in Horovod's test_torch.py (torch/test_upstream_conformance.py)"),
    "test_tensorflow_process_sets.py": (
        "CI runs TensorFlow ops on process sets in test_tensorflow_binding.py (binding_program.py) "
        "and test_keras_binding.py (check_process_set), and every op on process sets through the "
        "same core in tests/horovod_compat/torch/test_process_sets.py"),
    # TF1-only files: under TensorFlow 2 every test skips itself (as upstream), so CI would only
    # see them import
    "test_tensorflow_keras.py": (
        "every test of it is TF1-only and skips itself under TensorFlow 2 (as upstream); "
        "test_keras_binding.py imports and runs horovod.tensorflow.keras in CI"),
    "test_keras.py": (
        "every test of it is TF1-only and skips itself under TensorFlow 2 (as upstream); "
        "test_keras_binding.py imports and runs horovod.keras in CI"),
}

LAUNCH_TIMEOUT = 1500
# Stop a rank's pytest after this many failures beyond the expected ones: once ranks fall out of step
# every later test waits for a collective timeout, which would hold the suite for an hour. pytest
# counts each failed subTest (TensorFlow runs most of these tests as subTest("graph_mode") and
# subTest("eager_mode")), so an expected failure may count twice.
MAX_EXTRA_FAILURES = 5


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                    reason="tf-keras is not installed (scripts/bootstrap.sh installs it for the tests)")
@pytest.mark.skipif(CI, reason=(
    "the long round's: it proves UNSUPPORTED's 'passes under tf-keras'; CI runs the binding's Keras "
    "paths under tf-keras in test_keras_binding.py[tf_keras] and Horovod's "
    "test_tensorflow2_keras.py (below)"))
@pytest.mark.timeout(600)
def test_keras_tests_of_test_tensorflow_pass_under_tf_keras(tmp_path):
    """All of them, in one launch (``-k (A)or(B)or(C)``: the script splits PYTEST_ARGS at spaces)."""
    test_file = PARALLEL / "test_tensorflow.py"
    if not test_file.is_file():
        pytest.skip(f"Horovod's upstream test file is not here ({test_file})")
    env = dict(os.environ, LAUNCHER="horovodrun", PYTHON=sys.executable, LAUNCH_TIMEOUT="500",
               PYTEST_ARGS="-k " + "or".join(f"({t})" for t in KERAS_TESTS))
    done = subprocess.run(["bash", str(SCRIPT), "--framework", "tensorflow", "--keras", "legacy",
                           "--runs", "1", "--out", str(tmp_path), str(test_file)],
                          env=env, capture_output=True, text=True, timeout=560, start_new_session=True)
    launch = re.search(r"^LAUNCH 1 rank0=(\d+)/(\d+)/(\d+) rank1=(\d+)/(\d+)/(\d+) crash=(\S+) exit=(\d+)",
                       done.stdout, re.M)
    assert launch, done.stdout[-4000:] + done.stderr[-2000:]
    assert launch.group(7) == "-" and launch.group(8) == "0", done.stdout[-4000:]
    n = len(KERAS_TESTS)
    assert [int(launch.group(i)) for i in (1, 2, 4, 5)] == [n, 0, n, 0], done.stdout[-4000:]


def test_the_allow_list_names_the_scripts_files_and_gives_reasons():
    assert sorted(UNSUPPORTED) == sorted(FILES), "UNSUPPORTED must have one entry per TensorFlow file"
    # (the long round checks these files' UNSUPPORTED entries; CI does not run them)
    assert set(CI_LONG_ROUND_FILES) < set(FILES)  # CI runs one file at least
    for name, tests in UNSUPPORTED.items():
        for test, reason in tests.items():
            assert re.fullmatch(r"test_\w+", test) and reason.strip(), (name, test, reason)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is not installed (pip install horovod-compat[tensorflow], or the "
                           "test extra)")
@pytest.mark.timeout(LAUNCH_TIMEOUT + 180)
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.skipif(CI and name in CI_LONG_ROUND_FILES, reason=(
        f"the long round's: {CI_LONG_ROUND_FILES.get(name)}"))) for name in FILES])
def test_whole_upstream_file_in_one_horovodrun_launch(name, tmp_path):
    test_file = PARALLEL / name
    if not test_file.is_file():
        pytest.skip(f"Horovod's upstream test file is not here ({test_file}); it is not part of this "
                    "repository: set HOROVOD_UPSTREAM_DIR to a Horovod 0.28.1 checkout to run it")
    unsupported = UNSUPPORTED[name]
    pytest_args = f"--maxfail={2 * len(unsupported) + MAX_EXTRA_FAILURES}"
    env = dict(os.environ, LAUNCHER="horovodrun", PYTHON=sys.executable, LAUNCH_TIMEOUT=str(LAUNCH_TIMEOUT),
               PYTEST_ARGS=pytest_args)
    env.pop("REPEAT", None)
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--framework", "tensorflow", "--runs", "1", "--out", str(tmp_path), str(test_file)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script kills its launch and the ranks' groups
        stdout, stderr = proc.communicate()
        pytest.fail(f"{name}: upstream_conformance.sh did not finish\n{stdout[-5000:]}\nlogs: {tmp_path}")
    print(stdout)
    report = (f"{name}: upstream_conformance.sh exit {proc.returncode}\n{stdout[-6000:]}\n{stderr[-3000:]}"
              f"\nlogs: {tmp_path}")
    launch = re.search(r"^LAUNCH 1 rank0=(\d+)/(\d+)/(\d+) rank1=(\d+)/(\d+)/(\d+) crash=(\S+) exit=(\d+) "
                       r"seconds=(\d+)$", stdout, re.M)
    assert launch, report
    keras = re.search(r"^upstream file: .*\((Keras [23])", stdout, re.M)
    counts = [tuple(int(launch.group(i + j)) for j in range(3)) for i in (1, 4)]  # (passed, failed, skipped)
    failed = set(re.findall(r"^  rank\d failed: (\S+)", stdout, re.M))
    collection = sorted(set(re.findall(r"^  rank\d collection error: (.*)$", stdout, re.M)))
    summary = (f"{name} ({keras.group(1) if keras else '?'}): passed/failed/skipped rank0 {counts[0]}, "
               f"rank1 {counts[1]}; crash/hang: {launch.group(7)}; {launch.group(9)} s; failed: "
               f"{', '.join(sorted(failed)) or 'none'}")
    print(summary)
    assert launch.group(7) == "-", summary + "\n" + report
    assert not collection, (f"{name} could not be collected: " + "; ".join(collection) + "\n" + summary
                            + "\n" + report)
    assert min(sum(c) for c in counts) > 0, f"{name}: no test ran\n{summary}\n{report}"
    assert sum(counts[0]) == sum(counts[1]), f"{name}: the ranks ran different tests\n{summary}\n{report}"
    unexpected, fixed = sorted(failed - set(unsupported)), sorted(set(unsupported) - failed)
    stopped = re.search(r"^  rank\d (stopping after \d+ failures)", stdout, re.M)
    assert not unexpected and not fixed, (
        f"{name}: failed but not in UNSUPPORTED: {unexpected or 'none'}; in UNSUPPORTED but did not fail: "
        f"{fixed or 'none'}" + (f" (pytest was {stopped.group(1)}: later tests did not run)" if stopped else "")
        + f"\n{summary}\n{report}")
