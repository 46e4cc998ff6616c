"""AutoGraph leaves the binding's code alone (``horovod_compat.tensorflow._not_for_autograph``): a
user's ``tf.function`` that calls ``hvd.allreduce`` or a ``DistributedGradientTape`` does not get
the binding's Python rewritten, because that Python also runs, rewritten, every time the graph's
collective nodes run (a 1 MB allreduce took 3-5 ms instead of a fraction of one;
benchmarks/tf_allreduce.py)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install "
                                       "'horovod-compat[tensorflow]')")

PROGRAM = r"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.impl.conversion import is_allowlisted

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
from horovod_compat.tensorflow import mpi_ops


def user_function(x):
    return x


entry_points = {
    "hvd.allreduce": hvd.allreduce,
    "hvd.grouped_allreduce": hvd.grouped_allreduce,
    "mpi_ops._reduce_np": mpi_ops._reduce_np,
    "hvd.DistributedGradientTape": hvd.DistributedGradientTape,
    "DistributedGradientTape(...).gradient":
        type(hvd.DistributedGradientTape(tf.GradientTape())).gradient,
    "hvd_keras.DistributedOptimizer": hvd_keras.DistributedOptimizer,
}
for name, entity in entry_points.items():
    print("ALLOWLISTED", name, is_allowlisted(entity))
print("ALLOWLISTED user_function", is_allowlisted(user_function))

hvd.init()
x = tf.constant(np.arange(4, dtype=np.float32))


@tf.function
def step(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(hvd.allreduce(x * x))
    return y, hvd.DistributedGradientTape(tape).gradient(y, x)


y, g = step(x)
print("RESULT", float(y), g.numpy().tolist())
"""


def test_autograph_does_not_rewrite_the_binding():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines()
                 if line.startswith("ALLOWLISTED "))
    assert lines.pop("ALLOWLISTED user_function") == "False"  # the user's code is converted
    assert lines and all(v == "True" for v in lines.values()), lines
    # one rank: the allreduce is the identity, and its gradient flows back unchanged
    result = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert result == "RESULT 14.0 [0.0, 2.0, 4.0, 6.0]", result
