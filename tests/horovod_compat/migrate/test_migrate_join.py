"""``hvd.join()`` after a training loop becomes DDP's ``Join`` context manager around that loop
(rules/optimizer.py: `_plan_join`), where the loop's model is wrapped in DDP; and the parameter-use
proof a DDP wrap needs (rules/parameter_use.py) reads a forward of several positional inputs.

Horovod's join and DDP's Join do the same for the gradients: a rank out of data stands in with
zeros and the average still divides by the whole world size (Join's default
``divide_by_initial_world_size=True``). One program runs: its native form under the torchrun
contract against the original under horovodrun, with uneven batches per rank."""
from __future__ import annotations

import ast
import sys
import textwrap

import pytest

from horovod_compat.migrate import Kind, migrate_source
from horovod_compat.migrate.cli import not_native
from migrate_runs import HOROVODRUN, migrated_alike, native_printed, printed

HEADER = "import torch\nimport torch.nn as nn\nimport horovod.torch as hvd\n\n"

#: Two inputs to a model of this file; rank 1 has 2 batches fewer than rank 0; after the join,
#: a metric is averaged (every rank is back: a plain all_reduce) and the weights are synced.
PROGRAM = HEADER + textwrap.dedent('''\
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 1)
            self.b = nn.Linear(2, 1)

        def forward(self, x, y):
            return self.a(x) + self.b(y)


    def main():
        hvd.init()
        torch.manual_seed(5)
        model = Pair()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        g = torch.Generator().manual_seed(10 + hvd.rank())
        batches = [(torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g), torch.randn(4, 1, generator=g))
                   for _ in range(6 - 2 * hvd.rank())]
        step = 0
        for x, y, target in batches:
            opt.zero_grad()
            loss = ((model(x, y) - target) ** 2).mean()
            loss.backward()
            opt.step()
            step += 1
            print(f"JOIN rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        last = hvd.join()
        mean = hvd.allreduce(torch.tensor([float(step)]), name="steps")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        total = sum(p.double().sum().item() for p in model.parameters())
        print(f"JOIN rank={hvd.rank()} steps={mean.item():.2f} final={total:.6f}", flush=True)


    if __name__ == "__main__":
        main()
    ''')


def migrate(source: str):
    result = migrate_source(source, "prog.py")
    ast.parse(result.source, feature_version=(3, 9))
    return result


def todos(result) -> list:
    return [f.message for f in result.findings if f.kind is Kind.TODO]


def test_join_after_the_loop_becomes_the_loop_under_ddps_join():
    result = migrate(PROGRAM)
    assert not todos(result) and not_native([result.source], result.findings) is None
    source = result.source
    assert "from torch.distributed.algorithms.join import Join\n" in source
    assert "    ddp_model = DDP(model, forward_sync_buffers=False)\n" in source
    assert "    with Join([ddp_model]):\n        for x, y, target in batches:\n" in source
    assert "            loss = ((ddp_model(x, y) - target) ** 2).mean()\n" in source
    # the value Horovod returned has no DDP counterpart: named at the line and in the report
    assert "    last = -1  # DDP's Join does not tell which rank joined last (Horovod's hvd.join() returned it)\n" \
        in source
    assert any("last = -1" in f.message for f in result.findings if f.kind is Kind.REWRITE)
    # no emulation of Horovod's join: after the Join block every rank takes part in the metric's
    # average again
    assert "_native_join" not in source and "_native_distributed_optimizer" not in source
    assert migrate_source(source, "prog.py").source == source  # a fixed point


def test_the_native_program_prints_what_the_original_printed(tmp_path):
    """Exact: the losses of every step on both ranks (rank 1 joins 2 steps early, so rank 0's
    last 2 steps average its gradient with rank 1's zeros over 2 ranks), the steps' average and
    the final weights."""
    original = tmp_path / "original.py"
    original.write_text(PROGRAM)
    native = tmp_path / "native.py"
    native.write_text(migrate(PROGRAM).source)
    line = r"JOIN rank=\d (?:step=\d loss=\S+|steps=\S+ final=\S+)"
    want = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original))
    assert len(want) == 6 + 4 + 2 and "JOIN rank=1 steps=5.00 final=" in want[-1], want
    assert native_printed(native, 2, line) == want


