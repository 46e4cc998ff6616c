"""Cross-rank checks and the stall inspector on 2 real ranks.

A collective whose shape, dtype, op (or kind, name, root) differ across ranks must raise
HorovodInternalError on EVERY rank with Horovod's message, leave good ranks' in-place tensors
intact, and later collectives must still work.
"""
from __future__ import annotations

import pytest

from distributor import RankFailedError
from warm import run_function_warm


def _mismatches():
    import torch
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    out = []

    def attempt(label, fn):
        try:
            fn()
            out.append((label, None))
        except hvd.HorovodInternalError as e:
            out.append((label, str(e)))
        except Exception as e:  # wrong exception type is a failure the test reports
            out.append((label, f"WRONG {type(e).__name__}: {e}"))
        # the job keeps working after every mismatch
        ok = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after-{label}")
        out.append((f"after {label}", ok.tolist()))

    attempt("shape", lambda: hvd.allreduce(torch.ones(4 if r == 0 else 3), name="m"))
    attempt("dtype", lambda: hvd.allreduce(torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64)))
    attempt("op", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum if r == 0 else hvd.Max))
    attempt("allgather rank", lambda: hvd.allgather(torch.ones(2, 2) if r == 0 else torch.ones(2)))
    attempt("allgather dim", lambda: hvd.allgather(torch.ones(2, 3 + r)))
    attempt("broadcast root", lambda: hvd.broadcast(torch.ones(2), root_rank=r))
    attempt("kind", lambda: hvd.allreduce(torch.ones(2)) if r == 0 else hvd.allgather(torch.ones(2)))
    attempt("grouped count", lambda: hvd.grouped_allreduce([torch.ones(2)] * (1 + r)))
    # different names are not a mismatch: Horovod pairs by name (each rank submits both, in its
    # own order)
    hn = [hvd.allreduce_async(torch.ones(2), name=f"name{(r + i) % 2}", op=hvd.Sum) for i in range(2)]
    out.append(("names paired", [hvd.synchronize(h).tolist() for h in hn]))
    # a cached, named, in-place op whose shape changes on one rank only
    for _ in range(3):
        hvd.allreduce_(torch.ones(4), name="cached")
    kept = torch.arange(4.0)
    attempt("changed on one rank", lambda: hvd.allreduce_(kept if r == 0 else torch.ones(5),
                                                           name="cached", op=hvd.Sum))
    out.append(("in-place tensor intact", kept.tolist()))
    # the same with a cached grouped op whose small tensors travel fused: the changed rank joins
    # the fused transfer with a dummy of the cached layout
    for _ in range(3):
        hvd.grouped_allreduce_([torch.ones(4), torch.ones(2), torch.ones(3, dtype=torch.float64)],
                               name="cached.group")
    kept_group = [torch.arange(4.0), torch.ones(2), torch.ones(3, dtype=torch.float64)]
    attempt("grouped changed on one rank", lambda: hvd.grouped_allreduce_(
        kept_group if r == 0 else [torch.ones(4), torch.ones(5), torch.ones(3, dtype=torch.float64)],
        name="cached.group", op=hvd.Sum))
    out.append(("grouped in-place tensors intact", kept_group[0].tolist()))
    # unnamed ops share a cache slot; a one-rank change is caught too
    for _ in range(3):
        hvd.allreduce(torch.ones(3))
    attempt("unnamed changed", lambda: hvd.allreduce(torch.ones(3 if r == 0 else 2)))
    # a consistent shape change on every rank is legal
    attempt("consistent change", lambda: hvd.allreduce_(torch.ones(6), name="cached", op=hvd.Sum))
    res = hvd.allreduce(torch.full((6,), 1.0), name="cached", op=hvd.Sum)
    out.append(("cached new shape value", res.tolist()))
    # an unnamed slot used with alternating shapes ("polymorphic"): works, and a one-rank
    # difference is still caught
    for i in range(4):
        out.append((f"alternating {i}", hvd.allreduce(torch.ones(2 + i % 2), op=hvd.Sum).tolist()))
    attempt("poly changed", lambda: hvd.allreduce(torch.ones(2 if r == 0 else 3)))
    # the steady state is cheap: no verification round once names are known
    st = hvd.global_process_set.negotiation
    for _ in range(2):
        hvd.allreduce(torch.ones(8), name="loop.a")
        hvd.allgather(torch.ones(2, 2), name="loop.b")
        hvd.allreduce(torch.ones(3))
    before = st.verify_rounds
    for _ in range(10):
        hvd.allreduce(torch.ones(8), name="loop.a")
        hvd.allgather(torch.ones(2, 2), name="loop.b")
        hvd.allreduce(torch.ones(3))
    out.append(("verification rounds in steady state", st.verify_rounds - before))
    out.append(("control", type(st.exchange).__name__))
    # many async ops in flight, waited in reverse order
    hs = [hvd.allreduce_async(torch.full((4,), float(i)), name=f"async.{i}", op=hvd.Sum)
          for i in range(50)]
    out.append(("async reverse", [hvd.synchronize(h)[0].item() for h in reversed(hs)]))
    # new names (verification rounds) and a broadcast, synchronized in a different order per rank
    hs = [hvd.allreduce_async(torch.full((3,), float(i)), name=f"order.{i}", op=hvd.Sum)
          for i in range(6)]
    hb = hvd.broadcast_async(torch.full((2,), float(r)), root_rank=1, name="order.b")
    order = list(range(6)) if r == 0 else list(reversed(range(6)))
    vals = {i: hvd.synchronize(hs[i])[0].item() for i in order}
    out.append(("different wait orders", [vals[i] for i in range(6)]))
    out.append(("broadcast after them", hvd.synchronize(hb).tolist()))
    # an async op whose shape differs: the error comes out of synchronize on every rank
    h = hvd.allreduce_async(torch.ones(2 + r), name="async.bad")
    try:
        hvd.synchronize(h)
        out.append(("async mismatch", None))
    except hvd.HorovodInternalError as e:
        out.append(("async mismatch", str(e)))
    hvd.shutdown()
    return out


