"""Process sets on 3 real ranks: static sets from init, dynamic add/remove, torch_group."""
from __future__ import annotations

from warm import run_function_warm


def _process_sets():
    import os
    import torch
    import torch.distributed as dist
    import horovod.torch as hvd
    torch.set_num_threads(1)
    res = {}
    even, odd = hvd.ProcessSet([2, 0]), hvd.ProcessSet([1, 2])
    res["before_init"] = (even.process_set_id, even.size(), even.rank(), even.included(), even.ranks)
    hvd.init(process_sets=[even, odd])
    r = hvd.rank()
    res["ids"] = (hvd.global_process_set.process_set_id, even.process_set_id, odd.process_set_id)
    res["even"] = (even.size(), even.rank(), even.included())
    res["table"] = hvd.get_process_set_ids_and_ranks()
    if even.included():
        res["even_sum"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=even).item()
        res["even_gather"] = hvd.allgather(torch.tensor([r]), process_set=even).tolist()
        res["even_bcast"] = hvd.broadcast(torch.tensor([r]), root_rank=2, process_set=even).item()
        g = hvd.torch_group(even)
        res["torch_group_size"] = dist.get_world_size(g)
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        res["torch_group_allreduce"] = t.item()
        try:
            hvd.allreduce(torch.ones(2 if r == 0 else 3), process_set=even, name="bad")
            res["even_mismatch"] = None
        except hvd.HorovodInternalError as e:
            res["even_mismatch"] = str(e)
    else:
        try:
            hvd.allreduce(torch.ones(1), process_set=even)
            res["outsider"] = None
        except ValueError as e:
            res["outsider"] = str(e)
        try:
            hvd.torch_group(even)
            res["outsider_group"] = None
        except ValueError as e:
            res["outsider_group"] = str(e)
    if odd.included():
        res["odd_avg"] = hvd.allreduce(torch.tensor([float(r)]), process_set=odd).item()
    res["global_sum"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    try:
        hvd.add_process_set([0, 1])
        res["static_add"] = None
    except ValueError as e:
        res["static_add"] = str(e)
    hvd.shutdown()
    res["after_shutdown_id"] = even.process_set_id

    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.init()
    del os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"]
    ps = hvd.add_process_set([0, 1])
    res["dyn_id"] = ps.process_set_id
    if ps.included():
        res["dyn_sum"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item()
    try:
        hvd.add_process_set(hvd.ProcessSet([1, 0]))
        res["dup"] = None
    except ValueError as e:
        res["dup"] = str(e)
    try:
        hvd.add_process_set([0, 1, 2])
        res["dup_global"] = None
    except ValueError as e:
        res["dup_global"] = str(e)
    res["removed"] = hvd.remove_process_set(ps)
    res["removed_again"] = hvd.remove_process_set(ps)
    try:
        hvd.remove_process_set(hvd.global_process_set)
        res["remove_global"] = None
    except ValueError as e:
        res["remove_global"] = str(e)
    ps2 = hvd.add_process_set([1, 2])
    if ps2.included():
        res["dyn2_sum"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps2).item()
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    ps3 = hvd.add_process_set([0, 2])
    res["init_dynamic_id"] = ps3.process_set_id
    hvd.shutdown()
    # init(comm=[ranks]): the job is that subset; other processes are told they are not part of it
    try:
        hvd.init(comm=[0, 2])
        res["comm"] = (hvd.rank(), hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item())
        hvd.shutdown()
    except ValueError as e:
        res["comm"] = str(e)
    return res


def test_process_sets_on_three_ranks():
    reps = run_function_warm(_process_sets, num_processes=3, return_all=True, timeout=180)
    for rank, res in enumerate(reps):
        assert res["before_init"] == (None, None, None, None, [0, 2])
        assert res["ids"] == (0, 1, 2)
        assert res["table"] == {0: [0, 1, 2], 1: [0, 2], 2: [1, 2]}
        assert res["global_sum"] == 3.0
        assert "dynamic process sets" in res["static_add"]
        assert res["after_shutdown_id"] is None
        assert res["dyn_id"] == 1
        assert "already exists" in res["dup"] and "already exists" in res["dup_global"]
        assert res["removed"] is True and res["removed_again"] is False
        assert "cannot be removed" in res["remove_global"]
        assert res["init_dynamic_id"] == 1
    r0, r1, r2 = reps
    assert r0["comm"] == (0, 2, 2.0) and r2["comm"] == (1, 2, 2.0)
    assert "not part of comm" in r1["comm"]
    for res, idx in ((r0, 0), (r2, 1)):
        assert res["even"] == (2, idx, True)
        assert res["even_sum"] == 2.0
        assert res["even_gather"] == [0, 2]
        assert res["even_bcast"] == 2  # root_rank is a global rank
        assert res["torch_group_size"] == 2 and res["torch_group_allreduce"] == 2.0
        assert res["even_mismatch"] == (
            "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2], but another "
            "rank sent a tensor of shape [3]. Tensor 'bad': rank 0 sent shape [2]; rank 2 sent "
            "shape [3].")  # global ranks
    assert r1["even"] == (2, -1, False)
    assert "not part of" in r1["outsider"] and "not part of" in r1["outsider_group"]
    assert r1["odd_avg"] == 1.5 and r2["odd_avg"] == 1.5
    assert r0["dyn_sum"] == 2.0 and r1["dyn_sum"] == 2.0 and "dyn_sum" not in r2
    assert r1["dyn2_sum"] == 2.0 and r2["dyn2_sum"] == 2.0
