"""horovod.tensorflow.keras and horovod.keras on 2 ranks: keras_checks.py under `horovodrun -np 2`,
once with Keras 3 (TensorFlow's default tf.keras) and once with tf-keras (TF_USE_LEGACY_KERAS=1).

The program prints what it measured (`KERAS {"key": ..., "value": ...}` per rank); every test here
asserts on those values:
(a) DistributedOptimizer in model.fit (traced, and run_eagerly) on half batches == one process on
    the full batch, for SGD+momentum and Adam, with fp16 compression, op=Sum, a predivide factor;
(b) backward_passes_per_step (averaged or not) == one step on the aggregated batch; Horovod's
    aggregation test with local variables and IndexedSlices; an infinite gradient in one cycle;
    PartialDistributedOptimizer; sparse gradients;
(c) the callbacks: broadcast (different initial weights end up equal; local variables stay; on
    models that build on their first batch, the first step starts from rank 0's weights),
    metric averaging (the mean of the ranks' values; a metric only one rank logs does not hang),
    learning-rate warmup and schedules (values per batch, Horovod's formulas), momentum correction
    (tf-keras legacy optimizers), BestModelCheckpoint (rank 0 writes);
(d) load_model wraps the saved optimizer and keeps its state (also custom optimizers/objects);
(e) elastic KerasState sync/restore/commit and the elastic callbacks during fit; the state on models
    that build on their first batch (made before training; a worker joining with one unbuilt).
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "torch"))
from hvd_launch import horovodrun  # noqa: E402

PROGRAM = HERE / "keras_checks.py"
FLAVORS = ["keras3", "tf_keras"]

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed (pip install "
                                        "'horovod-compat[tensorflow]')"),
              # the first test of each flavour includes its launch (about a minute on 2 cores)
              pytest.mark.timeout(720)]

#: A bound for a hang, not a speed check: about a minute on 2 idle cores, several times that
#: beside another suite worker and busy loops.
LAUNCH_TIMEOUT = 600


def _launch(flavor: str, tmp_path_factory) -> dict:
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if flavor == "tf_keras":
        if importlib.util.find_spec("tf_keras") is None:
            pytest.skip("tf-keras is not installed (scripts/test_tf_keras.py installs it)")
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env["TF_USE_LEGACY_KERAS"] = "0"
    scratch = tmp_path_factory.mktemp(f"keras-{flavor}")
    run = horovodrun(2, [sys.executable, str(PROGRAM), str(scratch)], timeout=LAUNCH_TIMEOUT,
                     env=env)
    assert not run.timed_out, f"{flavor}: keras_checks.py hung\n" + run.tail(80)
    per_rank = {}
    for rank in (0, 1):
        values = {}
        for line in run.rank_lines(rank):
            if line.startswith("KERAS "):
                item = json.loads(line[len("KERAS "):])
                values[item["key"]] = item["value"]
        per_rank[rank] = values
    errors = [per_rank[r].get("error") for r in (0, 1) if per_rank[r].get("error")]
    assert not errors, f"{flavor}: " + "\n".join(e["check"] + "\n" + e["traceback"] for e in errors)
    assert run.returncode == 0, run.tail(80)
    assert per_rank[0].get("done") and per_rank[1].get("done"), run.tail(80)
    assert per_rank[0]["flavor"] == flavor
    return per_rank


@pytest.fixture(scope="module", params=FLAVORS)
def results(request, tmp_path_factory):
    """One launch per flavour, shared by the tests of this module."""
    return request.param, _launch(request.param, tmp_path_factory)


def both(results, key):
    flavor, per_rank = results
    return per_rank[0][key], per_rank[1][key]


def close(a, b, tol):
    return max(abs(x - y) for x, y in zip(a, b)) <= tol and len(a) == len(b)


# ----------------------------------------------------------------------------- (a)

def test_keras_flavor_is_the_requested_one(results):
    flavor, per_rank = results
    module = per_rank[0]["tf_keras_module"]
    assert module.startswith("tf_keras") if flavor == "tf_keras" else module.startswith("keras")


def test_distributed_fit_on_half_batches_equals_full_batch(results):
    for label in ("numerics_graph", "numerics_eager", "numerics_steps_per_execution"):
        r0, r1 = both(results, label)
        for res in (r0, r1):
            assert res["diff_vs_full_batch"] <= 1e-5, (label, res["diff_vs_full_batch"])
            assert res["iterations"] == 20
            assert res["same_class"]
        assert close(r0["weights"], r1["weights"], 1e-6), label  # the ranks agree
    for label, tol in (("numerics_adam", 1e-5), ("numerics_fp16", 1e-3), ("numerics_sum", 1e-5),
                       ("numerics_predivide", 1e-5)):
        for value in both(results, label):
            assert value <= tol, (label, value)


# ----------------------------------------------------------------------------- (b)

def test_backward_passes_per_step_equals_one_step_on_the_aggregated_batch(results):
    for res in both(results, "backward_passes"):
        for average in ("average_True", "average_False"):
            agg = res[average]
            assert agg["diff_vs_full_batch"] <= 1e-5, (average, agg)
            assert agg["iterations"] == 20 and agg["counter"] == 0
            # the accumulators are not optimizer variables (checkpoints keep their layout)
            assert agg["optimizer_variables"] == res["plain_optimizer_variables"]
        assert res["odd"]["counter"] == 1 and res["odd"]["iterations"] == 3
        assert res["odd"]["diff_vs_one_step"] <= 1e-6


def _expected_aggregation(step: int, rank: int, average: bool, size: int = 2, passes: int = 4):
    """Horovod's test_gradient_aggregation_with_local_vars: d/dx = 1, d/dy0 = -(rank + 1);
    variables 0 and 1 are local (their gradient divided by the size), 2 and 3 averaged."""
    applied = (step + 1) // passes
    factor = 1 if average else passes
    x_global, x_local = applied * factor, applied * factor / size
    y_global = 1.0 - applied * factor * (size + 1) / 2
    y_local = 1.0 - applied * factor * (rank + 1) / size
    return [x_local, x_local, x_global, x_global], [y_local, y_local, y_global, y_global]


def test_gradient_aggregation_with_local_variables_in_tf_function(results):
    for rank, res in enumerate(both(results, "aggregation_local_vars")):
        for average in (True, False):
            run = res[f"average_{average}"]
            assert run["counter"] == 10 % 4
            for step, seen in enumerate(run["history"]):
                x, y0 = _expected_aggregation(step, rank, average)
                assert close(seen["x"], x, 1e-6), (rank, average, step, seen, x)
                assert close(seen["y0"], y0, 1e-6), (rank, average, step, seen, y0)
                assert seen["y1"] == [2.0] * 4
                assert seen["iterations"] == step + 1


def test_infinite_gradient_does_not_leak_into_the_next_cycle(results):
    for res in both(results, "inf_gradient_cycle"):
        assert res == {"last_grad_finite": True, "counter": 0}


def test_loss_scale_optimizer_in_a_custom_loop_skips_an_overflow_on_every_rank(results):
    """LossScaleOptimizer(DistributedOptimizer) with apply_gradients in a custom loop, rank 1
    overflowing at the second of 4 steps: both ranks skip it (the scale halves once on both),
    apply the other 3 with the same averaged gradients (equal weights that moved), and the job
    neither hangs nor pairs different steps' reductions."""
    per_rank = [dict(r) for r in both(results, "loss_scale_custom_loop")]
    initial = [r.pop("initial_weights") for r in per_rank][0]
    assert per_rank[0].keys() == per_rank[1].keys() and per_rank[0], per_rank
    first = next(iter(per_rank[0].values()))
    for case in per_rank[0]:
        a, b = per_rank[0][case], per_rank[1][case]
        assert a["scale"] == b["scale"] == a["initial_scale"] / 2, (case, a, b)
        assert a["iterations"] == b["iterations"], (case, a, b)
        assert a["weights"] == b["weights"], case
        assert not close(a["weights"], initial, 1e-4), f"{case}: nothing was applied"
        # eager and traced (and legacy) runs of the same steps agree
        assert close(a["weights"], first["weights"], 1e-6), case


