"""An elastic Keras job under tf-keras whose model builds on its first batch, with a worker
SIGKILLed mid-training (elastic_keras_unbuilt.py): ``KerasState`` is made before any batch, every
worker (the replacement too) starts from weights of its own seed, and the job must recover, take
the replacement back in, and end with the same weights on every rank -- which holds only if the
first sync gave every rank rank 0's weights as the models built, and the replacement, joining
with an unbuilt model, was built at its sync and given rank 0's weights and optimizer state."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from examples_support import run  # noqa: E402
from procs import left_after  # noqa: E402 - tests/, on sys.path through examples_support
from test_upstream_elastic import worker_pids  # noqa: E402 - the PyTorch elastic test's finder

PROGRAM = HERE / "elastic_keras_unbuilt.py"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                       reason="tf-keras is not installed (scripts/bootstrap.sh installs it for the tests)"),
]


@pytest.mark.timeout(420)
def test_a_replacement_with_an_unbuilt_model_joins_and_every_rank_ends_equal(tmp_path):
    marker = {"HOROVOD_COMPAT_TEST_MARKER": f"elastic-keras-{uuid.uuid4().hex}"}
    done = run([sys.executable, "-m", "horovod_compat.run", "-np", "2", "--min-np", "1",
                "--max-np", "2", "-H", "localhost:2", sys.executable, str(PROGRAM)],
               env={"TF_USE_LEGACY_KERAS": "1", **marker}, cwd=tmp_path, timeout=360,
               kill_worker_when=r"^\[0\]<stdout>:EPOCH 3 size 2 ", worker_pids=worker_pids)
    (key, value), = marker.items()
    assert left_after(f"{key}={value}") == [], "a launcher or worker of the job outlived it"
    assert not done.timed_out, done.tail()
    assert done.killed is not None, "the trigger line never came with two workers running:\n" + done.tail()
    assert done.returncode == 0, done.tail()
    out = done.output
    assert re.search(r"elastic job: worker \d+ \(rank \d+ of round \d+, host \S+\) killed by SIGKILL"
                     r" -> replacement worker \d+", out), done.tail()
    assert "restoring the last commit" in out, done.tail()
    sizes = [int(s) for s in re.findall(r"^\[0\]<stdout>:EPOCH \d+ size (\d+) ", out, re.M)]
    assert sizes[-1] == 2, sizes  # the replacement joined and trained to the end
    result = json.loads(re.search(r"^\[0\]<stdout>:RESULT (\{.*\})$", out, re.M).group(1))
    assert result["size"] == 2 and result["epoch"] == 14, result
    assert result["ranks_agree"] is True, result
    assert result["loss"] < 0.5, result