@pytest.mark.parametrize("change, reason", [
    # a collective in the loop: the ranks still in it would wait for the joined ones there
    (("        step += 1\n", "        step += 1\n        hvd.allreduce(loss.detach(), name='loss')\n"),
     "hvd.allreduce() at line 36 runs in the loop that hvd.join() ends"),
    # ... or in a function of the file that the loop calls
    (("        step += 1\n", "        step += 1\n        log(loss)\n"),
     "hvd.allreduce() at line 6 runs in log(), which the loop that hvd.join() ends calls"),
    (("    last = hvd.join()\n", "    print('done')\n    last = hvd.join()\n"),
     "does not follow the training loop it ends"),
    (("    last = hvd.join()\n", "    last = hvd.join(0)\n"),
     "is not a statement of its own without arguments"),
])
def test_what_join_cannot_cover_keeps_a_todo_that_says_why(change, reason):
    old, new = change
    assert old in PROGRAM
    log = "def log(loss):\n    print(hvd.allreduce(loss.detach(), name='loss'))\n\n\n"
    result = migrate(PROGRAM.replace(old, new).replace("class Pair", log + "class Pair"))
    messages = todos(result)
    assert any(reason in m for m in messages), messages
    assert "with Join(" not in result.source


@pytest.mark.parametrize("forward, called, unproven", [
    ("return self.a(x) + self.b(y)", "model(x, y)", None),
    # a short-circuit can skip a submodule, whatever the inputs
    ("return (y.sum() > 0 and self.a(x)) + self.b(y)", "model(x, y)", "branches or loops"),
    # a keyword usually chooses what runs
    ("return self.a(x) + self.b(y)", "model(x, y=y)", "passes more than the input"),
])
def test_a_forward_of_several_inputs_of_this_files_class_is_read(forward, called, unproven):
    """Where every parameter's gradient is not proven, the join keeps the model off the in-place
    form (only a DDP wrap takes DDP's Join): it is wrapped with find_unused_parameters=True, the
    reason in the report and the difference at the line."""
    source = PROGRAM.replace("return self.a(x) + self.b(y)", forward).replace("model(x, y)", called)
    result = migrate(source)
    assert not todos(result) and "with Join([ddp_model]):" in result.source
    if unproven is None:
        assert "ddp_model = DDP(model, forward_sync_buffers=False)\n" in result.source
    else:
        assert ("ddp_model = DDP(model, forward_sync_buffers=False, find_unused_parameters=True)  "
                "# unused parameters keep grad None (Horovod: zeros)\n") in result.source
        notes = [f.message for f in result.findings if f.name == "hvd.DistributedOptimizer"]
        assert any(unproven in n and "not made in place: the program calls hvd.join()" in n for n in notes), notes


def test_join_with_unused_parameters_found_prints_what_the_original_printed(tmp_path):
    """DDP's Join over a wrap with find_unused_parameters=True (the keyword case above): every
    parameter is used here, so the numbers are Horovod's, the early-joined rank's zeros included."""
    source = PROGRAM.replace("model(x, y)", "model(x, y=y)")
    result = migrated_alike(tmp_path, source, r"JOIN rank=\d (?:step=\d loss=\S+|steps=\S+ final=\S+)", 12)
    assert "find_unused_parameters=True" in result.source


def test_several_inputs_to_a_torch_layer_are_not_taken_as_inputs():
    """torch.nn layers are read as taking the input only: a second argument to one is not proven
    harmless."""
    source = HEADER + textwrap.dedent('''\
        hvd.init()
        model = nn.Bilinear(3, 2, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(1, 3), torch.ones(1, 2)).sum().backward()
            opt.step()
        ''')
    result = migrate(source)
    assert "ddp_model = DDP(" not in result.source


