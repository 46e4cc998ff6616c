"""A seeded, randomized soak of ``horovod.torch``: run unchanged on every rank of one launch.

    horovodrun -np 3 python soak_program.py --seed 7 --rounds 40

Each round runs a random mix of operations drawn from one random stream that every rank seeds the
same way (``seed:round:plan``), so every rank chooses the same operations with the same parameters.
Ranks differ only where Horovod lets them: the order in which they submit named async ops, how many
ops they run before ``hvd.join()``, which rank injects an error. Every rank derives every rank's
input from ``(seed, round, step, tag, rank)``, so each checks its result against a value it
computes locally.

Horovod semantics relied on (Horovod 0.28.1, see ../shared/docs/horovod_torch_api.md):
* integer Average truncates; joined ranks contribute zeros and Average still divides by the full
  size; ``join()`` returns the last rank to join;
* a shape/dtype mismatch raises ``HorovodInternalError`` on every rank and later ops work;
* a second in-flight op with the same name raises ``ValueError`` on the submitting rank only;
* named async ops are paired by name, whatever order each rank submits them in;
* an unnamed op's name comes from a per-process handle counter, so once ranks have submitted
  different numbers of ops (join, a refused duplicate) every later op is named, as Horovod needs;
  for the same reason ops on process sets run on every registered subset (each rank is in equally
  many), always named, and the ops that make counts uneven start after the first third of rounds.

``--skip optimizer,join`` leaves operations out (the others keep their random choices), to look
past a known failure.

Output: one ``SOAK FAIL ...`` line per wrong result, ``SOAK ERROR ...`` plus a traceback for an
unexpected exception (the rank then exits 1), ``SOAK HANG ...`` plus every thread's stack when one
operation takes longer than ``--hang-timeout`` (exit 3), and at the end one line per rank:
``SOAK SUMMARY rank=0 size=2 seed=7 rounds=40/40 ops=812 checks=2310 failures=0 completed=yes ...``.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import random
import sys
import threading
import time
import traceback

import torch

import horovod.torch as hvd

INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES
# each op's four forms: sync, async, in place, async in place
ALLREDUCE_FORMS = (hvd.allreduce, hvd.allreduce_async, hvd.allreduce_, hvd.allreduce_async_)
GROUPED_ALLREDUCE_FORMS = (hvd.grouped_allreduce, hvd.grouped_allreduce_async, hvd.grouped_allreduce_,
                           hvd.grouped_allreduce_async_)
BROADCAST_FORMS = (hvd.broadcast, hvd.broadcast_async, hvd.broadcast_, hvd.broadcast_async_)
OP_NAMES = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max,
            "Product": hvd.Product}


class Failed(Exception):
    """An unexpected exception, already reported; ends this rank."""


class Watchdog:
    """Dump every thread's stack and exit 3 when one operation runs past the deadline."""

    def __init__(self, timeout: float, rank_fn) -> None:
        self.timeout = timeout
        self.rank_fn = rank_fn
        self.where = "start"
        self.deadline = time.monotonic() + timeout
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name="soak-watchdog", daemon=True).start()

    def at(self, where: str) -> None:
        with self.lock:
            self.where = where
            self.deadline = time.monotonic() + self.timeout

    def _run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.lock:
                late = time.monotonic() > self.deadline
                where = self.where
            if late:
                print(f"SOAK HANG rank={self.rank_fn()} no progress for {self.timeout:.0f}s in {where}; "
                      "stacks follow", flush=True)
                faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
                sys.stdout.flush()
                os._exit(3)