def test_partial_distributed_optimizer_and_sparse_gradients(results):
    for res in both(results, "partial_optimizer"):
        assert [g["local"] for g in res] == [True, True, False, False]
        assert all(g["diff"] <= 1e-6 for g in res), res
    for res in both(results, "sparse"):
        # rows only one rank touched move by half the step; rows both touched by a full step
        for as_dense in ("False", "True"):
            assert close(res[as_dense], [0.475, 0.475, 0.45, 0.5], 1e-6), res


def test_process_set_limits_the_reduction(results):
    for res in both(results, "process_set"):
        assert res["diff_vs_own_half"] <= 1e-6
        assert res["diff_vs_full_batch"] > 1e-3


# ----------------------------------------------------------------------------- (c)

def test_broadcast_global_variables_callback(results):
    r0, r1 = both(results, "broadcast_callback")
    assert r0["initial_diff_before"] == 0.0 and r1["initial_diff_before"] > 0.1
    for res in (r0, r1):
        assert res["diff_after_lr0"] == 0.0  # rank 0's initial weights everywhere
        # broadcast before the first step: training == one process from rank 0's weights
        assert res["diff_vs_rank0_start"] <= 1e-5
        assert res["local_kernel_is_mine"] == 0.0 and res["others_are_root"] == 0.0
    assert r0["optimizer_state"] == r1["optimizer_state"]