#: A trainer whose loop is its base class's, in another module (as in DeepGNN's HVDTrainer and
#: Lightning's strategy): hvd.join() after ``super().train_epoch()`` ends a loop this file does
#: not show, so DDP's Join cannot go around it.
BASE_TRAINER = textwrap.dedent('''\
    class Trainer:
        def __init__(self, model, optimizer, batches):
            self.model = model
            self.batches = batches
            self.optimizer = self.init_optimizer(optimizer)

        def init_optimizer(self, optimizer):
            return optimizer

        def train_epoch(self, epoch):
            for step, (x, y) in enumerate(self.batches):
                self.optimizer.zero_grad()
                loss = ((self.model(x) - y) ** 2).mean()
                loss.backward()
                self.optimizer.step()
                self.log(epoch, step, loss)

        def log(self, epoch, step, loss):
            pass
    ''')

TRAINER = HEADER + textwrap.dedent('''\
    from base_trainer import Trainer


    class HvdTrainer(Trainer):
        def init_optimizer(self, optimizer):
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
            return hvd.DistributedOptimizer(optimizer, named_parameters=self.model.named_parameters())

        def log(self, epoch, step, loss):
            mean = hvd.allreduce(loss.detach())
            print(f"BASE rank={hvd.rank()} epoch={epoch} step={step} loss={loss.item():.6f} mean={mean.item():.6f}",
                  flush=True)

        def train_epoch(self, epoch):
            super().train_epoch(epoch)
            hvd.join()


    def main():
        hvd.init()
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        g = torch.Generator().manual_seed(20 + hvd.rank())
        batches = [(torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)) for _ in range(4)]
        trainer = HvdTrainer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batches)
        for epoch in range(2):
            trainer.train_epoch(epoch)
        total = sum(p.double().sum().item() for p in model.parameters())
        print(f"BASE rank={hvd.rank()} final={total:.6f}", flush=True)


    if __name__ == "__main__":
        main()
    ''')


def test_a_join_after_a_loop_out_of_view_becomes_a_barrier_named_at_its_line():
    result = migrate(TRAINER)
    assert not todos(result) and not_native([result.source], result.findings) is None
    source = result.source
    assert "        super().train_epoch(epoch)\n        dist.barrier()  # was hvd.join(): assumes every rank " \
        "ran as many steps (DDP needs that; Horovod's join let a rank out of data stand in with zeros)\n" in source
    assert "replicate(self.model" in source
    assert "_native_join" not in source and "_native_distributed_optimizer" not in source
    assert any("dist.barrier()" in f.message for f in result.findings if f.kind is Kind.REWRITE)


def test_the_trainer_out_of_view_prints_what_the_original_printed(tmp_path):
    """Exact, every rank running as many steps: each step's loss and its average over the ranks,
    for 2 epochs, and the final weights."""
    (tmp_path / "base_trainer.py").write_text(BASE_TRAINER)
    migrated_alike(tmp_path, TRAINER, r"BASE rank=\d (?:epoch=\d step=\d loss=\S+ mean=\S+|final=\S+)", 2 * (8 + 1))


@pytest.mark.parametrize("change", [
    # the loop the join ends is in this file: a base class of it
    ("from base_trainer import Trainer\n", BASE_TRAINER),
    # ... or the join's own function runs it
    ("        super().train_epoch(epoch)\n",
     "        for _ in range(1):\n            super().train_epoch(epoch)\n"),
])
def test_a_join_after_a_loop_in_view_is_no_barrier(change):
    assert_no_barrier(TRAINER, *change)


def assert_no_barrier(program: str, old: str, new: str) -> None:
    """`program` with `old` replaced by `new` keeps hvd.join() and a TODO naming the loop it ends."""
    assert old in program
    result = migrate(program.replace(old, new))
    assert "dist.barrier()" not in result.source
    assert any("hvd.join() at line" in m and "ends a loop of this file" in m for m in todos(result)), todos(result)


