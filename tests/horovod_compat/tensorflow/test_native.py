"""horovod_compat.tensorflow._native: the compiled check op that gives a failed graph node Horovod's
TensorFlow error type, built on first use into a cache, and the fallback where it cannot be."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from distributor import run_function
from warm import warm_launcher

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install "
                                       "'horovod-compat[tensorflow]')")


_STATUS_CODE = ("import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
                "from horovod_compat.tensorflow import _native\n"
                "print('STATUS', _native.status())\n")


def _status_of(done):
    assert done.returncode == 0, done.stderr[-3000:]
    return next(l for l in done.stdout.splitlines() if l.startswith("STATUS ")), done.stderr


def _status_in_fresh_process(env):
    return _status_of(subprocess.run([sys.executable, "-c", _STATUS_CODE],
                                     env=dict(os.environ, **env), capture_output=True, text=True,
                                     timeout=300))


def test_the_op_is_built_once_into_the_cache_and_loaded_from_it(tmp_path):
    """Two processes that start together (the ranks of a host) build the op once: one compiles,
    the other waits for its library; a later process loads it without compiling."""
    cache, log = tmp_path / "cache", tmp_path / "compiler-runs"
    compiler = tmp_path / "cxx"  # the real compiler, each run logged
    compiler.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec c++ "$@"\n')
    compiler.chmod(0o755)
    env = dict(os.environ, HOROVOD_COMPAT_CACHE_DIR=str(cache), CXX=str(compiler))
    together = [subprocess.Popen([sys.executable, "-c", _STATUS_CODE], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in together:
        out, err = proc.communicate(timeout=300)
        status, _ = _status_of(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        assert status == "STATUS compiled error-status op loaded"
    assert log.read_text().split() == ["run"]
    built = list(cache.glob("tf-*/check_op.so"))
    assert len(built) == 1, list(cache.rglob("*"))
    first = built[0].stat().st_mtime_ns
    status, _ = _status_in_fresh_process({"HOROVOD_COMPAT_CACHE_DIR": str(cache),
                                          "CXX": str(compiler)})
    assert status == "STATUS compiled error-status op loaded"
    assert built[0].stat().st_mtime_ns == first and log.read_text().split() == ["run"]  # loaded
    # no partial files left: the library and the lock the builders took turns on
    assert sorted(p.name for p in built[0].parent.iterdir()) == [".build.lock", "check_op.so"]


def test_without_a_compiler_the_binding_still_works_and_says_why(tmp_path):
    status, stderr = _status_in_fresh_process({"HOROVOD_COMPAT_CACHE_DIR": str(tmp_path),
                                               "CXX": str(tmp_path / "no-such-compiler")})
    assert status.startswith("STATUS not available (could not build or load check_op.cc: "
                             "could not run the C++ compiler"), status
    assert "raises UnknownError (with Horovod's message) instead of its own error type" in stderr
    # HOROVOD_COMPAT_TF_NATIVE=0's status: the ranks of test_a_mismatch_in_a_graph_raises_horovods_error_type[off]
    # report it (a fresh process here cost one more TensorFlow start-up)


def _graph_errors():
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    r = hvd.rank()
    out = {}

    def caught(fn):
        try:
            fn()
            return None
        except tf.errors.OpError as exc:
            return [type(exc).__name__, exc.message]

    with tf.Graph().as_default():
        bad = hvd.allreduce(tf.ones([17 + r] * 2))
        bad_gather = hvd.allgather(tf.ones([2, 3 + r]))
        good = hvd.allreduce(tf.ones([3]) * (r + 1), op=hvd.Sum)
        with tf.compat.v1.Session() as session:
            out["session"] = caught(lambda: session.run(bad))
            out["session allgather"] = caught(lambda: session.run(bad_gather))
            out["session after"] = session.run(good).tolist()

    @tf.function
    def reduce(x):
        return hvd.allreduce(x, op=hvd.Sum)

    @tf.function
    def no_outputs_after(x):
        y = hvd.allreduce(x, op=hvd.Sum, name="first")
        return hvd.allgather(y, name="second")

    out["function"] = caught(lambda: reduce(tf.ones([5 + r])))
    out["function after"] = reduce(tf.ones([2]) * (r + 1)).numpy().tolist()
    out["chained"] = no_outputs_after(tf.ones([1]) * (r + 1)).numpy().tolist()
    from horovod_compat.tensorflow import _native
    out["status"] = _native.status()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("native", ["on", "off"])
def test_a_mismatch_in_a_graph_raises_horovods_error_type(native):
    """With the op (from the run's shared cache) and with ``HOROVOD_COMPAT_TF_NATIVE=0``; the
    ranks' ``status()`` must say which (the check of the switch's status, in this launch)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", **({} if native == "on" else {"HOROVOD_COMPAT_TF_NATIVE": "0"})}
    expected = "FailedPreconditionError" if native == "on" else "UnknownError"
    status = ("compiled error-status op loaded" if native == "on"
              else "not available (disabled by HOROVOD_COMPAT_TF_NATIVE=0)")
    for rep in run_function(_graph_errors, num_processes=2, return_all=True, timeout=300, env=env,
                            launcher=warm_launcher(expect=("tensorflow", "torch"))):
        assert rep["status"] == status, rep["status"]
        for key, shapes in (("session", "shape [17, 17], but another rank sent a tensor of shape "
                                        "[18, 18]"),
                            ("function", "shape [5], but another rank sent a tensor of shape [6]")):
            kind, message = rep[key]
            assert kind == expected, rep[key]
            assert f"Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of {shapes}." \
                in message, message
        assert rep["session allgather"][0] == expected, rep["session allgather"]
        assert "Mismatched ALLGATHER" in rep["session allgather"][1], rep["session allgather"]
        # the set stays usable, and good ops give their values
        assert rep["session after"] == [3.0, 3.0, 3.0]
        assert rep["function after"] == [3.0, 3.0]
        assert rep["chained"] == [3.0, 3.0]