# shm: one host (the default); tcp: ranks on several hosts (TCP mesh for control and data); gloo:
# sets larger than the mesh allows, forced here with HOROVOD_COMPAT_TCP_CONTROL=0
CONTROLS = {"shm": ({}, "ShmExchange"),
            "shm-control-gloo-data": ({"HOROVOD_COMPAT_SHM_DATA": "0"}, "ShmExchange"),
            "tcp": ({"HOROVOD_COMPAT_SHM_CONTROL": "0"}, "TcpExchange"),
            "gloo": ({"HOROVOD_COMPAT_SHM_CONTROL": "0", "HOROVOD_COMPAT_TCP_CONTROL": "0"},
                     "GlooExchange")}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_mismatches_fail_on_every_rank_and_job_keeps_working(control):
    env, exchange = CONTROLS[control]
    reports = run_function_warm(_mismatches, num_processes=2, return_all=True, timeout=120, env=env)
    r0, r1 = (dict(rep) for rep in reports)
    want = {
        "shape": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [4], but another "
                 "rank sent a tensor of shape [3].",
        "dtype": "Mismatched data types: One rank had type float32, but another rank had type float64.",
        "op": "Mismatched ALLREDUCE reduction operations: One rank did Sum, but another rank did Max.",
        "allgather rank": "Mismatched ALLGATHER tensor shapes: One rank sent a tensor of rank 2, but "
                          "another rank sent a tensor of rank 1.",
        "allgather dim": "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 "
                         "equal to 3, but another rank sent a tensor with dimension 1 equal to 4.",
        "broadcast root": "Mismatched BROADCAST root ranks: One rank specified root rank 0, but "
                          "another rank specified root rank 1.",
        "kind": "Mismatched collective operations: One rank did an ALLREDUCE, but another rank did "
                "an ALLGATHER.",
        "grouped count": "Mismatched number of tensors in grouped ALLREDUCE",
        "changed on one rank": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape "
                               "[4], but another rank sent a tensor of shape [5].",
        "grouped changed on one rank": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor "
                                       "of shape [2], but another rank sent a tensor of shape [5].",
        "poly changed": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2], "
                        "but another rank sent a tensor of shape [3].",
        "unnamed changed": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [3], "
                           "but another rank sent a tensor of shape [2].",
    }
    # after Horovod's sentence: the op's name and each rank's value (for unnamed ops the ranks'
    # automatic names, which they exchange for the message, on every control transport)
    tails = {
        "shape": " Tensor 'm': rank 0 sent shape [4]; rank 1 sent shape [3].",
        "dtype": "): rank 0 had type float32; rank 1 had type float64.",
        "kind": "): rank 0 did an ALLREDUCE; rank 1 did an ALLGATHER.",
        "grouped count": "): rank 0 sent 1 tensor; rank 1 sent 2 tensors.",
        "grouped changed on one rank": " Grouped ALLREDUCE 'cached.group', tensor index 1 of 3: "
                                       "rank 0 sent shape [2]; rank 1 sent shape [5].",
        "unnamed changed": "): rank 0 sent shape [3]; rank 1 sent shape [2].",
    }
    subjects = ("Unnamed tensor (automatic name '", "Unnamed grouped ALLREDUCE (automatic name '",
                " Tensor '", " Grouped ALLREDUCE '")
    for rep in (r0, r1):
        for label, msg in want.items():
            assert rep[label] is not None and rep[label].startswith(msg), (label, rep[label])
            assert rep[f"after {label}"] == [2.0, 2.0], label
            assert rep[label] == r0[label], (label, rep[label], r0[label])  # the same everywhere
            assert rep[label].endswith(tails.get(label, ".")), (label, rep[label])
            assert any(s in rep[label] for s in subjects), rep[label]
        assert rep["consistent change"] is None
        assert rep["cached new shape value"] == [2.0] * 6
        assert [rep[f"alternating {i}"] for i in range(4)] == [[2.0] * 2, [2.0] * 3] * 2
        assert rep["verification rounds in steady state"] == 0
        assert rep["control"] == exchange
        assert rep["names paired"] == [[2.0, 2.0], [2.0, 2.0]]
        assert rep["async reverse"] == [2.0 * i for i in reversed(range(50))]
        assert rep["different wait orders"] == [2.0 * i for i in range(6)]
        assert rep["broadcast after them"] == [1.0, 1.0]
        assert rep["async mismatch"].startswith("Mismatched ALLREDUCE tensor shapes")
    assert r0["in-place tensor intact"] == [0.0, 1.0, 2.0, 3.0]
    assert r0["grouped in-place tensors intact"] == [0.0, 1.0, 2.0, 3.0]


