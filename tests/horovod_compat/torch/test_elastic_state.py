"""hvd.elastic in one process: State/TorchState save-restore-sync, the ElasticSampler's exactness
across world-size changes, hvd.elastic.run's loop, and hvd.init's elastic path (join_world replaced
by a fake driver that hands out worlds on a real c10d TCPStore)."""
from __future__ import annotations

import collections
import os
import random
import threading
import time

import pytest
import torch
import torch.distributed as dist

import horovod_compat.torch as hvd
from distributor import worker
from distributor.elastic.world import HostUpdate, World
from horovod_compat.common import lifecycle
from horovod_compat.torch.elastic import sampler as sampler_mod
from horovod_compat.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
               "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
               "HOROVOD_ELASTIC_RESET_LIMIT")


@pytest.fixture
def size1(monkeypatch):
    """hvd initialized as a size-1 job in this process (no launcher variables), shut down after."""
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith(("HOROVOD_", "OMPI_", "PMI_"))]:
        monkeypatch.delenv(var)
    hvd.init()
    yield
    hvd.shutdown()


def _model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


def _step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 6, generator=g)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def _flat(model, opt):
    """Every number of the model (params, buffers) and of the optimizer's state."""
    out = [v.detach().clone().float().reshape(-1) for v in model.state_dict().values()]
    for st in opt.state_dict()["state"].values():
        out += [v.detach().clone().float().reshape(-1) for v in st.values() if torch.is_tensor(v)]
    return torch.cat(out)


# ---- TorchState -------------------------------------------------------------------------------
def test_restore_is_exact_and_commit_reuses_its_buffers(size1):
    model, opt = _model_and_optimizer()
    state = hvd.elastic.TorchState(model, opt, epoch=0, history=[])
    _step(model, opt, 1)
    state.epoch, state.history = 1, state.history + [1]
    state.commit()
    committed = _flat(model, opt)
    ptrs = [t.data_ptr() for t in state._handlers["model"]._saved.values()]

    for s in (2, 3):
        _step(model, opt, s)
    state.epoch = 7
    state.history.append(99)  # in-place change of a plain attribute: not in the commit
    assert not torch.equal(_flat(model, opt), committed)
    state.restore()
    assert torch.equal(_flat(model, opt), committed)
    assert state.epoch == 1 and state.history == [1]
    assert opt.state_dict()["state"][0]["step"].item() == 1

    # the live objects do not share memory with the commit: stepping after a restore and
    # restoring again still gives the commit
    _step(model, opt, 4)
    state.restore()
    assert torch.equal(_flat(model, opt), committed)

    _step(model, opt, 5)
    state.commit()
    assert [t.data_ptr() for t in state._handlers["model"]._saved.values()] == ptrs
    after = _flat(model, opt)
    _step(model, opt, 6)
    state.restore()
    assert torch.equal(_flat(model, opt), after)


