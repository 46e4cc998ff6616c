"""horovod.tensorflow on the shared runtime: binding_program.py under `horovodrun -np 2` (one
launch), every value checked against what Horovod 0.28.1 computes."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "torch"))
from hvd_launch import horovodrun  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install "
                                       "'horovod-compat[tensorflow]')")


@pytest.fixture(scope="module")
def timeline_path(tmp_path_factory):
    return tmp_path_factory.mktemp("tf_timeline") / "timeline.json"


@pytest.fixture(scope="module")
def results(timeline_path):
    run = horovodrun(2, [sys.executable, str(HERE / "binding_program.py")], timeout=240,
                     env={"TF_CPP_MIN_LOG_LEVEL": "2", "HOROVOD_TIMELINE": str(timeline_path)})
    assert not run.timed_out, run.tail()
    assert run.returncode == 0, run.tail()
    per_rank = {}
    for rank in (0, 1):
        per_rank[rank] = {}
        for line in run.rank_lines(rank):
            if line.startswith("RESULT "):
                item = json.loads(line[len("RESULT "):])
                per_rank[rank][item["key"]] = item["value"]
    return per_rank


def test_the_timeline_records_tensorflow_ops_as_horovod_does(results, timeline_path):
    events = json.loads(timeline_path.read_text())
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("name") == "process_name" and e.get("pid")}
    spans = {}
    for e in events:
        if e.get("ph") == "B" and e.get("pid") in rows:
            spans.setdefault(rows[e["pid"]], []).append(e["name"])
    reduce_rows = [n for n in rows.values() if n.startswith("allreduce.")]
    assert reduce_rows, sorted(rows.values())
    for name in reduce_rows:   # Horovod's structure: negotiation, then the op with its transfer
        assert spans[name][0] == "NEGOTIATE_ALLREDUCE" and "ALLREDUCE" in spans[name], spans[name]
    kinds = {n.split(".")[0] for n in rows.values()}
    assert {"allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall"} <= kinds, kinds


def both(results, key):
    return results[0][key], results[1][key]


def test_allreduce_ops_scales_dtypes_and_compression(results):
    for rank in (0, 1):
        res = results[rank]
        assert res["allreduce_avg"] == [1.5, 3.0]
        assert res["allreduce_sum_pre_post"] == [3.0, 6.0]
        assert res["allreduce_max"] == [2.0, 4.0]
        assert res["allreduce_uint16"] == [65534, 6]  # wraps as uint16 does
        assert res["allreduce_int_avg"] == [10, -10]   # (7 + 14) // 2 truncated; -21 / 2 -> -10
        assert res["allreduce_fp16"] == [1.5, 3.0]
        assert res["grouped"] == [[3.0, 6.0], [1]]
        assert res["indexed_slices"] == [[[1.0, 1.0], [2.0, 2.0]], [0, 1]]


def test_movement_ops(results):
    for rank in (0, 1):
        res = results[rank]
        assert res["allgather_uneven"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert res["grouped_allgather"] == [[0, 1], [[0, 0], [1, 1]]]
        assert res["broadcast"] == [2.0, 4.0]
        assert res["broadcast_variables"] == [1.0, 1.0]
        assert res["objects"] == [{"from": 1}, [0, 1]]
    assert both(results, "alltoall") == ([[0, 10, 11], [1, 2]], [[1, 2, 3, 12, 13], [3, 2]])
    assert both(results, "reducescatter") == ([[0.0], [2.0]], [[4.0], [6.0]])


def test_gradients_follow_horovods_rules(results):
    r0, r1 = results[0], results[1]
    assert r0["grad_allreduce"] == [4.0] * 3 and r1["grad_allreduce"] == [8.0] * 3
    assert r0["grad_allgather"] == [1.0] * 3 and r1["grad_allgather"] == [1.0] * 3
    assert r0["grad_broadcast"] == [1.0] * 3 and r1["grad_broadcast"] == [0.0] * 3


def test_traced_functions_run_the_same_collectives(results):
    # last of 3 calls: a = [r + 2]
    for rank in (0, 1):
        s, gathered, doubled, grad = results[rank]["tf_function"]
        assert s == [5.0] and gathered == [2.0, 3.0] and doubled == [10.0]
        assert grad == [2.0 * (rank + 2) * 2]


def test_tape_and_tf1_optimizer_average_gradients(results):
    for rank in (0, 1):
        res = results[rank]
        assert res["tape_isinstance"] is True
        assert res["tape_grads"] == [1.5, 3.0]   # mean of [1,2]*1 and [1,2]*2
        assert res["v1_optimizer"] == pytest.approx([1.0 - 0.5 * 1.5, 1.0 - 0.5 * 3.0])


def test_both_bindings_share_one_runtime(results):
    for rank in (0, 1):
        res = results[rank]
        assert res["same_world"] == [rank, 2, rank, 2]
        assert res["process_set_shared"][1] == [1]
        assert res["mixed_bindings"] == [[2.0], [4.0]]
        assert res["join"] in (0, 1)
        assert res["barrier"] == "passed"
