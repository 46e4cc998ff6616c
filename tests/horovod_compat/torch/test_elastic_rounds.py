"""hvd.elastic across rounds on 2 real rank processes, the driver's answers replaced by a fake
`join_world` (the worlds of a real c10d TCPStore hosted by the test):

- a survivor that already re-initialized 3 times (rounds 0-2 alone) meets a replacement on its first
  init in round 3: collectives over shared memory, the TCP mesh's set-up, process sets and the stall
  inspector's keys must agree although their init counts differ; `state.sync()` gives the
  replacement the survivor's committed model, optimizer and sampler;
- host-change notices: one only the non-root rank saw raises nothing; one rank 0 saw makes both
  ranks raise HostsUpdatedInterrupt(skip_sync=True) at the same commit, and both re-join.
"""
from __future__ import annotations

import torch.distributed as dist

from distributor import run_function


def _rank_main(store_port):
    import os

    import torch

    import horovod_compat.torch as hvd
    from distributor import worker
    from distributor.elastic.world import HostUpdate, World
    from horovod_compat.common import lifecycle

    torch.set_num_threads(1)
    me = int(os.environ["RANK"])
    rounds = {0: [0, 1, 2, 3, 4], 1: [3, 4]}[me]  # rank 1 is the replacement of round 3
    joined = []

    def join_world(timeout=None):
        r = rounds[len(joined)]
        joined.append(r)
        size = 1 if r < 3 else 2
        world = World(round=r, rank=me if size == 2 else 0, size=size, local_rank=me if size == 2 else 0,
                      local_size=size, cross_rank=0, cross_size=1, store_host="127.0.0.1",
                      store_port=store_port)
        os.environ.update(world.torchrun_env())
        return world

    worker.is_elastic = lambda: True
    worker.join_world = join_world

    torch.manual_seed(10 + me)  # different initial weights: sync must make them equal
    model = torch.nn.Linear(64, 64)
    data = list(range(96))
    report = {"interrupts": [], "resets": 0}

    hvd.init()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0)
    state.register_reset_callbacks([lambda: report.__setitem__("resets", report["resets"] + 1)])
    if me == 0:  # the survivor: trains alone in rounds 0-2, committing, re-initializing each time
        for _ in range(3):
            model.weight.data.add_(0.5)
            sampler.record_batch(0, 8)
            state.step += 1
            state.commit()
            hvd.shutdown()
            hvd.init()
    report["generation_before"] = lifecycle.runtime.current().generation
    report["survivor_committed"] = [model.weight.sum().item(), sampler.processed_num, state.step]

    @hvd.elastic.run
    def train(state):
        rt = lifecycle.runtime.current()
        report.setdefault("synced", []).append(
            [round(model.weight.sum().item(), 4), sampler.processed_num, state.step, hvd.size()])
        x = torch.full((1 << 16,), float(hvd.rank() + 1))
        report.setdefault("sum", []).append(hvd.allreduce(x, op=hvd.Sum)[0].item())
        assert rt.registry.dynamic
        ps = hvd.add_process_set([1])
        if ps.included():
            hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps)
        report.setdefault("ps", []).append(ps.process_set_id)
        hvd.remove_process_set(ps)
        while state.step < 8:
            opt.zero_grad()
            model(torch.randn(4, 64)).sum().backward()
            opt.step()
            state.step += 1
            if state.step == 5 and me == 1 and "seen_by_1" not in report:
                report["seen_by_1"] = True  # only the non-root rank hears of it: nothing happens
                worker.deliver(worker.Kind.HOSTS_UPDATED, (5.0, int(HostUpdate.ADDED)))
            if state.step == 6 and me == 0 and "seen_by_0" not in report:
                report["seen_by_0"] = True
                worker.deliver(worker.Kind.HOSTS_UPDATED, (6.0, int(HostUpdate.REMOVED)))
            try:
                state.commit()
            except hvd.HostsUpdatedInterrupt as exc:
                report["interrupts"].append((state.step, exc.skip_sync))
                raise
        return [p.detach().clone() for p in model.parameters()]

    weights = train(state)
    report["rounds"] = joined
    report["generation_after"] = lifecycle.runtime.current().generation
    report["weights"] = hvd.allgather_object([w.sum().item() for w in weights])
    hvd.shutdown()
    return report