def _mismatch_texts():
    import torch
    import horovod.torch as hvd
    from horovod_compat.common import collectives
    torch.set_num_threads(1)
    odd = hvd.ProcessSet([1, 2])
    hvd.init(process_sets=[odd])
    r = hvd.rank()
    out = {}

    def attempt(label, fn):
        try:
            fn()
            out[label] = None
        except hvd.HorovodInternalError as e:
            out[label] = str(e)
        after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after-{label}")
        out[f"after {label}"] = after.tolist()

    def next_auto_name(kind):  # what the runtime's counter gives this kind's next unnamed op
        counter = collectives._noname.get(kind)
        return f"{kind}.noname.{repr(counter)[len('count('):-1] if counter is not None else 0}"

    # 3 ranks, two of which agree
    attempt("shape", lambda: hvd.allreduce(torch.ones(4 if r == 1 else 3), name="metric"))
    attempt("dtype", lambda: hvd.allreduce(
        torch.ones(2, dtype=torch.float64 if r == 2 else torch.float32), name="acc"))
    attempt("root", lambda: hvd.broadcast(torch.ones(2), root_rank=2 if r == 2 else 0,
                                          name="weights"))
    attempt("op", lambda: hvd.allreduce(torch.ones(2), op=hvd.Max if r == 0 else hvd.Sum,
                                        name="loss"))
    attempt("grouped", lambda: hvd.grouped_allreduce(
        [torch.ones(2), torch.ones(5 if r == 2 else 3)], name="grads"))
    attempt("allgather", lambda: hvd.allgather(torch.ones(1, 3 if r == 0 else 2), name="rows"))
    # unnamed: the automatic name (the next one this rank's counter gives) is in the text; after
    # rank 0 did an unnamed allgather where the others did an allreduce, the ranks' counters
    # differ, and the text names each rank's
    out["next auto name"] = next_auto_name("allreduce")
    attempt("unnamed", lambda: hvd.allreduce(torch.ones(2 if r < 2 else 1)))
    out["next auto names"] = next_auto_name("allgather"), next_auto_name("allreduce")
    attempt("kind", lambda: hvd.allgather(torch.ones(2)) if r == 0
            else hvd.allreduce(torch.ones(2)))
    out["next auto name after"] = next_auto_name("allreduce")
    attempt("diverged", lambda: hvd.allreduce(
        torch.ones(2, dtype=torch.int32 if r else torch.int64)))
    # a process set: its ranks are named by their global rank
    if r in (1, 2):
        try:
            hvd.allreduce(torch.ones(1 + r), process_set=odd, name="in.set")
            out["process set"] = None
        except hvd.HorovodInternalError as e:
            out["process set"] = str(e)
    hvd.barrier()
    hvd.shutdown()
    return out