def test_assigning_a_tracked_attribute_tracks_and_saves_the_new_object(size1):
    model, opt = _model_and_optimizer()
    state = hvd.elastic.TorchState(model, opt)
    other, _ = _model_and_optimizer(seed=5)
    state.model = other
    assert state._handlers["model"].value is other
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    state.restore()
    ref, _ = _model_and_optimizer(seed=5)
    for a, b in zip(other.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_handler_registry_is_horovods():
    from horovod_compat.torch.elastic import state as state_mod
    kinds = [k for k, _ in state_mod.get_handler_registry()]
    assert kinds == [torch.nn.Module, torch.optim.Optimizer, hvd.elastic.ElasticSampler]


# ---- check_host_updates -------------------------------------------------------------------------
def test_check_host_updates_raises_once_with_skip_sync_only_for_removals(size1):
    state = hvd.elastic.ObjectState(epoch=0)
    state.commit()  # nothing announced
    state.on_hosts_updated(10.0, HostUpdate.REMOVED)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync is True
    state.commit()  # already seen: no second interrupt
    state.on_hosts_updated(5.0, HostUpdate.ADDED)  # older than the last one seen: ignored
    state.commit()
    state.on_hosts_updated(11.0, HostUpdate.ADDED)
    state.on_hosts_updated(12.0, HostUpdate.REMOVED)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert info.value.skip_sync is False  # mixed: the new workers need the state


def test_check_host_updates_follows_rank_0s_view(size1):
    """Every rank takes (prev, last, update) from rank 0's broadcast: a notice only this rank saw
    raises nothing here, and rank 0's notice raises here even if this rank saw none."""
    told = {}

    def rank0_saw_nothing(obj):
        told["sent"] = obj
        return (obj[0], obj[0], 0)

    state = hvd.elastic.ObjectState(bcast_object=rank0_saw_nothing, epoch=0)
    state.on_hosts_updated(3.0, HostUpdate.ADDED)
    state.check_host_updates()
    assert told["sent"] == (0, 3.0, int(HostUpdate.ADDED))

    state = hvd.elastic.ObjectState(bcast_object=lambda obj: (0, 8.0, int(HostUpdate.REMOVED)), epoch=0)
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert info.value.skip_sync is True


def test_a_reset_keeps_the_notices_about_the_new_round(size1, monkeypatch):
    """A replacement can join (and the driver announce it) between the moment the survivors'
    new round forms and their on_reset(): that notice must still raise at the next commit, or
    the round trains without the newcomer, which waits for ever. Notices stamped before the
    round formed were about the round that ended, and are dropped."""
    state = hvd.elastic.ObjectState(epoch=0)
    state.on_hosts_updated(99.0, HostUpdate.REMOVED)  # about the round that failed
    state.on_hosts_updated(101.0, HostUpdate.ADDED)  # sent after round 3 formed at t=100
    monkeypatch.setattr(worker, "round_formed_at", lambda: 100.0)
    state.on_reset()
    with pytest.raises(HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync is False  # only ADDED counted: the newcomer needs the state
    state.on_hosts_updated(100.5, HostUpdate.REMOVED)  # an older notice arriving late: ignored
    state.commit()
    monkeypatch.setattr(worker, "round_formed_at", lambda: 200.0)
    state.on_hosts_updated(150.0, HostUpdate.ADDED)  # pending when round 4 formed at t=200
    state.on_reset()
    state.commit()  # dropped: it was about round 3


# ---- ElasticSampler: exactness across world sizes ----------------------------------------------
def _simulate(monkeypatch, n, bs, sizes_and_steps, seed=0, shuffle=True):
    """Run one epoch on worlds of changing size; a world runs `steps` batch steps (lockstep over
    its ranks) then the job is reset to the next size from the last commit (after every step).
    Returns every index processed in the epoch (with the padding of the last step)."""
    processed = []
    committed = None
    for size, steps in sizes_and_steps:
        samplers = []
        for r in range(size):
            monkeypatch.setattr(sampler_mod.lifecycle, "size", lambda s=size: s)
            monkeypatch.setattr(sampler_mod.lifecycle, "rank", lambda r=r: r)
            s = hvd.elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=seed)
            if committed is not None:
                s.load_state_dict(committed)
            samplers.append(s)
        iters = [list(iter(s)) for s in samplers]
        for b in range(steps if steps is not None else -(-len(iters[0]) // bs)):
            for r, s in enumerate(samplers):
                processed += iters[r][b * bs:(b + 1) * bs]
                assert s.get_indices(b, bs) == iters[r][b * bs:(b + 1) * bs]
                s.record_batch(b, bs)
            committed = samplers[0].state_dict()
    return processed


@pytest.mark.parametrize("plan", [
    [(3, 2), (2, None)],            # a worker dies after 2 steps; 2 survivors finish the epoch
    [(2, 3), (3, None)],            # a worker joins
    [(3, 1), (2, 2), (4, 1), (1, None)],
])
def test_sampler_never_repeats_or_skips_across_world_size_changes(monkeypatch, plan):
    n, bs = 120, 4  # 120 divides evenly by 1..4 ranks after every change here: no padding
    processed = _simulate(monkeypatch, n, bs, plan)
    assert sorted(processed) == list(range(n))


def test_sampler_pads_only_the_last_step_like_distributed_sampler(monkeypatch):
    n, bs = 50, 4
    processed = _simulate(monkeypatch, n, bs, [(3, 2), (2, None)])
    counts = collections.Counter(processed)
    assert set(counts) == set(range(n))
    # after 2 steps on 3 ranks 24 are done; 26 left over 2 ranks = 13 each: 4 steps of 4 (the
    # last of 1 real sample per rank): nothing is padded when the rest divides by the world
    assert all(c == 1 for c in counts.values())
    processed = _simulate(monkeypatch, n, bs, [(2, 2), (3, None)])
    counts = collections.Counter(processed)
    # 16 done, 34 left over 3 ranks: 12 each (36), so 2 samples appear twice -- the padding
    assert set(counts) == set(range(n)) and sum(counts.values()) == 16 + 36
    assert sorted(c for c in counts.values() if c > 1) == [2, 2]


def test_sampler_order_is_horovods(monkeypatch):
    monkeypatch.setattr(sampler_mod.lifecycle, "size", lambda: 2)
    monkeypatch.setattr(sampler_mod.lifecycle, "rank", lambda: 1)
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=4)
    s.set_epoch(3)
    order = list(range(10))
    random.Random(4 + 3).shuffle(order)
    assert list(s) == order[1::2] and len(s) == 5
    s.record_batch(0, 2)
    assert s.state_dict() == {"epoch": 3, "processed_num": 4}
    s.load_state_dict({"epoch": 3, "processed_num": 4})
    assert list(s) == order[4:][1::2]


def test_sampler_before_init_is_horovods_error():
    if hvd.is_initialized():
        pytest.skip("hvd is initialized in this process by another test")
    with pytest.raises(ValueError, match="hvd.init"):
        hvd.elastic.ElasticSampler(list(range(4)))


# ---- hvd.elastic.run ----------------------------------------------------------------------------
class CountingState(hvd.elastic.ObjectState):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def sync(self):
        self.calls.append("sync")
        super().sync()

    def restore(self):
        self.calls.append("restore")
        super().restore()

    def reset(self):
        self.calls.append("reset")


def test_run_restores_after_internal_error_and_skips_sync_after_removals(size1):
    state = CountingState(step=0)
    state.register_reset_callbacks([lambda: state.calls.append("callback")])
    script = [HorovodInternalError("peer died"), HostsUpdatedInterrupt(skip_sync=True),
              HostsUpdatedInterrupt(skip_sync=False), None]
    generations = []

    @hvd.elastic.run
    def train(state, tag):
        generations.append(lifecycle.runtime.current().generation)
        state.step += 1  # not committed: a restore takes it back
        exc = script.pop(0)
        if exc is not None:
            state.calls.append("raise")
            raise exc
        return tag, state.step

    # 1st attempt: sync, HorovodInternalError -> restore, reset; 2nd: sync, removal -> reset, no
    # restore and no sync; 3rd: addition -> reset, sync (back to the commit, step 0); 4th returns
    assert train(state, "done") == ("done", 1)
    assert state.calls == ["sync", "raise", "restore", "reset", "callback", "sync", "raise",
                           "reset", "callback", "raise", "reset", "callback", "sync"]
    assert len(set(generations)) == 4  # every retry ran on a fresh init
    assert hvd.is_initialized()


def test_run_reset_limit_in_a_fixed_size_job(size1, monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_RESET_LIMIT", "2")
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(1)
        raise HorovodInternalError(f"peer {len(attempts)} died")  # a new failure each time

    with pytest.raises(RuntimeError, match="HOROVOD_ELASTIC_RESET_LIMIT=2"):
        train(hvd.elastic.ObjectState(x=1))
    assert len(attempts) == 3


def test_user_exception_is_not_retried(size1):
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(1)
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        train(hvd.elastic.ObjectState(x=1))
    assert attempts == [1]


# ---- hvd.init in an elastic worker ---------------------------------------------------------------
@pytest.fixture
def fake_driver(monkeypatch):
    """join_world answered by a fake driver: one real TCPStore, a new round per join; host
    notices delivered through the worker module's real listener list."""
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    joins = []

    def join_world(timeout=None):
        joins.append(timeout)
        world = World(round=len(joins) - 1, rank=0, size=1, local_rank=0, local_size=1,
                      cross_rank=0, cross_size=1, store_host="127.0.0.1", store_port=store.port)
        os.environ.update(world.torchrun_env())
        monkeypatch.setattr(worker, "_last_round", world.round)  # as the real one notes it
        return world

    monkeypatch.setattr(worker, "is_elastic", lambda: True)
    monkeypatch.setattr(worker, "join_world", join_world)
    monkeypatch.setenv("HOROVOD_RANK", "5")  # a stale horovodrun variable: follows the world
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "42")
    yield store, joins
    hvd.shutdown()
    for var in ("HOROVOD_RANK",):
        os.environ.pop(var, None)


def test_elastic_init_joins_rounds_and_run_rejoins_after_a_failure(fake_driver):
    store, joins = fake_driver
    hvd.init()
    assert joins == [42.0] and hvd.size() == 1 and os.environ["HOROVOD_RANK"] == "0"
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [1.0, 1.0]
    model, opt = _model_and_optimizer()
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(len(joins))])
    events = []

    @hvd.elastic.run
    def train(state):
        lifecycle.runtime.current().store.set("probe", "x")  # this init's store, whatever it is
        while state.epoch < 4:
            _step(model, opt, state.epoch)
            state.epoch += 1
            if state.epoch == 2 and "hosts" not in events:
                events.append("hosts")
                _step(model, opt, 99)  # committed below: save() runs before the check raises
                worker.deliver(worker.Kind.HOSTS_UPDATED, (1.0, int(HostUpdate.ADDED)))
            state.commit()  # the notice raises here (run() registered the state as listener)
            if state.epoch == 3 and "failure" not in events:
                events.append("failure")
                _step(model, opt, 77)  # not committed: undone by the restore
                raise HorovodInternalError("a peer died")
        return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()

    assert train(state) == 1.0
    assert events == ["hosts", "failure"]
    assert resets == [2, 3]  # a reset after each re-join
    assert len(joins) == 3 and os.environ["RANK"] == "0"
    # every round's process group met in its own part of the job's store
    for r in range(3):
        assert store.check([f"elastic/round{r}/probe"]), f"round {r} did not use the job's store"
    ref, ref_opt = _model_and_optimizer()
    # the first sync materialized the fresh optimizer's state (one zero step, as in Horovod)
    hvd.broadcast_optimizer_state(ref_opt, root_rank=0)
    for seed in (0, 1, 99, 2, 3):
        _step(ref, ref_opt, seed)
    assert torch.equal(_flat(model, opt), _flat(ref, ref_opt))


