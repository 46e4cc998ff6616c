"""horovod_compat.tensorflow._native: the compiled check op that gives a failed graph node Horovod's
TensorFlow error type, built on first use into a cache, and the fallback where it cannot be."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributor import run_function
from warm import warm_launcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))
from hvd_launch import horovodrun  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install "
                                       "'horovod-compat[tensorflow]')")


_STATUS_CODE = ("import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
                "from horovod_compat.tensorflow import _native\n"
                "print('STATUS', _native.status())\n")


def _status_of(done):
    assert done.returncode == 0, done.stderr[-3000:]
    return next(l for l in done.stdout.splitlines() if l.startswith("STATUS ")), done.stderr


#: A rank of ``horovodrun``: the op's status, and the TensorFlow it was built for.
_RANK_PROGRAM = ("import tensorflow as tf\n"
                 "from horovod_compat.tensorflow import _native\n"
                 "print('STATUS', _native.status())\n"
                 "print('VERSION', tf.__version__)\n")

#: The compiling rank's line (_native.ANNOUNCEMENT).
_ANNOUNCED = ("horovod_compat: compiling the TensorFlow check op for TensorFlow {version}, "
              "once per machine and cache (about 5-30 s; the other ranks of this host wait for "
              "it); cached in {cache}")


def _announcements(output):
    return [line for line in output.splitlines() if "compiling the TensorFlow check op" in line]


def test_the_op_is_built_once_into_the_cache_and_loaded_from_it(tmp_path):
    """The two ranks of a ``horovodrun`` (they start together) build the op once: one compiles,
    saying so in one line of its output, the other waits for its library, quietly; a later launch
    loads it without compiling, and says nothing."""
    cache, log = tmp_path / "cache", tmp_path / "compiler-runs"
    compiler = tmp_path / "cxx"  # the real compiler, each run logged
    compiler.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec c++ "$@"\n')
    compiler.chmod(0o755)
    program = tmp_path / "rank.py"
    program.write_text(_RANK_PROGRAM)
    env = {"HOROVOD_COMPAT_CACHE_DIR": str(cache), "CXX": str(compiler),
           "TF_CPP_MIN_LOG_LEVEL": "3"}

    def launch():
        run = horovodrun(2, [sys.executable, str(program)], timeout=300, env=env)
        assert run.returncode == 0, run.tail()
        for rank in (0, 1):
            assert "STATUS compiled error-status op loaded" in run.rank_lines(rank), run.tail()
        return run

    run = launch()
    assert log.read_text().split() == ["run"]
    version = next(l for l in run.rank_lines(0) if l.startswith("VERSION ")).split()[1]
    line = _ANNOUNCED.format(version=version, cache=cache)
    # once, on the stderr of the rank that compiled, as horovodrun shows a rank's lines
    assert _announcements(run.output) in ([f"[0]<stderr>:{line}"], [f"[1]<stderr>:{line}"]), \
        run.tail()
    built = list(cache.glob("tf-*/check_op.so"))
    assert len(built) == 1, list(cache.rglob("*"))
    first = built[0].stat().st_mtime_ns
    run = launch()
    assert _announcements(run.output) == [], run.tail()
    assert built[0].stat().st_mtime_ns == first and log.read_text().split() == ["run"]  # loaded
    # no partial files left: the library and the lock the builders took turns on
    assert sorted(p.name for p in built[0].parent.iterdir()) == [".build.lock", "check_op.so"]


def test_without_a_compiler_the_binding_still_works_and_says_why(tmp_path):
    """No compiler: no announcement (nothing is compiled), a warning that says what to do; a
    compiler that fails: the announcement, then an error that says the compile failed."""
    failing = tmp_path / "failing-cxx"
    failing.write_text("#!/bin/sh\necho 'no headers here' >&2\nexit 3\n")
    failing.chmod(0o755)
    code = _STATUS_CODE + (f"os.environ['CXX'] = {str(failing)!r}\n"
                           "try:\n"
                           "    _native._build()\n"
                           "except RuntimeError as exc:\n"
                           "    print('FAILED', str(exc).replace(chr(10), ' '))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HOROVOD_COMPAT_CACHE_DIR=str(tmp_path),
                                   CXX=str(tmp_path / "no-such-compiler")))
    status, stderr = _status_of(done)
    why = (f"compiling check_op.cc failed: could not run the C++ compiler "
           f"'{tmp_path / 'no-such-compiler'}': not found")
    assert status == f"STATUS not available ({why})", status
    assert (f"horovod_compat: the TensorFlow check op is not available ({why}); training goes on, "
            "but a collective that fails inside a graph raises UnknownError (with Horovod's "
            "message) instead of its own error type. To have the op, install a C++ compiler (or "
            "name one in $CXX) and TensorFlow's headers; HOROVOD_COMPAT_TF_NATIVE=0 skips it") \
        in stderr, stderr
    # the failing compiler was announced (once), and its failure says what ran and why it failed
    assert len(_announcements(stderr)) == 1 and stderr.index("compiling the TensorFlow check op") \
        > stderr.index("HOROVOD_COMPAT_TF_NATIVE=0 skips it"), stderr
    failed = next(l for l in done.stdout.splitlines() if l.startswith("FAILED "))
    assert failed.startswith(f"FAILED {failing} -shared ") and \
        failed.endswith("failed (exit 3): no headers here "), failed
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
    reps = run_function(_graph_errors, num_processes=2, return_all=True, timeout=300, env=env,
                        launcher=warm_launcher(expect=("tensorflow", "torch")))
    for rep in reps:
        assert rep["status"] == status, rep["status"]
        for key, shapes, ranks in (
                ("session", "shape [17, 17], but another rank sent a tensor of shape [18, 18]",
                 "rank 0 sent shape [17, 17]; rank 1 sent shape [18, 18]."),
                ("function", "shape [5], but another rank sent a tensor of shape [6]",
                 "rank 0 sent shape [5]; rank 1 sent shape [6].")):
            kind, message = rep[key]
            assert kind == expected, rep[key]
            # Horovod's sentence, then the op and what each rank sent: the runtime's text, the
            # same on every rank, through the TensorFlow binding
            assert f"Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of {shapes}." \
                in message, message
            text = message[message.index("Mismatched"):].splitlines()[0]
            assert text.endswith(ranks), message
            assert text == reps[0][key][1][reps[0][key][1].index("Mismatched"):].splitlines()[0]
        assert rep["session allgather"][0] == expected, rep["session allgather"]
        assert "Mismatched ALLGATHER" in rep["session allgather"][1], rep["session allgather"]
        # the set stays usable, and good ops give their values
        assert rep["session after"] == [3.0, 3.0, 3.0]
        assert rep["function after"] == [3.0, 3.0]
        assert rep["chained"] == [3.0, 3.0]