def test_survivor_and_replacement_meet_in_one_round_and_agree_on_host_changes():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    r0, r1 = run_function(_rank_main, store.port, num_processes=2, return_all=True, timeout=180,
                          env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    assert r0["rounds"] == [0, 1, 2, 3, 4] and r1["rounds"] == [3, 4]
    assert r0["generation_before"] == 4 and r1["generation_before"] == 1
    # the replacement took the survivor's commit (model, sampler progress, plain attributes)
    weight_sum, processed, step = r0["survivor_committed"]
    assert processed == 24 and step == 3
    for r in (r0, r1):
        assert r["synced"][0] == [round(weight_sum, 4), 24, 3, 2]
        assert r["sum"] == [3.0, 3.0]  # 1 + 2 on 2 ranks, in rounds 3 and 4
        assert r["ps"] == [1, 1]  # the same id on both ranks, in each round
        # rank 1's lone notice (step 5) raised nothing; rank 0's (step 6) raised on both at the
        # same commit, with skip_sync (only removals)
        assert r["interrupts"] == [(6, True)]
        assert r["resets"] == 1
    assert r0["weights"][0] == r0["weights"][1]


# ---- end to end on the real elastic driver ------------------------------------------------------
N_SAMPLES, BATCH = 48, 2


def _elastic_train(kill_worker, kill_at_step):
    import os
    import signal
    import time

    import torch
    import torch.nn.functional as F

    import horovod_compat.torch as hvd
    from distributor import worker

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(1)
    data = torch.randn(N_SAMPLES, 8, generator=torch.Generator().manual_seed(0))
    target = data.sum(1, keepdim=True)
    model = torch.nn.Linear(8, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(N_SAMPLES)), shuffle=True, seed=7)
    # log: (epoch, every rank's sample indices of one step) -- committed with the rest
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0, log=[],
                                   sizes=[], killed=False, regrown=False)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        while state.epoch < 2 or not state.regrown:
            assert state.epoch < 60, "the replacement never joined"
            indices = list(sampler)
            for b in range(-(-len(indices) // BATCH)):
                idx = indices[b * BATCH:(b + 1) * BATCH]
                opt.zero_grad()
                F.mse_loss(model(data[idx]), target[idx]).backward()
                opt.step()
                if (worker.worker_id() == kill_worker and state.step == kill_at_step
                        and not state.killed):
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, after a step's allreduce
                state.log.append((state.epoch, hvd.allgather_object(idx)))
                state.sizes.append(hvd.size())
                if state.killed and hvd.size() == 3:
                    state.regrown = True
                if hvd.size() == 2:
                    state.killed = True  # the job shrank: the kill happened
                state.step += 1
                sampler.record_batch(b, BATCH)
                time.sleep(0.02)
                state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
        return {"log": state.log, "sizes": state.sizes, "resets": resets, "rank": hvd.rank(),
                "worker": worker.worker_id()}

    return train(state)


def test_sigkilled_worker_is_replaced_and_every_sample_is_counted_once():
    from distributor import ElasticPolicy

    out = run_function(_elastic_train, 1, 5, num_processes=3, timeout=240,
                       elastic=ElasticPolicy(min_workers=2, max_workers=3))
    sizes = out["sizes"]
    assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, sizes  # shrank, then grew back
    assert out["resets"] and out["resets"][0] == 2, out["resets"]  # the callback ran after the kill
    by_epoch = {}
    for epoch, per_rank in out["log"]:
        by_epoch.setdefault(epoch, []).append([i for idx in per_rank for i in idx])
    assert len(by_epoch) >= 2
    for epoch, steps in by_epoch.items():
        seen = [i for step in steps for i in step]
        assert set(seen) == set(range(N_SAMPLES)), f"epoch {epoch}: samples skipped"
        # a sample twice only as the padding of the epoch's last step (remaining % size != 0)
        before_last = [i for step in steps[:-1] for i in step]
        assert len(before_last) == len(set(before_last)), f"epoch {epoch}: a sample repeated"
        assert len(seen) - N_SAMPLES < 3, f"epoch {epoch}: more than the padding repeated"