def test_mismatch_messages_name_the_tensor_and_what_each_rank_sent():
    """Horovod's sentence, then the op's name and every rank's value, grouped by value (3 ranks,
    two of which agree); the same text on every rank."""
    reps = run_function_warm(_mismatch_texts, num_processes=3, return_all=True, timeout=180)
    want = {
        "shape": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [3], but "
                 "another rank sent a tensor of shape [4]. Tensor 'metric': ranks 0, 2 sent shape "
                 "[3]; rank 1 sent shape [4].",
        "dtype": "Mismatched data types: One rank had type float32, but another rank had type "
                 "float64. Tensor 'acc': ranks 0, 1 had type float32; rank 2 had type float64.",
        "root": "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
                "specified root rank 2. Tensor 'weights': ranks 0, 1 specified root rank 0; rank 2 "
                "specified root rank 2.",
        "op": "Mismatched ALLREDUCE reduction operations: One rank did Max, but another rank did "
              "Sum. Tensor 'loss': rank 0 did Max; ranks 1, 2 did Sum.",
        "grouped": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [3], but "
                   "another rank sent a tensor of shape [5]. Grouped ALLREDUCE 'grads', tensor "
                   "index 1 of 2: ranks 0, 1 sent shape [3]; rank 2 sent shape [5].",
        "allgather": "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 "
                     "equal to 3, but another rank sent a tensor with dimension 1 equal to 2. "
                     "Tensor 'rows': rank 0 sent shape [1, 3]; ranks 1, 2 sent shape [1, 2].",
        "kind": "Mismatched collective operations: One rank did an ALLGATHER, but another rank did "
                "an ALLREDUCE. Unnamed tensor (automatic name {k0!r} on rank 0; {k1!r} on ranks "
                "1, 2): rank 0 did an ALLGATHER; ranks 1, 2 did an ALLREDUCE.",
        "process set": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2], "
                       "but another rank sent a tensor of shape [3]. Tensor 'in.set': rank 1 sent "
                       "shape [2]; rank 2 sent shape [3].",
    }
    auto = [rep["next auto name"] for rep in reps]
    assert len(set(auto)) == 1, auto  # the ranks agree before they diverge
    unnamed = (f"Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2], but "
               f"another rank sent a tensor of shape [1]. Unnamed tensor (automatic name "
               f"{auto[0]!r}): ranks 0, 1 sent shape [2]; rank 2 sent shape [1].")
    # after the kind mismatch, rank 0's allreduce counter is one behind the others'
    a0, a1, a2 = (rep["next auto name after"] for rep in reps)
    assert a1 == a2 and a0 != a1, (a0, a1)
    want["kind"] = want["kind"].format(k0=reps[0]["next auto names"][0],
                                       k1=reps[1]["next auto names"][1])
    diverged = (f"Mismatched data types: One rank had type int64, but another rank had type int32. "
                f"Unnamed tensor (automatic name {a0!r} on rank 0; {a1!r} on ranks 1, 2): rank 0 "
                f"had type int64; ranks 1, 2 had type int32.")
    for r, rep in enumerate(reps):
        for label, msg in want.items():
            if label != "process set" or r in (1, 2):
                assert rep[label] == msg, (r, label, rep[label])
        assert rep["unnamed"] == unnamed, (r, rep["unnamed"])
        assert rep["diverged"] == diverged, (r, rep["diverged"])
        for label in list(want) + ["unnamed", "diverged"]:
            if label != "process set":
                assert rep[f"after {label}"] == [3.0, 3.0], (r, label)