def _peer_never_joins_round_1(monkeypatch, timeout):
    """The fake driver's round 1 has a second worker that never comes: joining it fails after
    HOROVOD_ELASTIC_TIMEOUT=`timeout`, and no driver names the lost member."""
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", timeout)
    monkeypatch.setattr(lifecycle, "LOST_WAIT_SECONDS", 0.1)
    real_join = worker.join_world

    def join_world(timeout=None):
        world = real_join(timeout)
        if world.round == 1:
            world = World(round=1, rank=0, size=2, local_rank=0, local_size=2, cross_rank=0,
                          cross_size=1, store_host=world.store_host, store_port=world.store_port)
        return world

    monkeypatch.setattr(worker, "join_world", join_world)


def test_a_round_whose_peer_never_joins_is_left_for_the_next(fake_driver, monkeypatch):
    """The peer of round 1 dies before joining: init times out (HOROVOD_ELASTIC_TIMEOUT) with
    HorovodInternalError, so run() restores and re-joins instead of failing the worker."""
    store, joins = fake_driver
    _peer_never_joins_round_1(monkeypatch, timeout="2")
    hvd.init()
    state = CountingState(x=0)
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(len(joins))
        if len(attempts) == 1:
            raise HorovodInternalError("a peer died")
        return hvd.size()

    assert train(state) == 1
    assert attempts == [1, 3] and state.calls.count("restore") == 2