def test_broadcast_callback_on_models_that_build_on_their_first_batch(results):
    """tf-keras: a Sequential without an input shape and a subclassed model have no weights
    until their first batch (Horovod's tensorflow2_keras_mnist.py stopped there with "Weights
    for model 'sequential' have not yet been created"); the first step still starts from rank 0's
    weights on every rank."""
    r0, r1 = both(results, "broadcast_unbuilt")
    for res in (r0, r1):
        assert set(res) == {f"{kind}_{mode}" for kind in ("sequential", "subclassed")
                            for mode in ("traced", "eager")}
        for case, diff in res.items():
            assert diff <= 1e-5, (case, diff)


def test_metric_average_callback(results):
    r0, r1 = both(results, "metric_average")
    for epoch in range(3):
        for key in ("loss", "mae"):
            mean = (r0["raw"][epoch][key] + r1["raw"][epoch][key]) / 2
            assert r0["raw"][epoch][key] != r1["raw"][epoch][key]
            for res in (r0, r1):
                assert res["averaged"][epoch][key] == pytest.approx(mean, rel=1e-6)
        # a metric logged by one rank only: no deadlock, local value kept
        assert "only_on_rank1" not in r0["averaged"][epoch]
        assert r1["averaged"][epoch]["only_on_rank1"] == 6.0
    for res in (r0, r1):
        assert res["history_loss"] == [e["loss"] for e in res["averaged"]]


def _expected_lr(epoch: int, batch: int, initial=0.2, size=2, warmup=2, steps=4):
    if epoch < warmup:  # Horovod's warmup, adjusted every batch
        e = epoch + batch / steps + 1 / steps
        return initial / size * (e * (size - 1) / warmup + 1)
    if epoch < 4:  # constant multiplier 0.5 from epoch 2: exponential decay, staircase
        return initial * 0.5 ** (epoch - 2)
    return initial * 0.01 * epoch  # multiplier function from epoch 4


def test_learning_rate_warmup_and_schedule_callbacks(results):
    flavor = results[0]
    for res in both(results, "learning_rate"):
        assert len(res["seen"]) == 6 * 4
        for seen in res["seen"]:
            expected = _expected_lr(seen["epoch"], seen["batch"])
            assert seen["lr"] == pytest.approx(expected, rel=1e-6), seen
        assert res["history_lr"] == pytest.approx([_expected_lr(e, 3) for e in range(6)], rel=1e-6)
        assert res["lr_attr"] == pytest.approx(_expected_lr(5, 3), rel=1e-6)
        assert res["seen_unbuilt"] == res["seen"]  # the same on a model that builds on its first batch
        if flavor == "tf_keras":  # momentum correction for the batch the learning rate halves
            momentum = [(m["epoch"], m["batch"], round(m["momentum"], 6), round(m["momentum_after"], 6))
                        for m in res["momentum"]]
            assert momentum == [(0, 0, 0.9, 0.9), (0, 1, 0.9, 0.9), (1, 0, 0.45, 0.9), (1, 1, 0.9, 0.9)]


def test_best_model_checkpoint_writes_on_rank_0_only(results):
    r0, r1 = both(results, "best_model_checkpoint")
    assert r0["written"] and r0["late_written"] and r0["save_best_only"]
    assert not r1["written"] and not r1["late_written"]


# ----------------------------------------------------------------------------- (d)