def test_mismatch_text_for_many_ranks_stays_short_and_names_joined_ranks():
    """The validators on descriptors of 12 ranks (no job needed): a few ranks per value, a few
    values, then counts; the global ranks given; ranks that joined are said to have."""
    from horovod_compat.common import collectives  # noqa: F401  (registers the kinds)
    from horovod_compat.common.negotiation import Desc, _validate

    def text(descs, ranks, name="big", auto=None):
        first = next(d for d in descs if d is not None)
        return _validate(None, descs).text(first.kind, len(first.shapes), name, auto, ranks)

    shapes = [(2,)] * 9 + [(3,), (4,), (5,)]
    descs = [Desc("allreduce", "big", 1, "float32", (s,)) for s in shapes]
    assert text(descs, list(range(100, 112))) == (
        "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2], but another rank "
        "sent a tensor of shape [3]. Tensor 'big': ranks 100, 101, 102, 103 and 5 more sent shape "
        "[2]; rank 109 sent shape [3]; rank 110 sent shape [4]; rank 111 sent shape [5].")
    shapes = [(i % 6,) for i in range(12)]
    descs = [Desc("allreduce", "big", 1, "float32", (s,)) for s in shapes]
    assert text(descs, list(range(12))).endswith(
        "Tensor 'big': ranks 0, 6 sent shape [0]; ranks 1, 7 sent shape [1]; ranks 2, 8 sent shape "
        "[2]; ranks 3, 9 sent shape [3]; 4 more ranks with 2 other values.")
    descs = [None, Desc("allreduce", "", 1, "float32", ((2,),)), None,
             Desc("allreduce", "", 1, "float64", ((2,),))]
    auto = [None, "allreduce.noname.7", None, "allreduce.noname.7"]
    assert text(descs, [0, 1, 2, 3], "", auto) == (
        "Mismatched data types: One rank had type float32, but another rank had type float64. "
        "Unnamed tensor (automatic name 'allreduce.noname.7'): rank 1 had type float32; rank 3 had "
        "type float64; ranks 0, 2 had called hvd.join().")


def _submitted_in_different_orders():
    import time
    import torch
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    st = hvd.global_process_set.negotiation
    out = {"control": type(st.exchange).__name__}
    # upstream Horovod's duplicate-name test: one rank submits an async op before a barrier, the
    # other after it; Horovod pairs ops by name, so both barriers and the op complete
    t = torch.full((3,), float(r + 1))
    if r == 0:
        h = hvd.allreduce_async(t, name="early", op=hvd.Sum)
    hvd.barrier()
    if r == 1:
        h = hvd.allreduce_async(t, name="early", op=hvd.Sum)
    hvd.barrier()
    out["early"] = hvd.synchronize(h).tolist()
    # the other half of that test: rank 1's op pairs with rank 0's at once, and rank 1 submits the
    # name again on its next line. A preempted caller (here: a sleep while the op finishes) must
    # still find the name busy, as it would have been had the op run longer; once the handle was
    # synchronized, or the reuse window has passed, the name is free again.
    if r == 0:
        h = hvd.allreduce_async(t, name="again", op=hvd.Sum)
    hvd.barrier()
    if r == 1:
        h = hvd.allreduce_async(t, name="again", op=hvd.Sum)
        deadline = time.monotonic() + 5
        st_h = hvd.global_process_set.negotiation.unobserved
        while "again" not in st_h and time.monotonic() < deadline:
            time.sleep(0.001)
        out["finished unobserved"] = "again" in st_h
        try:
            hvd.allreduce_async(t, name="again", op=hvd.Sum)
            out["resubmitted at once"] = "accepted"
        except ValueError as e:
            out["resubmitted at once"] = str(e)
    hvd.barrier()
    out["again"] = hvd.synchronize(h).tolist()
    out["after synchronize"] = hvd.allreduce(t, name="again", op=hvd.Sum).tolist()
    h = hvd.allreduce_async(t, name="later", op=hvd.Sum)
    # it finishes without anyone looking at the handle (waited for as an event, not a guessed
    # time), then the reuse window (0.05 s) passes
    deadline = time.monotonic() + 30
    while "later" not in st.unobserved and time.monotonic() < deadline:
        time.sleep(0.001)
    out["later finished unobserved"] = "later" in st.unobserved
    time.sleep(0.3)
    out["after the window"] = hvd.allreduce(t, name="later", op=hvd.Sum).tolist()
    out["first of them"] = hvd.synchronize(h).tolist()
    # two async ops (different kinds and sizes) submitted in opposite orders, waited in any order
    a, b = torch.ones(2) * (r + 1), torch.full((1 + r, 2), 10.0 * (r + 1))
    if r == 0:
        ha = hvd.allreduce_async_(a, name="a", op=hvd.Sum)
        hb = hvd.allgather_async(b, name="b")
    else:
        hb = hvd.allgather_async(b, name="b")
        ha = hvd.allreduce_async_(a, name="a", op=hvd.Sum)
    out["b"] = hvd.synchronize(hb).tolist()
    out["a"] = hvd.synchronize(ha).tolist()
    out["a in place"] = a.tolist()
    # a shape mismatch found while pairing by name is still Horovod's error, on every rank
    if r == 0:
        hc = hvd.allreduce_async(torch.ones(2), name="c")
    hvd.barrier()
    if r == 1:
        hc = hvd.allreduce_async(torch.ones(3), name="c")
    try:
        hvd.synchronize(hc)
        out["c"] = None
    except hvd.HorovodInternalError as e:
        out["c"] = str(e)
    # afterwards the steady state is back to no verification round at all
    for _ in range(3):
        hvd.allreduce(torch.ones(4), name="loop")
        hvd.allgather(torch.ones(1, 2), name="loop.g")
    before = st.verify_rounds
    for _ in range(5):
        hvd.allreduce(torch.ones(4), name="loop")
        hvd.allgather(torch.ones(1, 2), name="loop.g")
    out["steady verification rounds"] = st.verify_rounds - before
    hvd.shutdown()
    return out