class Soak:
    def __init__(self, args) -> None:
        self.seed = args.seed
        self.rounds = args.rounds
        self.reinit_every = args.reinit_every
        self.verbose = args.verbose
        self.skip = set(filter(None, args.skip.split(",")))
        unknown = self.skip - {k for k, _ in self.OPS}
        if unknown:
            raise SystemExit(f"soak_program.py: --skip names unknown operations {sorted(unknown)}; "
                             f"choose from {[k for k, _ in self.OPS]}")
        self.round = 0
        self.step = 0
        self.ops = 0
        self.checks = 0
        self.failures = 0
        self.kinds_run: dict = {}
        # Once ranks have submitted different numbers of ops, unnamed ops would get different
        # names on different ranks in Horovod: from then on every op is named.
        self.uneven = False
        self.rank = -1
        self.size = 0
        self.where = ""
        self.watchdog = Watchdog(args.hang_timeout, lambda: self.rank)

    # ------------------------------------------------------------------ set-up

    def init(self) -> None:
        """hvd.init() with the process sets this program uses registered, as Horovod users do."""
        world = _launch_size()
        subsets = [[r] for r in range(world)] if world <= 2 else \
            [[a, b] for a in range(world) for b in range(a + 1, world)]
        self.sets = {tuple(ranks): hvd.ProcessSet(ranks) for ranks in subsets}
        hvd.init(process_sets=list(self.sets.values()))
        self.rank, self.size = hvd.rank(), hvd.size()

    # ------------------------------------------------------------------ data

    def rng(self, tag: str) -> random.Random:
        return random.Random(f"{self.seed}:{self.round}:{self.step}:{tag}")

    def data(self, tag: str, rank: int, shape, dtype, lo: int, hi: int) -> torch.Tensor:
        """Rank `rank`'s input for this step: integers in [lo, hi] (exact in every dtype)."""
        g = torch.Generator().manual_seed(self.rng(f"{tag}:rank{rank}").getrandbits(62))
        return torch.randint(lo, hi + 1, tuple(shape), generator=g, dtype=torch.int64).to(dtype)

    @staticmethod
    def value_range(dtype, op: str):
        if op == "Product":
            return (0, 3) if dtype == torch.uint8 else (-2, 2)
        if op in ("Min", "Max"):
            return (0, 100) if dtype == torch.uint8 else (-50, 50)
        if op == "Average" and not dtype.is_floating_point:
            return (0, 40)  # truncation and floor agree on non-negative sums
        return (0, 40) if dtype == torch.uint8 else (-20, 20)

    # ------------------------------------------------------------------ checking

    def check(self, label: str, got, expected) -> None:
        self.checks += 1
        problem = None
        if isinstance(expected, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                problem = f"got a {type(got).__name__}, not a tensor"
            elif got.dtype != expected.dtype:
                problem = f"dtype {got.dtype}, expected {expected.dtype}"
            elif tuple(got.shape) != tuple(expected.shape):
                problem = f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            elif expected.dtype.is_floating_point:
                tol = dict(rtol=1e-3, atol=2e-2) if expected.dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
                if not torch.allclose(got.double(), expected.double(), **tol):
                    problem = f"values differ (max |diff| {(got.double() - expected.double()).abs().max().item():.3g})"
            elif not torch.equal(got, expected):
                problem = "values differ"
            if problem:
                problem += f"\n    got      {_short(got)}\n    expected {_short(expected)}"
        elif got != expected:
            problem = f"got {got!r}, expected {expected!r}"
        if problem:
            self.fail(label, problem)

    def fail(self, label: str, problem: str) -> None:
        self.failures += 1
        print(f"SOAK FAIL rank={self.rank} round={self.round} step={self.step} {label}: {problem}", flush=True)

    def expect_error(self, label: str, exc_type, fn) -> None:
        """`fn()` must raise `exc_type` (a wrong result or no error is a failure, not an exit)."""
        self.checks += 1
        try:
            fn()
        except exc_type:
            return
        except Exception as exc:  # noqa: BLE001 - the wrong error is a failure the soak reports
            self.fail(label, f"expected {exc_type.__name__}, got {type(exc).__name__}: {exc}")
            return
        self.fail(label, f"expected {exc_type.__name__}, nothing was raised")

    def name(self, plan: random.Random, kind: str):
        """None (unnamed), a name unique to this step, or a name reused across rounds."""
        pick = plan.random()
        if pick < 0.35 and not self.uneven:
            return None
        if pick < 0.7:
            return f"soak.{kind}.r{self.round}.s{self.step}"
        return f"soak.reused.{kind}.{plan.randrange(3)}"

    def on_sets(self, plan: random.Random, kind: str, label: str, body) -> str:
        """Run `body(members, process_set, name, tag)` on the global set, or on every registered subset.

        Subsets are used as a cover in which every rank is in the same number of sets, each op
        named: Horovod names an unnamed op after a per-process counter, so ranks must submit equal
        numbers of ops for later unnamed ops to pair up.
        """
        name = self.name(plan, kind)
        if plan.random() < 0.25:
            cover = [(list(ranks), ps) for ranks, ps in self.sets.items()]
        else:
            cover = [(list(range(self.size)), hvd.global_process_set)]
        for i, (members, ps) in enumerate(cover):
            if len(cover) > 1:
                name = f"soak.{kind}.r{self.round}.s{self.step}.set{i}"
            if self.rank in members:
                self.where = f"{label} set={members} name={name}"
                body(members, ps, name, f"set{i}")
        return f"{label} sets={[m for m, _ in cover]}"

    # ------------------------------------------------------------------ reference results

    @staticmethod
    def reduce(inputs, op: str, dtype, divisor: int, pre: float = 1.0, post: float = 1.0):
        x = torch.stack([t.double() * pre for t in inputs])
        if op == "Sum":
            r = x.sum(0)
        elif op == "Average":
            r = x.sum(0) / divisor
            if not dtype.is_floating_point:
                r = torch.trunc(r)
        elif op == "Min":
            r = x.min(0).values
        elif op == "Max":
            r = x.max(0).values
        else:
            r = x.prod(0)
        return (r * post).to(dtype)

    # ------------------------------------------------------------------ operations

    def op_allreduce(self, plan):
        dtype = plan.choice(ALL_DTYPES)
        op = plan.choice(list(OP_NAMES))
        shape = [plan.randint(1, 5) for _ in range(plan.randint(1, 3))]
        pre = post = 1.0
        if dtype in (torch.float32, torch.float64) and op in ("Sum", "Average") and plan.random() < 0.5:
            pre, post = plan.choice([0.5, 1.0, 2.0]), plan.choice([0.25, 1.0, 2.0])
        variant = plan.choice(["sync", "async", "inplace", "async_inplace"])
        label = f"allreduce {variant} {dtype} {op} shape={shape} pre={pre} post={post}"

        def body(members, ps, name, tag):
            lo, hi = self.value_range(dtype, op)
            inputs = [self.data("ar" + tag, r, shape, dtype, lo, hi) for r in members]
            mine = inputs[members.index(self.rank)]
            original = mine.clone()
            expected = self.reduce(inputs, op, dtype, len(members), pre, post)  # before `mine` changes
            kw = dict(name=name, op=OP_NAMES[op], prescale_factor=pre, postscale_factor=post, process_set=ps)
            out = self.call(variant, ALLREDUCE_FORMS, mine, kw)
            if variant == "inplace":
                self.check(self.where + " (returns its input)", out is mine, True)
            self.check(self.where, out, expected)
            if variant in ("sync", "async"):
                self.check(self.where + " (input untouched)", mine, original)

        return self.on_sets(plan, "allreduce", label, body)

    def op_grouped_allreduce(self, plan):
        dtype = plan.choice(ALL_DTYPES)
        op = plan.choice(["Sum", "Average", "Min", "Max"])
        shapes = [[plan.randint(1, 6) for _ in range(plan.randint(1, 2))] for _ in range(plan.randint(1, 4))]
        variant = plan.choice(["sync", "async", "inplace", "async_inplace"])
        label = f"grouped_allreduce {variant} {dtype} {op} shapes={shapes}"

        def body(members, ps, name, tag):
            lo, hi = self.value_range(dtype, op)
            per_rank = {r: [self.data(f"gar{i}{tag}", r, s, dtype, lo, hi) for i, s in enumerate(shapes)]
                        for r in members}
            mine = per_rank[self.rank]
            expected = [self.reduce([per_rank[r][i] for r in members], op, dtype, len(members))
                        for i in range(len(shapes))]  # before `mine` changes
            kw = dict(name=name, op=OP_NAMES[op], process_set=ps)
            outs = self.call(variant, GROUPED_ALLREDUCE_FORMS, mine, kw)
            self.check(self.where + " (count)", len(outs), len(shapes))
            for i, out in enumerate(outs):
                self.check(f"{self.where} [{i}]", out, expected[i])

        return self.on_sets(plan, "grouped", label, body)

    def op_allgather(self, plan):
        dtype = plan.choice(ALL_DTYPES)
        rest = [plan.randint(1, 4) for _ in range(plan.randint(0, 2))]
        base = plan.randint(0, 2)
        variant = plan.choice(["sync", "async"])
        label = f"allgather {variant} {dtype} rest={rest}"

        def body(members, ps, name, tag):
            # the first dimension differs between ranks
            inputs = [self.data("ag" + tag, r, [1 + (base + r) % 3] + rest, dtype, 0, 100) for r in members]
            mine = inputs[members.index(self.rank)]
            if variant == "sync":
                out = hvd.allgather(mine, name=name, process_set=ps)
            else:
                out = hvd.synchronize(self.poll_some(hvd.allgather_async(mine, name=name, process_set=ps)))
            self.check(self.where, out, torch.cat(inputs))

        return self.on_sets(plan, "allgather", label, body)

    def op_grouped_allgather(self, plan):
        dtype = plan.choice(ALL_DTYPES)
        count = plan.randint(1, 3)
        rests = [[plan.randint(1, 3)] for _ in range(count)]
        variant = plan.choice(["sync", "async"])
        label = f"grouped_allgather {variant} {dtype} count={count}"

        def body(members, ps, name, tag):
            per_rank = {r: [self.data(f"gag{i}{tag}", r, [1 + (r + i) % 2] + rests[i], dtype, 0, 100)
                            for i in range(count)] for r in members}
            if variant == "sync":
                outs = hvd.grouped_allgather(per_rank[self.rank], name=name, process_set=ps)
            else:
                outs = hvd.synchronize(self.poll_some(
                    hvd.grouped_allgather_async(per_rank[self.rank], name=name, process_set=ps)))
            self.check(self.where + " (count)", len(outs), count)
            for i in range(min(count, len(outs))):
                self.check(f"{self.where} [{i}]", outs[i], torch.cat([per_rank[r][i] for r in members]))

        return self.on_sets(plan, "gallgather", label, body)

    def op_broadcast(self, plan):
        dtype = plan.choice(ALL_DTYPES)
        shape = [plan.randint(1, 5) for _ in range(plan.randint(1, 3))]
        variant = plan.choice(["sync", "async", "inplace", "async_inplace"])
        pick = plan.randrange(self.size)
        label = f"broadcast {variant} {dtype} shape={shape}"

        def body(members, ps, name, tag):
            root = members[pick % len(members)]  # a global rank, also inside a process set
            self.where += f" root={root}"
            mine = self.data("bc" + tag, self.rank, shape, dtype, 0, 100)
            expected = self.data("bc" + tag, root, shape, dtype, 0, 100)
            out = self.call(variant, BROADCAST_FORMS, mine, dict(root_rank=root, name=name, process_set=ps))
            self.check(self.where, out, expected)

        return self.on_sets(plan, "broadcast", label, body)

    def op_alltoall(self, plan):
        dtype = plan.choice(ALL_DTYPES)
        rest = [plan.randint(1, 3) for _ in range(plan.randint(0, 2))]
        with_splits = plan.random() < 0.6
        variant = plan.choice(["sync", "async"])
        even = plan.randint(1, 2)
        label = f"alltoall {variant} {dtype} splits={with_splits} rest={rest}"

        def body(members, ps, name, tag):
            n, me = len(members), members.index(self.rank)

            def splits_of(r):
                if not with_splits:
                    return [even] * n
                rr = self.rng(f"splits{tag}:{r}")
                return [rr.choice([0, 1, 1, 2, 3]) for _ in range(n)]

            inputs = {r: self.data("a2a" + tag, r, [sum(splits_of(r))] + rest, dtype, 0, 100) for r in members}
            pieces, received = [], []
            for r in members:
                s = splits_of(r)
                start = sum(s[:me])
                pieces.append(inputs[r][start:start + s[me]])
                received.append(s[me])
            self.where += f" splits={[splits_of(r) for r in members]}"
            kw = dict(name=name, process_set=ps)
            if with_splits:
                kw["splits"] = torch.tensor(splits_of(self.rank), dtype=torch.int32)
            if variant == "sync":
                result = hvd.alltoall(inputs[self.rank], **kw)
            else:
                result = hvd.synchronize(self.poll_some(hvd.alltoall_async(inputs[self.rank], **kw)))
            if with_splits or variant == "async":
                # alltoall(splits=...) and synchronize(alltoall_async(...)) give (output, received_splits)
                if not (isinstance(result, tuple) and len(result) == 2):
                    self.check(self.where + " returns (output, received_splits)", type(result).__name__, "tuple")
                    return
                out, got_splits = result
                self.check(self.where + " received_splits", [int(v) for v in got_splits], received)
            else:
                out = result
            self.check(self.where, out, torch.cat(pieces))

        return self.on_sets(plan, "alltoall", label, body)

    def op_reducescatter(self, plan):
        dtype = plan.choice((torch.int32, torch.int64, torch.float16, torch.float32, torch.float64))
        op = "Sum" if dtype == torch.float16 else plan.choice(["Sum", "Average"])
        rows = plan.randint(1, 3)
        rest = [plan.randint(1, 4) for _ in range(plan.randint(0, 2))]
        grouped = plan.random() < 0.3
        count = plan.randint(1, 3) if grouped else 1
        variant = plan.choice(["sync", "async"])
        label = (f"{'grouped_' if grouped else ''}reducescatter {variant} {dtype} {op} rows/rank={rows} "
                 f"rest={rest} count={count}")

        def body(members, ps, name, tag):
            n, me = len(members), members.index(self.rank)
            lo, hi = self.value_range(dtype, op)
            per_rank = {r: [self.data(f"rs{i}{tag}", r, [rows * n] + rest, dtype, lo, hi) for i in range(count)]
                        for r in members}
            kw = dict(name=name, op=OP_NAMES[op], process_set=ps)
            mine = per_rank[self.rank]
            if grouped and variant == "sync":
                outs = hvd.grouped_reducescatter(mine, **kw)
            elif grouped:
                outs = hvd.synchronize(self.poll_some(hvd.grouped_reducescatter_async(mine, **kw)))
            elif variant == "sync":
                outs = [hvd.reducescatter(mine[0], **kw)]
            else:
                outs = [hvd.synchronize(self.poll_some(hvd.reducescatter_async(mine[0], **kw)))]
            self.check(self.where + " (count)", len(outs), count)
            for i in range(min(count, len(outs))):
                full = self.reduce([per_rank[r][i] for r in members], op, dtype, n)
                self.check(f"{self.where} [{i}]", outs[i], full[me * rows:(me + 1) * rows])

        return self.on_sets(plan, "reducescatter", label, body)

    def op_shuffled_async(self, plan):
        """Named async ops submitted, polled and synchronized in a different order on every rank."""
        specs = []
        for i in range(plan.randint(2, 6)):
            kind = plan.choice(["allreduce", "allreduce_", "allgather", "broadcast", "grouped_allreduce"])
            dtype = plan.choice(ALL_DTYPES)
            shape = [plan.randint(1, 4) for _ in range(plan.randint(1, 2))]
            root = plan.randrange(self.size)
            specs.append((i, kind, dtype, shape, root, f"soak.shuffled.r{self.round}.s{self.step}.{i}"))
        mine = random.Random(f"{self.seed}:{self.round}:{self.step}:order:{self.rank}")
        submit = list(specs)
        mine.shuffle(submit)
        label = "shuffled_async [" + ", ".join(f"{s[1]}:{s[2]}" for s in specs) + "]"
        handles, expected, inplace = {}, {}, {}
        for i, kind, dtype, shape, root, name in submit:
            inputs = [self.data(f"sh{i}", r, shape, dtype, 0, 20) for r in range(self.size)]
            t = inputs[self.rank]
            if kind == "allreduce":
                handles[i] = hvd.allreduce_async(t, name=name, op=hvd.Sum)
                expected[i] = self.reduce(inputs, "Sum", dtype, self.size)
            elif kind == "allreduce_":
                expected[i] = self.reduce(inputs, "Max", dtype, self.size)
                inplace[i] = t
                handles[i] = hvd.allreduce_async_(t, name=name, op=hvd.Max)
            elif kind == "allgather":
                handles[i] = hvd.allgather_async(t, name=name)
                expected[i] = torch.cat(inputs)
            elif kind == "broadcast":
                handles[i] = hvd.broadcast_async(t, root, name=name)
                expected[i] = inputs[root]
            else:
                handles[i] = hvd.grouped_allreduce_async([t, t + 1], name=name, op=hvd.Sum)
                expected[i] = [self.reduce(inputs, "Sum", dtype, self.size),
                               self.reduce([x + 1 for x in inputs], "Sum", dtype, self.size)]
        if mine.random() < 0.5:
            for h in handles.values():
                hvd.poll(h)
        order = list(handles)
        mine.shuffle(order)
        for i in order:
            out = hvd.synchronize(handles[i])
            if isinstance(expected[i], list):
                for j, (o, e) in enumerate(zip(out, expected[i])):
                    self.check(f"{label} op {i} [{j}]", o, e)
            else:
                self.check(f"{label} op {i} ({specs[i][1]})", out, expected[i])
                if i in inplace:
                    self.check(f"{label} op {i} in place", inplace[i], expected[i])
        return label

    def op_join(self, plan):
        """Uneven ranks: rank r runs counts[r] allreduces, then joins; one rank runs the most."""
        last = plan.randrange(self.size)
        most = plan.randint(1, 4)
        counts = [most if r == last else plan.randint(0, most - 1) for r in range(self.size)]
        specs = [(plan.choice((torch.int32, torch.int64, torch.float32, torch.float64)),
                  plan.choice(["Sum", "Average"]), [plan.randint(1, 5)], plan.random() < 0.5)
                 for _ in range(most)]
        label = f"join counts={counts} ops={[(str(d), o, a) for d, o, _, a in specs]}"
        for j in range(counts[self.rank]):
            dtype, op, shape, use_async = specs[j]
            active = [r for r in range(self.size) if counts[r] > j]
            lo, hi = self.value_range(dtype, op)
            inputs = [self.data(f"join{j}", r, shape, dtype, lo, hi) for r in active]
            name = f"soak.join.r{self.round}.s{self.step}.{j}"
            mine = inputs[active.index(self.rank)]
            if use_async:
                out = hvd.synchronize(hvd.allreduce_async(mine, name=name, op=OP_NAMES[op]))
            else:
                out = hvd.allreduce(mine, name=name, op=OP_NAMES[op])
            # joined ranks contribute zeros; Average divides by the full size
            self.check(f"{label} op {j} {dtype} {op} active={active}", out,
                       self.reduce(inputs, op, dtype, self.size))
        self.uneven = self.uneven or len(set(counts)) > 1
        self.check(f"{label} return value", hvd.join(), last)
        return label

    def op_optimizer(self, plan):
        """DistributedOptimizer steps checked against a local simulation; maybe one rank joins early."""
        steps = plan.randint(1, 4)
        early = plan.randrange(self.size) if plan.random() < 0.5 else None
        counts = [steps - 1 if r == early else steps for r in range(self.size)]
        momentum = plan.choice([0.0, 0.9])
        bpps = plan.choice([1, 1, 2])
        named = plan.random() < 0.7
        label = f"DistributedOptimizer steps={counts} momentum={momentum} bpps={bpps} named={named}"
        torch.manual_seed(self.rng("model").getrandbits(31))
        model, ref = _model(), _model()
        ref.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum)
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters() if named else None,
                                        backward_passes_per_step=bpps)

        def batch(t, p, r):
            g = torch.Generator().manual_seed(self.rng(f"batch{t}.{p}:{r}").getrandbits(62))
            return torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)

        snapshots = []
        for t in range(steps):
            active = [r for r in range(self.size) if counts[r] > t]
            ref_opt.zero_grad()
            for r in active:
                for p in range(bpps):
                    x, y = batch(t, p, r)
                    torch.nn.functional.mse_loss(ref(x), y).backward()
            for q in ref.parameters():
                q.grad /= self.size  # Average over the full size: joined ranks count as zeros
            ref_opt.step()
            snapshots.append({k: v.clone() for k, v in ref.state_dict().items()})
        for t in range(counts[self.rank]):
            dopt.zero_grad()
            for p in range(bpps):
                x, y = batch(t, p, self.rank)
                torch.nn.functional.mse_loss(model(x), y).backward()
            dopt.step()
            for k, v in model.state_dict().items():
                self.check(f"{label} step {t} {k}", v, snapshots[t][k])
        self.uneven = self.uneven or early is not None
        last = hvd.join()
        if early is None:
            self.check(f"{label} join()", last in range(self.size), True)
        else:
            self.check(f"{label} join() returns a rank that ran every step", last != early, True)
        # as a Horovod user re-syncs after uneven data: parameters and state from the last rank
        hvd.broadcast_parameters(model.state_dict(), root_rank=last)
        hvd.broadcast_optimizer_state(dopt, root_rank=last)
        for k, v in model.state_dict().items():
            self.check(f"{label} after broadcast_parameters {k}", v, snapshots[-1][k])
        if momentum:
            for q, rq in zip(model.parameters(), ref.parameters()):
                self.check(f"{label} momentum after broadcast_optimizer_state",
                           dopt.state[q]["momentum_buffer"], ref_opt.state[rq]["momentum_buffer"])
        return label

    def op_broadcast_helpers(self, plan):
        root = plan.randrange(self.size)
        kind = plan.choice(["SGD", "Adam"])
        form = plan.choice(["state_dict", "named_parameters"])
        label = f"broadcast_parameters({form})/broadcast_optimizer_state({kind}) root={root}"

        def build(r):
            torch.manual_seed(self.rng(f"helpers:{r}").getrandbits(31))
            return _model()

        def optimizer(m, r):
            if kind == "SGD":
                return torch.optim.SGD(m.parameters(), lr=0.01 * (r + 1), momentum=0.5)
            return torch.optim.Adam(m.parameters(), lr=0.001 * (r + 1))

        def local_step(m, o, r):
            g = torch.Generator().manual_seed(self.rng(f"helpers-batch:{r}").getrandbits(62))
            o.zero_grad()
            torch.nn.functional.mse_loss(m(torch.randn(5, 4, generator=g)), torch.randn(5, 2, generator=g)).backward()
            o.step()

        model = build(self.rank)
        params = model.state_dict() if form == "state_dict" else list(model.named_parameters())
        hvd.broadcast_parameters(params, root_rank=root)
        expected_model = build(root)
        for k, v in model.state_dict().items():
            self.check(f"{label} {k}", v, expected_model.state_dict()[k])
        opt = optimizer(model, self.rank)
        local_step(model, opt, self.rank)
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        ref_opt = optimizer(expected_model, root)
        local_step(expected_model, ref_opt, root)
        self.check(f"{label} lr", opt.param_groups[0]["lr"], ref_opt.param_groups[0]["lr"])
        key = "momentum_buffer" if kind == "SGD" else "exp_avg"
        for q, rq in zip(model.parameters(), expected_model.parameters()):
            self.check(f"{label} state {key}", opt.state[q][key], ref_opt.state[rq][key])
        return label

    def op_objects(self, plan):
        root = plan.randrange(self.size)
        name = None if plan.random() < 0.5 else f"soak.obj.r{self.round}.s{self.step}"
        label = f"broadcast_object/allgather_object root={root} name={name}"

        def obj(r):
            rr = self.rng(f"obj:{r}")
            return {"rank": r, "round": self.round, "values": [rr.randrange(1000) for _ in range(rr.randint(0, 50))],
                    "tensor": self.data("objt", r, [2, 2], torch.float32, -5, 5)}

        got = hvd.broadcast_object(obj(self.rank), root_rank=root, name=name)
        self.check(label + " broadcast_object", _plain(got), _plain(obj(root)))
        gathered = hvd.allgather_object(obj(self.rank), name=None if name is None else name + ".ag")
        self.check(label + " allgather_object", [_plain(o) for o in gathered],
                   [_plain(obj(r)) for r in range(self.size)])
        return label

    def op_mismatch(self, plan):
        """One rank's tensor differs: HorovodInternalError on every rank, then the job still works."""
        victim = plan.randrange(self.size)
        kind = plan.choice(["allreduce shape", "allreduce dtype", "allgather shape", "broadcast shape",
                            "grouped_allreduce shape", "reducescatter shape"])
        use_async = plan.random() < 0.5
        name = f"soak.mismatch.r{self.round}.s{self.step}"
        label = f"mismatch {kind} on rank {victim} async={use_async}"
        odd = self.rank == victim
        t = torch.ones(5 if odd else 4)
        if kind == "allreduce dtype":
            t = torch.ones(4, dtype=torch.float64 if odd else torch.float32)
        if kind == "allreduce shape" or kind == "allreduce dtype":
            submit, wait = hvd.allreduce_async, hvd.allreduce
            args = (t,)
        elif kind == "allgather shape":
            t = torch.ones(2, 3 if odd else 2)
            submit, wait, args = hvd.allgather_async, hvd.allgather, (t,)
        elif kind == "broadcast shape":
            submit, wait, args = hvd.broadcast_async, hvd.broadcast, (t, 0)
        elif kind == "grouped_allreduce shape":
            submit, wait, args = hvd.grouped_allreduce_async, hvd.grouped_allreduce, ([torch.ones(3), t],)
        else:
            t = torch.ones(2 * self.size, 3 if odd else 2)
            submit, wait, args = hvd.reducescatter_async, hvd.reducescatter, (t,)

        def run():
            if use_async:
                hvd.synchronize(submit(*args, name=name))
            else:
                wait(*args, name=name)

        self.expect_error(label, hvd.HorovodInternalError, run)
        after = hvd.allreduce(torch.full((3,), float(self.rank + 1)), op=hvd.Sum,
                              name=f"soak.after-mismatch.r{self.round}.s{self.step}")
        self.check(label + ": the next allreduce", after,
                   torch.full((3,), float(sum(range(1, self.size + 1)))))
        return label

    def op_duplicate(self, plan):
        """A second in-flight op with the same name: ValueError on the submitting rank only."""
        victim = plan.randrange(self.size)
        kind = plan.choice(["allreduce", "allgather", "broadcast"])
        name = f"soak.dup.r{self.round}.s{self.step}"
        label = f"duplicate name {kind} on rank {victim}"
        inputs = [self.data("dup", r, [3], torch.float32, -9, 9) for r in range(self.size)]
        t = inputs[self.rank]

        def submit():
            if kind == "allreduce":
                return hvd.allreduce_async(t, name=name, op=hvd.Sum)
            if kind == "allgather":
                return hvd.allgather_async(t, name=name)
            return hvd.broadcast_async(t, 0, name=name)

        expected = {"allreduce": self.reduce(inputs, "Sum", torch.float32, 1),
                    "allgather": torch.cat(inputs), "broadcast": inputs[0]}[kind]
        # as upstream's test: the victim submits (twice) before a barrier, the others after it, so
        # the first op is certainly still in flight at the second submission (were every rank to
        # submit at once, the op could finish before the victim's second call: no error is due)
        handle = None
        if self.rank == victim:
            handle = submit()
            self.expect_error(label + " (second submission)", ValueError, submit)
        hvd.barrier()
        if handle is None:
            handle = submit()
        self.check(label + ": the first op's result", hvd.synchronize(handle), expected)
        self.uneven = True
        return label

    def op_barrier(self, plan):
        return self.on_sets(plan, "barrier", "barrier", lambda members, ps, name, tag: hvd.barrier(process_set=ps))

    def op_local_errors(self, plan):
        """Errors Horovod raises before anything is sent (no rank waits on another)."""
        self.expect_error("reducescatter of a scalar", ValueError, lambda: hvd.reducescatter(torch.tensor(1.0)))
        self.expect_error("allreduce with op and average", ValueError,
                          lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum))
        return "local errors"

    def reinit(self) -> None:
        hvd.shutdown()
        self.check("is_initialized() after shutdown", hvd.is_initialized(), False)
        self.init()
        self.check("size after re-init", hvd.size(), _launch_size())

    def call(self, variant: str, forms, arg, kw):
        """Run one of an op's four forms (sync, async, inplace, async_inplace); return the output."""
        sync, start, inplace, start_inplace = forms
        if variant == "sync":
            return sync(arg, **kw)
        if variant == "async":
            return hvd.synchronize(self.poll_some(start(arg, **kw)))
        if variant == "inplace":
            return inplace(arg, **kw)
        hvd.synchronize(self.poll_some(start_inplace(arg, **kw)))
        return arg

    def poll_some(self, handle):
        """Poll a handle a few times (never required to turn true) before synchronizing it."""
        for _ in range(random.Random(f"{self.seed}:{self.round}:{self.step}:poll:{self.rank}").randint(0, 2)):
            hvd.poll(handle)
        return handle

    # ------------------------------------------------------------------ the loop

    OPS = [("allreduce", 8), ("grouped_allreduce", 3), ("allgather", 3), ("grouped_allgather", 1),
           ("broadcast", 3), ("alltoall", 2), ("reducescatter", 2), ("shuffled_async", 2),
           ("broadcast_helpers", 1), ("objects", 1), ("mismatch", 1), ("barrier", 1),
           ("local_errors", 0.3), ("join", 1.2), ("optimizer", 1.2), ("duplicate", 1)]
    UNEVEN = {"join", "optimizer", "duplicate"}  # start only after the first third of the rounds

    def run(self) -> int:
        self.init()
        start = time.monotonic()
        try:
            for self.round in range(self.rounds):
                plan = random.Random(f"{self.seed}:{self.round}:plan")
                allowed = [(k, w if k not in self.skip else 0) for k, w in self.OPS
                           if k not in self.UNEVEN or self.round >= self.rounds // 3]
                kinds = plan.choices([k for k, _ in allowed], [w for _, w in allowed], k=plan.randint(3, 8))
                # a short run still covers every operation: up to 3 not yet run join each round
                kinds += [k for k, w in allowed if w and k not in self.kinds_run and k not in kinds][:3]
                for self.step, kind in enumerate(kinds):
                    self.watchdog.at(f"round {self.round} step {self.step} {kind}")
                    try:
                        label = getattr(self, f"op_{kind}")(plan)
                    except Exception as exc:
                        print(f"SOAK ERROR rank={self.rank} round={self.round} step={self.step} {kind}: "
                              f"{type(exc).__name__}: {exc}", flush=True)
                        traceback.print_exc(file=sys.stdout)
                        raise Failed() from exc
                    self.ops += 1
                    self.kinds_run[kind] = self.kinds_run.get(kind, 0) + 1
                    if self.verbose:
                        print(f"soak rank={self.rank} round={self.round} step={self.step} {label}", flush=True)
                if self.reinit_every and (self.round + 1) % self.reinit_every == 0:
                    self.watchdog.at(f"round {self.round} shutdown/init")
                    self.reinit()
                    self.kinds_run["reinit"] = self.kinds_run.get("reinit", 0) + 1
            self.watchdog.at("final shutdown")
            hvd.shutdown()
        except Failed:
            self.summary(time.monotonic() - start, completed=False)
            return 1
        self.summary(time.monotonic() - start, completed=True)
        return 1 if self.failures else 0

    def summary(self, elapsed: float, completed: bool) -> None:
        shm = "off" if os.environ.get("HOROVOD_COMPAT_SHM_DATA") == "0" else "on"
        kinds = ",".join(f"{k}:{v}" for k, v in sorted(self.kinds_run.items()))
        print(f"SOAK SUMMARY rank={self.rank} size={self.size} seed={self.seed} "
              f"rounds={self.round + (1 if completed else 0)}/{self.rounds} ops={self.ops} checks={self.checks} "
              f"failures={self.failures} completed={'yes' if completed else 'no'} shm={shm} "
              f"elapsed={elapsed:.1f}s kinds={kinds}", flush=True)


def _launch_size() -> int:
    """The world size from the launcher's variables, needed before hvd.init() to name the sets."""
    for var in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"):
        if os.environ.get(var):
            return int(os.environ[var])
    raise SystemExit("soak_program.py: start it with horovodrun, mpirun or torchrun (no world size found)")


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _plain(obj):
    """An object with its tensors turned into lists, so == compares values."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj


def _short(t: torch.Tensor) -> str:
    flat = t.flatten().tolist()
    return f"{flat[:12]}{' ...' if len(flat) > 12 else ''}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reinit-every", type=int, default=7, help="shutdown/init after every N rounds (0: never)")
    parser.add_argument("--hang-timeout", type=float, default=120.0, help="seconds one operation may take")
    parser.add_argument("--verbose", action="store_true", help="print every operation")
    parser.add_argument("--skip", default="", help="comma-separated operations never to run (e.g. optimizer,join), "
                        "to look past a known failure; the others keep their random choices")
    args = parser.parse_args()
    faulthandler.enable(file=sys.stdout)
    torch.set_num_threads(1)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