def test_load_model_wraps_the_optimizer_and_keeps_its_state(results):
    flavor = results[0]
    r0, r1 = both(results, "load_model")
    expected_cases = {"plain", "custom_optimizers", "custom_objects"}
    if flavor == "tf_keras":
        expected_cases |= {"legacy_opts", "native_format"}
    assert set(r0) == expected_cases
    for case in expected_cases:
        for res in (r0[case], r1[case]):
            assert res["distributed"] and res["isinstance"], (case, res)
            assert res["class"] == res["base_class"]
            assert res["lr"] == pytest.approx(0.05)
            assert res["state_variables"][0] == res["state_variables"][1] > 2, (case, res)
            assert res["state_diff"] == 0.0, (case, res)
        # trained on after loading, distributed: the ranks agree
        assert close(r0[case]["weights_after"], r1[case]["weights_after"], 1e-6), case


# ----------------------------------------------------------------------------- (e)

def test_elastic_keras_state_and_callbacks(results):
    for res in both(results, "elastic"):
        assert res["synced"] == [[[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0]]  # rank 0's weights
        assert res["synced_attrs"] == [20, 10]
        assert res["restored"] == 0.0 and res["restored_attrs"] == [20, 10]
        assert res["committed"] == 0.0 and res["committed_attrs"] == [21, 11]
        # batches_per_commit=2 over 2 epochs of 4 batches, plus one commit per epoch end
        assert res["commits"] == [[0, 1], [0, 3], [1, 0], [1, 1], [1, 3], [2, 0]]
        assert res["final"] == [2, 0]
        assert res["run_is_callable"]


# ----------------------------------------------------------------------------- the API

def test_elastic_keras_state_on_models_that_build_on_their_first_batch(results):
    """A state made before the first batch: training equals one process from rank 0's weights
    (traced and run eagerly) and a commit restores. A worker joining with an unbuilt model and
    optimizer: after sync it holds the survivor's weights and optimizer state exactly, and
    training on equals one process going on from that state."""
    for rank, res in zip((0, 1), both(results, "elastic_unbuilt")):
        for kind in ("sequential", "subclassed"):
            for mode in ("traced", "eager"):
                start = res[f"start_{kind}_{mode}"]
                assert start["vs_reference"] < 1e-5, (rank, kind, mode, start)
                assert start["restored"] == 0.0 and start["epoch"] == 3, (rank, kind, mode, start)
            joined = res[f"joined_{kind}"]
            assert joined["weights"] == 0.0 and joined["slots"] == 0.0, (rank, kind, joined)
            weights, slots, root_weights, root_slots = joined["counts"]
            assert weights == root_weights == 4 and slots == root_slots > 4, (rank, kind, joined)
            before = joined["counts_before"]
            # rank 1 came with nothing built (an optimizer's step count / learning rate at most)
            assert before == [4, slots] if rank == 0 else (before[0] == 0 and before[1] <= 2), \
                (rank, kind, joined)
            assert joined["batch"] == 7, (rank, kind, joined)  # rank 0's attributes
            assert joined["vs_reference"] < 1e-5, (rank, kind, joined)


def test_value_collectives_and_namespace(results):
    flavor = results[0]
    for rank, res in enumerate(both(results, "api")):
        assert res["allreduce"] == [1.5, 2.0]
        assert res["allreduce_sum"] == [3.0]
        assert res["keras_allreduce_default_average"] == [1.5]
        assert res["keras_allreduce_op"] == [3.0]
        assert res["allreduce_scalar"] == [1.5, 0] and res["broadcast_scalar"] == 4.0
        assert res["allgather"] == [[0.0], [1.0]]
        assert res["broadcast"] == [6.0]
        assert res["reducescatter"] == ([[1.5]] if rank == 0 else [[3.0]])
        assert "does not support eager execution" in res["broadcast_global_variables"]
        assert res["from_config_roundtrip"] and res["variables_callable"] and res["module"]
        assert res["lr_alias"] == pytest.approx(0.003)
        assert res["set_value_lr"] == pytest.approx([0.004, 0.004])
        assert res["via_horovod_tensorflow"] == [True, 2]
        assert len(res["names"]) == 23, res["names"]
        if flavor == "keras3":
            assert res["compile_patch"] == {"jit_compile": False, "warned": True, "plain_ok": True}