@pytest.mark.parametrize("data", ["shm", "gloo"])
def test_ops_submitted_in_different_orders_are_paired_by_name(data):
    env = {"HOROVOD_COMPAT_SHM_DATA": "1" if data == "shm" else "0"}
    for rep in run_function_warm(_submitted_in_different_orders, num_processes=2, return_all=True,
                            timeout=120, env=env):
        assert rep["control"] == "ShmExchange"
        if "resubmitted at once" in rep:  # rank 1
            assert rep["finished unobserved"] is True
            assert rep["resubmitted at once"].startswith(
                "Requested to allreduce a tensor with the same name as another tensor that is "
                "currently being processed."), rep["resubmitted at once"]
        assert rep["later finished unobserved"] is True
        assert rep["early"] == [3.0, 3.0, 3.0]
        assert rep["again"] == rep["after synchronize"] == [3.0, 3.0, 3.0]
        assert rep["after the window"] == rep["first of them"] == [3.0, 3.0, 3.0]
        assert rep["a"] == rep["a in place"] == [3.0, 3.0]
        assert rep["b"] == [[10.0, 10.0], [20.0, 20.0], [20.0, 20.0]]
        assert rep["c"].startswith("Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of "
                                   "shape [2], but another rank sent a tensor of shape [3].")
        assert rep["steady verification rounds"] == 0


def _stall(capture: bool):
    import io
    import sys
    import time
    import torch
    import horovod.torch as hvd
    hvd.init()
    buf = io.StringIO()
    if capture:
        sys.stderr = buf
    if hvd.rank() == 1:
        time.sleep(3.0)
    hvd.allreduce(torch.ones(2), name="late.tensor")
    sys.stderr = sys.__stderr__
    hvd.shutdown()
    return buf.getvalue()


def test_stall_inspector_names_missing_ranks_and_tensors():
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"}
    r0, r1 = run_function_warm(_stall, True, num_processes=2, return_all=True, timeout=60, env=env)
    assert "Missing ranks:\n1: [late.tensor]" in r0, r0
    assert "waiting for remainder of ranks for more than 1 seconds" in r0
    assert "Missing ranks" not in r1


def test_stall_check_disable():
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_CHECK_DISABLE": "1"}
    r0, _ = run_function_warm(_stall, True, num_processes=2, return_all=True, timeout=60, env=env)
    assert "Missing ranks" not in r0


def _never_joins():
    import time
    import torch
    import horovod.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        time.sleep(60)
    hvd.allreduce(torch.ones(2), name="orphan")
    return "finished"


def test_stall_shutdown_ends_the_job():
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"}
    with pytest.raises(RankFailedError) as info:
        run_function_warm(_never_joins, num_processes=2, timeout=50, env=env)
    assert info.value.rank == 0
    assert info.value.exit_code == 1