def test_reset_deals_the_sampler_over_the_new_world_without_a_sync(size1, monkeypatch):
    """Hosts only removed: run() resets without syncing; the sampler must still take the new
    world (Horovod 0.28.1 kept the old shards)."""
    sampler = hvd.elastic.ElasticSampler(list(range(12)), shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    sampler.record_batch(0, 2)  # one step of 2 on the 1-rank world
    state.commit()
    monkeypatch.setattr(sampler_mod.lifecycle, "size", lambda: 2)
    monkeypatch.setattr(sampler_mod.lifecycle, "rank", lambda: 1)
    state.on_reset()
    assert list(sampler) == [3, 5, 7, 9, 11]


def test_the_same_collective_failure_without_progress_is_not_retried_for_ever(size1):
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(state.commits)
        if len(attempts) <= 2:  # a failure after a commit each time: progress, keep going
            state.commit()
        raise HorovodInternalError("Mismatched gradient fusion layout")

    with pytest.raises(RuntimeError, match="3 times in a row without a commit") as info:
        train(hvd.elastic.ObjectState(x=1))
    assert isinstance(info.value.__cause__, HorovodInternalError)
    # the first failure follows a commit; the next three (after the second commit) have none
    # between them, and the third of those ends the loop
    assert attempts == [0, 1, 2, 2]


def test_a_failed_rejoin_restores_the_sampler_and_deals_it_over_the_next_world(fake_driver,
                                                                              monkeypatch):
    """Issue 41's lost commit: re-joining round 1 fails, run() restores the last commit while
    Horovod is not initialised -- the ElasticSampler's restore must not need a world (it raised
    "Horovod has not been initialized", which ended the worker that held the commit) -- and the
    next round deals the rest of the epoch."""
    store, joins = fake_driver
    _peer_never_joins_round_1(monkeypatch, timeout="1")
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(list(range(12)), shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        if len(joins) == 1:
            sampler.record_batch(0, 4)
            state.commit()
            sampler.record_batch(1, 4)  # not committed: undone by the restore
            raise HorovodInternalError("a peer died")
        return list(sampler)

    assert train(state) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert len(joins) == 3


def test_init_joins_the_next_round_when_the_driver_names_a_lost_member(fake_driver, monkeypatch):
    """A member of the round this worker joins dies before it joined: the driver's LOST notice
    ends the wait in the round's store at once, and hvd.init() itself joins the next round (a
    worker's first init, outside hvd.elastic.run, survives it too)."""
    store, joins = fake_driver
    monkeypatch.setattr(worker, "_lost", {})
    real_join = worker.join_world

    def join_world(timeout=None):
        world = real_join(timeout)
        if world.round == 0:  # a 2-worker round: the other worker never comes
            world = World(round=0, rank=0, size=2, local_rank=0, local_size=2, cross_rank=0,
                          cross_size=1, store_host=world.store_host, store_port=world.store_port)
            threading.Timer(0.3, worker.deliver, (worker.Kind.LOST, (0, 1))).start()
        return world

    monkeypatch.setattr(worker, "join_world", join_world)
    started = time.monotonic()
    hvd.init()
    assert len(joins) == 2 and hvd.size() == 1
    assert time.monotonic() - started < 30  # not the store's timeout (HOROVOD_ELASTIC_TIMEOUT=42)