#: ffvqgan's form: each rank writes the features of its own share of the files in a loop that runs
#: no collective, then hvd.join() waits for the others before rank 0 merges them.
FEATURES = HEADER + textwrap.dedent('''\
    def extract(paths, out):
        mine = [p for i, p in enumerate(paths) if i % hvd.size() == hvd.rank()]
        features = []
        for path in mine:
            features.append(torch.zeros(2))
        torch.save(features, f"{out}_{hvd.rank()}")
        hvd.join()


    def train(model, batches):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for x in batches:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    ''')


@pytest.mark.parametrize("loop_body, barrier", [
    ("features.append(torch.zeros(2))", True),
    # a collective in the loop: a rank with more files would wait there for one that joined
    ("features.append(hvd.allreduce(torch.zeros(2)))", False),
    # so does a backward(): a data-parallel model's averaging
    ("model(torch.zeros(2)).sum().backward()", False),
])
def test_a_join_after_a_loop_that_runs_no_collective_becomes_a_barrier(loop_body, barrier):
    result = migrate(FEATURES.replace("features.append(torch.zeros(2))", loop_body))
    assert ("\n    dist.barrier()  # was hvd.join()" in result.source) == barrier, todos(result)
    assert ("replicate(model, " in result.source) == barrier
    if not barrier:
        assert any("hvd.join() at line 11 ends a loop of this file" in m for m in todos(result)), todos(result)


#: NVTabular's form: the epoch loop calls a training function of another module, joins, broadcasts
#: the parameters, and the program joins once more after the loop.
EPOCHS = textwrap.dedent('''\
    def process_epoch(batches, model, optimizer):
        total = 0.0
        for x, y in batches:
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            total += loss.item()
        return total / len(batches)
    ''')

EPOCH_JOINS = HEADER + textwrap.dedent('''\
    from epochs import process_epoch


    def main():
        hvd.init()
        torch.manual_seed(5)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        g = torch.Generator().manual_seed(40 + hvd.rank())
        batches = [(torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)) for _ in range(3)]
        for epoch in range(2):
            loss = process_epoch(batches, model, optimizer)
            hvd.join()
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            print(f"EPOCHS rank={hvd.rank()} epoch={epoch} loss={loss:.6f}", flush=True)
        hvd.join()
        print(f"EPOCHS rank={hvd.rank()} final={sum(p.double().sum().item() for p in model.parameters()):.6f}")


    if __name__ == "__main__":
        main()
    ''')


def test_joins_in_and_after_an_epoch_loop_become_barriers_and_print_the_originals_numbers(tmp_path):
    """A loop with a join among its own statements runs as many passes on every rank (under
    Horovod a rank with one more would wait in its join forever), so the broadcast beside the join
    runs on every rank alike: both joins become barriers, named at their lines."""
    (tmp_path / "epochs.py").write_text(EPOCHS)
    result = migrated_alike(tmp_path, EPOCH_JOINS, r"EPOCHS rank=\d (?:epoch=\d loss=\S+|final=\S+)", 2 * 3)
    assert not todos(result) and not_native([result.source], result.findings) is None
    assert result.source.count("dist.barrier()  # was hvd.join(): assumes every rank ran as many steps") == 2
    assert "replicate(model, " in result.source


@pytest.mark.parametrize("change", [
    # the join only on some passes: the passes need not be as many on every rank
    ("        hvd.join()\n        hvd.broadcast", "        if epoch:\n            hvd.join()\n        hvd.broadcast"),
    # a loop of this file inside the epoch loop averages: a rank with more data would wait there
    ("        loss = process_epoch(batches, model, optimizer)\n",
     "        loss = process_epoch(batches, model, optimizer)\n"
     "        for x, _ in batches:\n            hvd.allreduce(x)\n"),
])
def test_an_epoch_loop_that_may_not_pace_the_ranks_keeps_its_todo(change):
    assert_no_barrier(EPOCH_JOINS, *change)