def _slow_synchronize():
    import io
    import sys
    import time
    import torch
    import horovod.torch as hvd
    hvd.init()
    buf = io.StringIO()
    sys.stderr = buf
    hvd.barrier()  # both ranks submit within well under the stall check time of each other
    h = hvd.allreduce_async(torch.ones(2), name="submitted.everywhere", op=hvd.Sum)
    # every rank submitted: not a stall, however long before synchronize -- this wait is clearly
    # longer than the stall check (3 s) and the stall shutdown (6 s)
    time.sleep(10.0)
    out = hvd.synchronize(h).tolist()
    sys.stderr = sys.__stderr__
    hvd.shutdown()
    return out, buf.getvalue()


def test_a_long_wait_on_an_op_every_rank_submitted_is_not_a_stall():
    # limits a loaded machine's skew between the ranks' submissions stays far below, and a wait
    # (10 s) clearly longer than both
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "3", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "6"}
    for out, err in run_function_warm(_slow_synchronize, num_processes=2, return_all=True, timeout=60,
                                 env=env):
        assert out == [2.0, 2.0]
        assert "Missing ranks" not in err


def _async_bursts(reps: int):
    import random
    import time
    import torch
    import horovod.torch as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    jitter = random.Random(r)  # ranks drift apart differently at every op: varied interleavings
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64]
    bad = []
    for rep in range(reps):
        # unnamed async allgathers whose dtype and rank change from op to op, polled once each
        handles = []
        for dt in dtypes:
            for dim in (1, 2, 3):
                h = hvd.allgather_async((torch.ones([17] * dim) * r).to(dt))
                time.sleep(jitter.random() * 0.0005)
                hvd.poll(h)
                handles.append((h, dim))
        for h, dim in handles:
            g = hvd.synchronize(h).double()
            for i in range(n):
                part = g[i * 17:(i + 1) * 17]
                if list(part.shape) != [17] * dim or part.min() != i or part.max() != i:
                    bad.append(("allgather", rep, dim, i))
        # unnamed async allreduces whose shape changes on every rank in the middle of the burst
        hs = [hvd.allreduce_async(torch.ones(3 if i < 4 else 5) * (r + 1), op=hvd.Sum)
              for i in range(8)]
        got = [hvd.synchronize(h).tolist() for h in hs]
        want = [[float(n * (n + 1) // 2)] * (3 if i < 4 else 5) for i in range(8)]
        if got != want:
            bad.append(("allreduce", rep, got))
    hvd.shutdown()
    return bad


def test_async_bursts_of_unnamed_ops_with_changing_shapes():
    """Regression: a rank that had already verified an earlier op of the same (unnamed) key used to
    speculate on the new agreement while its peer used the old one; gloo then aborted a rank on
    the size mismatch (most runs of 5 repetitions; 12 are run)."""
    for bad in run_function_warm(_async_bursts, 12, num_processes=2, return_all=True, timeout=60):
        assert bad == []


def test_a_transfer_that_finishes_just_after_a_wait_slice_ran_out_is_not_a_failure():
    """Regression (found by a CI run on a loaded machine): a transfer is waited for in slices; one
    that completed between its slice's timeout and the check that followed was reported with the
    slice's own "Operation timed out!" as a failed allgather. It is waited for once more: its own
    outcome counts (a transfer that did fail still raises its own error)."""
    import torch.distributed as dist

    from horovod_compat.common import negotiation

    class FinishesAfterTheSlice(dist.Work):
        def __init__(self, error=None):
            super().__init__()
            self.error, self.waits = error, 0

        def wait(self, timeout=None):
            self.waits += 1
            if self.waits == 1:
                raise RuntimeError("Operation timed out!")  # the slice ran out...
            if self.error:  # ...and the transfer had finished: with this outcome
                raise RuntimeError(self.error)
            return True

        def is_completed(self):
            return self.waits >= 1

    class Watch:
        enabled = True

    state = object.__new__(negotiation.SetState)
    state.watch = Watch()
    done = FinishesAfterTheSlice()
    negotiation.SetState._await(state, done, "cpu")
    assert done.waits == 2
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        negotiation.SetState._await(state, FinishesAfterTheSlice("Connection closed by peer"), "cpu")
