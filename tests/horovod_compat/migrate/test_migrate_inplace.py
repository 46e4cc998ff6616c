"""``hvd.DistributedOptimizer`` where no ``DDP(model)`` wrap can be proven: the model is made
data-parallel in place with ``replicate()`` (rules/inplace.py), or, where that cannot be done
either, the call keeps the fallback with both reasons. One program runs: its native form under the
torchrun contract against the original under horovodrun."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap

import pytest

from horovod_compat.migrate import Kind, migrate_source, torch_api
from horovod_compat.migrate.cli import not_native
from migrate_runs import HOROVODRUN, migrated_alike, native_printed, printed

REPLICATE = "from torch.distributed._composable import replicate"


def migrate(body: str, name: str = "prog.py", emulate: bool = False):
    source = "import torch\nimport horovod.torch as hvd\n\n" + textwrap.dedent(body)
    result = migrate_source(source, name, emulate=emulate)
    ast.parse(result.source, feature_version=(3, 9))
    return result


def replicated(source: str) -> list:
    return re.findall(r"^\s*replicate\((.+?), find_unused_parameters=True\)  # DDP in place", source, re.M)


def optimizer_note(result) -> str:
    return next(f.message for f in result.findings if f.name == "hvd.DistributedOptimizer")


@pytest.fixture
def torch_offers(monkeypatch):
    """Write for a torch that offers only the given APIs of torch_api.CHECKS."""
    def offer(*names):
        monkeypatch.setenv(torch_api.ENV, ",".join(names))
        torch_api.available.cache_clear()
    yield offer
    monkeypatch.delenv(torch_api.ENV, raising=False)
    torch_api.available.cache_clear()


def test_a_trainer_class_replicates_its_model_attribute_and_keeps_the_plain_optimizer():
    result = migrate('''
        class Trainer:
            def __init__(self, model):
                self.model = model
                opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                self.optimizer = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters())

            def step(self, x):
                self.optimizer.zero_grad()
                self.model(x).sum().backward()
                self.optimizer.synchronize()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                with self.optimizer.skip_synchronize():
                    self.optimizer.step()
        ''')
    out = result.source
    assert replicated(out) == ["self.model"]
    assert "self.optimizer = opt\n" in out and REPLICATE in out
    assert out.index("replicate(self.model") < out.index("self.optimizer = opt")
    # DDP has averaged the gradients after backward(): no synchronize is left to call
    assert "synchronize" not in out and "        self.optimizer.step()" in out
    assert "_native_distributed_optimizer" not in out and "hvd" not in out
    assert not [f for f in result.findings if f.kind is Kind.TODO]
    assert "DDP in place" in optimizer_note(result)


def test_a_model_from_a_registry_passed_to_other_functions_is_replicated():
    result = migrate('''
        import torchvision.models as models

        def evaluate(model, x):
            return model(x).mean()

        def main(name):
            hvd.init()
            model = getattr(models, name)()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            evaluate(model, torch.zeros(1, 3, 8, 8))
        ''')
    assert replicated(result.source) == ["model"]
    assert "\n    optimizer = optimizer\n" not in result.source  # the optimizer itself: no `x = x`


@pytest.mark.parametrize("params, models", [
    ("list(encoder.parameters()) + list(decoder.parameters())", ["encoder", "decoder"]),
    ("itertools.chain(encoder.parameters(), decoder.parameters())", ["encoder", "decoder"]),
    ('[{"params": net.backbone.parameters(), "lr": 1e-4}, {"params": net.head.parameters()}]',
     ["net.backbone", "net.head"]),
    ("[p for p in net.parameters() if p.requires_grad]", ["net"]),
    ("trainable", ["net"]),  # a name bound to the parameters before
])
def test_the_models_are_found_from_the_optimizers_parameters(params, models):
    result = migrate(f'''
        import itertools

        def build(encoder, decoder, net):
            trainable = filter(lambda p: p.requires_grad, net.parameters())
            opt = torch.optim.Adam({params}, lr=1e-3)
            return hvd.DistributedOptimizer(opt)
        ''')
    assert replicated(result.source) == models
    assert "    return opt\n" in result.source


@pytest.mark.parametrize("body", [
    # the most common form without named_parameters=: the optimizer's name re-bound to its wrap
    '''
        def train(config):
            net = torch.nn.Linear(1, 1)
            optimizer = torch.optim.SGD(
                net.parameters(),
                lr=config["lr"],
            )
            optimizer = hvd.DistributedOptimizer(optimizer)
            return optimizer
        ''',
    # ... with the wrap under a flag, the optimizer built in the block around it
    '''
        def train(args):
            net = torch.nn.Linear(1, 1)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            if args.horovod:
                optimizer = hvd.DistributedOptimizer(optimizer)
            return optimizer
        ''',
])
def test_an_optimizer_re_bound_to_its_wrap_is_followed_to_its_model(body):
    result = migrate(body)
    assert replicated(result.source) == ["net"], result.source
    assert "    return optimizer\n" in result.source and "hvd" not in result.source


@pytest.mark.parametrize("body", [
    '''
        def train(args, net):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            if args.adam:
                optimizer = torch.optim.Adam(args.model.parameters())
            optimizer = hvd.DistributedOptimizer(optimizer)
        ''',
    '''
        def train(args, net, epochs):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            for epoch in range(epochs):
                optimizer = hvd.DistributedOptimizer(optimizer)
        ''',
])
def test_an_optimizer_whose_value_at_the_wrap_is_not_one_binding_keeps_the_todo(body):
    """A binding in a branch between (which of the two is wrapped?), or a wrap in a loop (the second
    turn wraps the wrapped optimizer): the value at the wrap is not known."""
    result = migrate(body)
    assert not replicated(result.source)
    assert "whose parameters the rewriter cannot follow" in optimizer_note(result), optimizer_note(result)


@pytest.mark.parametrize("body, reason", [
    ('''
        def build(model, temperature):
            opt = torch.optim.SGD(list(model.parameters()) + [temperature], lr=0.1)
            return hvd.DistributedOptimizer(opt)
        ''', "`temperature` is not a module's parameters()"),
    ('''
        def train(model, x):
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
            helper(model)
            return model.forward
        ''', "`model.forward` is used as a value: a call through it would bypass"),
    ('''
        def train(model, x):
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
            helper(model)
            while model.forward(x).sum() > 0:
                x = x - 1
        ''', "`model.forward(...)` would bypass the data-parallel hooks (it is not in a simple statement)"),
    ('''
        import copy

        def train(model):
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
            helper(model)
            ema = copy.deepcopy(model)
        ''', "`copy.deepcopy(model)` after the wrap"),
    ('''
        def train(model, make):
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
            helper(model)
            model = make()
        ''', "`model` is re-bound at line 9, after the wrap"),
    ('''
        def train(model):
            for attempt in range(2):
                opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
                helper(model)
        ''', "inside a loop over `attempt`, and `model` does not change with it"),
    ('''
        def train(models):
            while models:
                model = models.pop()
                opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
                helper(model)
        ''', "inside a loop"),
    ('''
        def train(model, opt):
            helper(model)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            other.synchronize()
        ''', "`other.synchronize()` at line"),
    # the module under another name: a replicated module cannot be pickled whole
    ('''
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                    named_parameters=model.named_parameters())

            def save(self, path):
                torch.save(self.model, path)
        ''', "the whole module `self.model` is pickled"),
])
def test_what_replicate_cannot_cover_keeps_the_fallback_and_says_why(body, reason):
    result = migrate(body)
    assert not replicated(result.source)
    assert reason in optimizer_note(result), optimizer_note(result)


@pytest.mark.parametrize("body, models", [
    ('''
        def train(models):
            for model in models:
                opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters())
                helper(model)
        ''', ["model"]),
    ('''
        def train(models):
            for k in models.keys():
                models[k][-1] = hvd.DistributedOptimizer(models[k][-1],
                                                         named_parameters=models[k][0].named_parameters())
        ''', ["models[k][0]"]),
])
def test_a_wrap_in_a_loop_over_the_models_replicates_each_module_of_the_loop(body, models):
    """Each turn names another module (a second replicate() of one module raises at once)."""
    result = migrate(body)
    assert replicated(result.source) == models and not_native([result.source], result.findings) is None


def test_the_model_passed_by_keyword_or_moved_after_the_wrap_is_not_a_re_binding():
    """``evaluate(model=model)`` (a deepspeech trainer's form) and ``model = model.cuda()`` keep the
    module the wrap replicated."""
    result = migrate('''
        def train(model, loader):
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
            evaluate(loader=loader,
                     model=model)
            model = model.cuda()
        ''')
    assert replicated(result.source) == ["model"], optimizer_note(result)


@pytest.mark.parametrize("rebind", [
    "model = torch.compile(model)",
    "original_model = model; model = torch.compile(original_model)",  # open_clip's main.py
    "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to('cpu')",
    "model = torch.nn.DataParallel(model)",  # yolov5's train.py (one process, several GPUs)
])
def test_a_model_re_bound_to_a_wrapper_that_runs_it_stays_replicated(rebind):
    """``torch.compile``, ``DataParallel`` and ``convert_sync_batchnorm`` call the module they are
    given, hooks and all, so re-binding the name to them after the wrap keeps the replicated module
    training; a re-binding to another module still blocks the rewrite."""
    body = f'''
    def main(model):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        {rebind}
        train(model, opt)
    '''
    result = migrate(body)
    assert replicated(result.source) == ["model"], optimizer_note(result)
    assert ("several GPUs of one process" in optimizer_note(result)) == ("DataParallel" in rebind)
    other = migrate(body.replace(rebind.split("; ")[-1], "model = torch.nn.Linear(2, 2)"))
    assert replicated(other.source) == [] and "re-bound at line" in optimizer_note(other)


def test_a_gradient_read_the_rewriter_cannot_place_is_named_at_its_line():
    """mala's trainer: gradients logged in a method reached from where the rewriter cannot follow.
    After the step they are the same under DDP; before it, averaged where Horovod's were still in
    flight: the comment above the read and the report say both, and the model is replicated."""
    result = migrate('''
        class Trainer:
            def setup(self):
                self.optimizer = hvd.DistributedOptimizer(self.optimizer,
                                                          named_parameters=self.network.named_parameters())

            def log(self, board):
                for name, param in self.network.named_parameters():
                    board.add_histogram(name, param.grad)
        ''')
    assert replicated(result.source) == ["self.network"], optimizer_note(result)
    lines = result.source.splitlines()
    read = next(i for i, line in enumerate(lines) if "param.grad" in line)
    assert lines[read - 1].strip() == \
        "# DDP: gradients are averaged once backward() returns (Horovod: in step() or synchronize())"
    assert "cannot tell whether before or after step() (line 12)" in optimizer_note(result)


def test_the_synchronize_of_an_optimizer_a_method_returned_is_dropped():
    """nlp-recipes' form: ``create_optimizer()`` wraps and returns the optimizer, ``fit()`` binds it
    to another name and calls its synchronize() before step(). A replicated model's optimizer is
    torch's own, which has no synchronize(): the call goes; another object's synchronize() stays a
    TODO."""
    body = '''
        class Classifier:
            def create_optimizer(self):
                optimizer = torch.optim.Adam(self.model.parameters())
                optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=self.model.named_parameters())
                return optimizer

            def fit(self, loader, bert_optimizer=None):
                if bert_optimizer is None:
                    bert_optimizer = self.create_optimizer()
                for x in loader:
                    self.model(x).sum().backward()
                    bert_optimizer.synchronize()
                    bert_optimizer.step()
        '''
    result = migrate(body)
    assert replicated(result.source) == ["self.model"], optimizer_note(result)
    assert "synchronize" not in result.source and "bert_optimizer.step()" in result.source
    other = migrate(body.replace("bert_optimizer = self.create_optimizer()", "bert_optimizer = self.build()"))
    assert replicated(other.source) == [] and "`bert_optimizer.synchronize()` at line 16 may be" in optimizer_note(other)


def test_a_deepcopy_before_the_wrap_and_a_device_synchronize_do_not_block_it():
    result = migrate('''
        import copy

        def train(model):
            ema = copy.deepcopy(model)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters())
            helper(model)
            torch.cuda.synchronize()
        ''')
    assert replicated(result.source) == ["model"]


def test_fp16_compression_becomes_the_comm_hook_of_the_replicated_module(torch_offers):
    body = '''
        def build(self):
            self.optimizer = hvd.DistributedOptimizer(
                torch.optim.SGD(self.net.parameters(), lr=0.1),
                named_parameters=self.net.named_parameters(), compression=hvd.Compression.fp16)
        '''
    out = migrate(body).source
    assert replicated(out) == ["self.net"]
    assert "self.net.register_comm_hook(None, default_hooks.fp16_compress_hook)" in out
    # a torch whose replicate() takes no comm hook: not in place
    torch_offers("replicate", "DDP.forward_sync_buffers")
    result = migrate(body)
    assert not replicated(result.source)
    assert "replicate() takes no comm hook" in optimizer_note(result)


def test_a_torch_without_replicate_keeps_the_fallback(torch_offers):
    torch_offers("DDP.forward_sync_buffers", "replicate.register_comm_hook")
    result = migrate('''
        def build(self):
            self.optimizer = hvd.DistributedOptimizer(torch.optim.SGD(self.net.parameters(), lr=0.1),
                                                      named_parameters=self.net.named_parameters())
        ''')
    assert not replicated(result.source) and REPLICATE not in result.source
    assert "this torch has no torch.distributed._composable.replicate" in optimizer_note(result)


def test_the_ddp_wrap_syncs_buffers_once_on_every_torch(torch_offers):
    """forward_sync_buffers=False only where the user's torch has it; elsewhere
    broadcast_buffers=False, and the program's own broadcast of the state_dict stays for the one
    sync Horovod made."""
    body = '''
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(2, 2)

            def forward(self, x):
                return self.fc(x)

        def main():
            hvd.init()
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            model(torch.zeros(1, 2)).sum().backward()
        '''
    new = migrate(body).source
    assert "ddp_model = DDP(model, forward_sync_buffers=False)" in new
    assert "broadcast" not in new  # DDP's construction syncs parameters and buffers
    torch_offers("replicate", "replicate.register_comm_hook")
    old = migrate(body).source
    assert "ddp_model = DDP(model, broadcast_buffers=False)" in old and "forward_sync_buffers" not in old
    assert "for tensor in model.state_dict().values():  # hvd.broadcast_parameters\n" \
           "        dist.broadcast(tensor, src=0)\n" in old


def test_named_parameters_written_over_several_lines_does_not_stop_the_tool(torch_offers):
    body = '''
        class Trainer:
            def __init__(self):
                self.network = torch.nn.Linear(4, 2)
                opt = torch.optim.SGD(self.network.parameters(), lr=0.1)
                self.optimizer = hvd.DistributedOptimizer(
                    opt,
                    named_parameters=
                    self.network.
                    named_parameters())
        '''
    assert replicated(migrate(body).source) == ["self.network"]
    torch_offers()  # no replicate: --emulate's optimizer keeps the argument, whole, in parentheses
    out = migrate(body, emulate=True).source
    assert "(self.network.\n            named_parameters()))" in out
    out = migrate(body).source  # and by default the call stays, with a TODO naming the option
    assert "TODO(horovod-compat): hvd.DistributedOptimizer: " in out and "--emulate" in out


def test_a_state_made_before_the_wrap_is_cleared_as_horovods_wrapper_started_without_it():
    out = migrate('''
        def build(model, opt):
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            helper(model)
            return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        ''').source
    assert out.index("opt.state.clear()") < out.index("replicate(model")


def test_an_optimizer_built_again_before_the_wrap_has_no_state_to_clear():
    """The name stepped an earlier optimizer (a baseline trained first, as in a SyncBatchNorm
    comparison), then was bound to a new one, which the wrap takes: nothing to clear. A step
    after that binding still clears."""
    body = '''
        def compare(model, sync_model, x):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(x).sum().backward()
            opt.step()
            opt = torch.optim.SGD(sync_model.parameters(), lr=0.1)
            {between}opt = hvd.DistributedOptimizer(opt, named_parameters=sync_model.named_parameters())
            return opt
        '''
    assert "state.clear()" not in migrate(body.format(between="")).source
    stepped = "sync_model(x).sum().backward()\n            opt.step()\n            "
    assert "opt.state.clear()" in migrate(body.format(between=stepped)).source


PROGRAM = '''\
import os
import torch
import horovod.torch as hvd


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh())
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))


def evaluate(model, x):
    with torch.no_grad():
        return model(x).mean().item()


class Trainer:
    def __init__(self, model, fp16):
        self.model = model
        groups = [{"params": model.body.parameters(), "lr": 0.05},
                  {"params": model.head.parameters(), "lr": 0.1}]
        self.optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(groups, momentum=0.9),
            named_parameters=self.model.named_parameters(),
            compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none)

    def step(self, x, y):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def main(fp16):
    hvd.init()
    torch.manual_seed(0)
    model = Encoder()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    trainer = Trainer(model, fp16)
    gen = torch.Generator().manual_seed(7 + hvd.rank())
    for step in range(6):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 1, generator=gen)
        loss = trainer.step(x, y)
        print(f"INPLACE rank={hvd.rank()} step={step} loss={loss:.6f} eval={evaluate(model, x):.6f}")
    total = sum(p.double().sum().item() for p in model.parameters())
    print(f"INPLACE rank={hvd.rank()} final={total:.6f}")


if __name__ == "__main__":
    main(fp16=os.environ.get("INPLACE_FP16") == "1")
'''


def test_a_replicated_trainer_prints_the_numbers_it_printed_under_horovod(tmp_path):
    """A model held by a trainer class and handed to evaluate(), param groups, fp16 compression
    chosen at run time: the native program gives the original's losses and weights on both ranks
    (without compression exactly; DDP's fp16 hook divides before the sum where Horovod's
    compression divided after it, so with fp16 to 1e-3)."""
    original = tmp_path / "original.py"
    original.write_text(PROGRAM)
    result = migrate_source(PROGRAM, "original.py")
    native = tmp_path / "native.py"
    native.write_text(result.source)
    assert replicated(result.source) == ["self.model"] and not_native([result.source], result.findings) is None
    line = r"INPLACE rank=\d (?:step=\d loss=\S+ eval=\S+|final=\S+)"
    want = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original))
    assert len(want) == 14, want
    assert native_printed(native, 2, line) == want
    numbers = re.compile(r"-?\d+\.\d+")
    fp16 = {"INPLACE_FP16": "1"}
    want16 = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original), env=fp16)
    got16 = native_printed(native, 2, line, env=fp16)
    assert len(got16) == len(want16) == 14 and got16 != want  # (fp16 changed the numbers a little)
    for a, b in zip(got16, want16):
        assert numbers.sub("#", a) == numbers.sub("#", b)
        assert all(abs(float(x) - float(y)) <= 1e-3 for x, y in zip(numbers.findall(a), numbers.findall(b))), (a, b)


def test_the_comment_above_the_wrap_stays_above_it_once():
    out = migrate('''
        class Trainer:
            def __init__(self, model):
                # Horovod: wrap the optimizer
                self.optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                          named_parameters=model.named_parameters())
        ''').source
    assert out.count("# Horovod: wrap the optimizer") == 1
    assert out.index("# Horovod: wrap the optimizer") < out.index("replicate(model")


SUM_PROGRAM = '''
import torch
import horovod.torch as hvd


class Learner:
    def __init__(self):
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)
        self.opt = hvd.DistributedOptimizer(opt, named_parameters=self.net.named_parameters(), op=hvd.Sum)
        hvd.broadcast_parameters(self.net.state_dict(), root_rank=0)


def main():
    hvd.init()
    learner = Learner()
    gen = torch.Generator().manual_seed(11 + hvd.rank())
    for step in range(5):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 1, generator=gen)
        learner.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(learner.net(x), y)
        loss.backward()
        learner.opt.step()
        print(f"SUM rank={hvd.rank()} step={step} loss={loss.item():.6f}")
    total = sum(p.double().sum().item() for p in learner.net.parameters())
    print(f"SUM rank={hvd.rank()} final={total:.6f}")


main()
'''


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_op_sum_becomes_a_comm_hook_that_sums_and_the_numbers_stay(tmp_path, compression):
    """``op=hvd.Sum``: the replicated module gets a comm hook that sums (DDP averages by
    itself), in torch's ``fp16_compress_wrapper`` with fp16 compression (Horovod casts to float16,
    sums, casts back: so does the wrapper); the native program prints the original's losses and
    weights on both ranks."""
    program = SUM_PROGRAM if compression == "none" else \
        SUM_PROGRAM.replace("op=hvd.Sum)", "op=hvd.Sum, compression=hvd.Compression.fp16)")
    result = migrate_source(program, "original.py")
    assert not_native([result.source], result.findings) is None
    assert "replicate(self.net" in result.source and "_native_distributed_optimizer" not in result.source
    hook = "_native_sum_gradients" if compression == "none" else \
        "default_hooks.fp16_compress_wrapper(_native_sum_gradients)"
    assert f"self.net.register_comm_hook(None, {hook})  # op=hvd.Sum" in result.source
    original, native = tmp_path / "original.py", tmp_path / "native.py"
    original.write_text(program)
    native.write_text(result.source)
    line = r"SUM rank=\d (?:step=\d loss=\S+|final=\S+)"
    want = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original))
    assert len(want) == 12, want
    assert native_printed(native, 2, line) == want


def test_passes_per_step_with_one_backward_before_each_step_change_nothing(tmp_path):
    """backward_passes_per_step=3 where every step() follows one backward(): Horovod's step()
    averaged the gradients of that one pass (those not yet averaged), so the option changed
    nothing; the rewrite drops it, says so, and the native program gives Horovod's numbers."""
    program = PROGRAM.replace("named_parameters=self.model.named_parameters(),",
                              "named_parameters=self.model.named_parameters(), backward_passes_per_step=3,")
    assert program != PROGRAM
    result = migrated_alike(tmp_path, program, r"INPLACE rank=\d (?:step=\d loss=\S+ eval=\S+|final=\S+)", 14)
    assert replicated(result.source) == ["self.model"] and not_native([result.source], result.findings) is None
    assert "no_sync" not in result.source and "set_requires_gradient_sync" not in result.source
    notes = [f.message for f in result.findings if f.name == "hvd.DistributedOptimizer"]
    assert any("backward_passes_per_step=3 dropped: each step() follows one backward()" in n for n in notes), notes


LOOP_PROGRAM = '''\
import torch
import horovod.torch as hvd


def build():
    models = {}
    for name, width in (("encoder", 8), ("critic", 4)):
        net = torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))
        models[name] = [net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)]
    return models


def main():
    hvd.init()
    torch.manual_seed(0)
    models = build()
    for i in models.keys():
        hvd.broadcast_parameters(models[i][0].state_dict(), root_rank=0)
        models[i][-1] = hvd.DistributedOptimizer(models[i][-1], named_parameters=models[i][0].named_parameters())
    gen = torch.Generator().manual_seed(3 + hvd.rank())
    for step in range(4):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 1, generator=gen)
        for name, (net, opt) in models.items():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            print(f"LOOP rank={hvd.rank()} step={step} {name} loss={loss.item():.6f}")
    total = sum(p.double().sum().item() for net, _ in models.values() for p in net.parameters())
    print(f"LOOP rank={hvd.rank()} final={total:.6f}")


if __name__ == "__main__":
    main()
'''


def test_models_wrapped_in_a_loop_print_the_numbers_they_printed_under_horovod(tmp_path):
    """A dict of models whose optimizers are wrapped in a loop over its keys (a real ASR trainer's
    form): each module of the loop is replicated, and the native program gives the original's
    losses and weights on both ranks."""
    result = migrated_alike(tmp_path, LOOP_PROGRAM, r"LOOP rank=\d (?:step=\d \w+ loss=\S+|final=\S+)", 18)
    assert replicated(result.source) == ["models[i][0]"] and not_native([result.source], result.findings) is None


COMPILED = '''\
import torch
import horovod.torch as hvd


def main():
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    original_model = model
    model = torch.compile(original_model)
    gen = torch.Generator().manual_seed(3 + hvd.rank())
    for step in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4, generator=gen)).pow(2).mean()
        loss.backward()
        optimizer.step()
        print(f"COMPILED rank={hvd.rank()} step={step} loss={loss.item():.6f}")
    total = sum(p.double().sum().item() for p in original_model.parameters())
    print(f"COMPILED rank={hvd.rank()} final={total:.6f}")


if __name__ == "__main__":
    main()
'''


def test_a_model_compiled_after_the_wrap_prints_the_numbers_it_printed_under_horovod(tmp_path):
    """open_clip's form: the wrap, then ``model = torch.compile(original_model)``. The compiled
    module runs the replicated one's hooks, so the native program gives the original's losses and
    weights on both ranks."""
    result = migrated_alike(tmp_path, COMPILED, r"COMPILED rank=\d (?:step=\d loss=\S+|final=\S+)", 10)
    assert replicated(result.source) == ["model"] and not_native([result.source], result.findings) is None


#: A Keras-like wrapper of the program's (its class in another module, as in
#: protein-ligand-binding-affinity's CustomModel): the optimizer gets its parameters from its own
#: method, and the program broadcasts the module it holds.
WRAPPER = textwrap.dedent('''\
    import torch.nn as nn


    class Wrapper:
        def __init__(self, extra=False):
            self.model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1))
            self.head = nn.Linear(1, 1)
            self.extra = extra

        def get_parameters(self):
            return self.model.parameters()

        def get_named_parameters(self):
            if self.extra:  # a wrapper whose parameters are not all its model's
                return list(self.model.named_parameters()) + list(self.head.named_parameters())
            return self.model.named_parameters()
    ''')

WRAPPED = '''\
import torch
import horovod.torch as hvd
from wrapper import Wrapper


def main(extra=False):
    hvd.init()
    torch.manual_seed(1)
    model = Wrapper(extra)
    optimizer = torch.optim.SGD(model.get_parameters(), lr=0.1)
    hvd.broadcast_parameters(model.model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.get_named_parameters())
    g = torch.Generator().manual_seed(7 + hvd.rank())
    for step in range(4):
        x, y = torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)
        optimizer.zero_grad()
        loss = ((model.model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        print(f"WRAP rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)


if __name__ == "__main__":
    import sys
    main(extra="--extra" in sys.argv)
'''


def test_parameters_from_a_method_of_the_program_are_taken_from_the_module_it_broadcasts():
    result = migrate_source(WRAPPED, "prog.py")
    assert not [f for f in result.findings if f.kind is Kind.TODO], result.findings
    assert replicated(result.source) == ["model.model"]
    # the assumption is checked at run time, named at the line and in the report
    assert ("    if not {id(p) for _, p in model.get_named_parameters()} <= {id(p) for p in model.model.parameters()}:"
            "  # named_parameters=model.get_named_parameters(), taken to be model.model's\n"
            '        raise RuntimeError("model.get_named_parameters() holds parameters outside model.model, which '
            'replicate() averages")\n') in result.source
    assert "taken to be `model.model`'s parameters (the module the program broadcasts), checked at run time" \
        in optimizer_note(result)


@pytest.mark.parametrize("change, reason", [
    # no broadcast of a module: nothing to take the parameters from
    (("    hvd.broadcast_parameters(model.model.state_dict(), root_rank=0)\n", ""),
     "`model.get_named_parameters()` is not a module's parameters() the rewriter can follow"),
    # two broadcast modules: which one is not known
    (("    hvd.broadcast_parameters(model.model.state_dict(), root_rank=0)\n",
      "    hvd.broadcast_parameters(model.model.state_dict(), root_rank=0)\n"
      "    hvd.broadcast_parameters(model.head.state_dict(), root_rank=0)\n"),
     "`model.get_named_parameters()` is not a module's parameters() the rewriter can follow"),
    # the broadcast module is not the method's owner's
    (("model.model.state_dict()", "other.state_dict()"),
     "`model.get_named_parameters()` is not a module's parameters() the rewriter can follow"),
    # no named_parameters=: the optimizer's own parameters from a method are not (name, parameter)
    # pairs the check could read, and are not taken from the broadcast
    (("hvd.DistributedOptimizer(optimizer, named_parameters=model.get_named_parameters())",
      "hvd.DistributedOptimizer(torch.optim.SGD(model.get_parameters(), lr=0.1))"),
     "`model.get_parameters()` is not a module's parameters() the rewriter can follow"),
])
def test_parameters_from_a_method_without_one_broadcast_module_of_its_owner_keep_the_todo(change, reason):
    old, new = change
    assert old in WRAPPED
    result = migrate_source(WRAPPED.replace(old, new), "prog.py")
    assert not replicated(result.source)
    assert reason in optimizer_note(result), optimizer_note(result)


def test_a_wrapper_whose_parameters_are_its_models_prints_what_it_printed_under_horovod(tmp_path):
    """Exact: every step's loss on both ranks. And where the assumption is wrong (the method also
    gives the head's parameters), the native program stops before its first step, saying so."""
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    migrated_alike(tmp_path, WRAPPED, r"WRAP rank=\d step=\d loss=\S+", 8)
    done = subprocess.run([sys.executable, str(tmp_path / "native.py"), "--extra"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0 and "WRAP" not in done.stdout
    assert "RuntimeError: model.get_named_parameters() holds parameters outside model.model, which " \
        "replicate() averages" in done.stderr, done.stderr[-2000:]


ACCUMULATING = SUM_PROGRAM.replace(", op=hvd.Sum)", ", backward_passes_per_step=2)").replace(
    '''    for step in range(5):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 1, generator=gen)
        learner.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(learner.net(x), y)
        loss.backward()
        learner.opt.step()
''', '''    learner.opt.zero_grad()
    for step in range(6):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(learner.net(x), y)
        loss.backward()
        if step % 2 == 1:
            learner.opt.step()
            learner.opt.zero_grad()
''')


def test_passes_per_step_in_place_average_every_backward_and_the_numbers_stay_up_to_rounding(tmp_path):
    """``backward_passes_per_step=2`` on a replicated module: every ``backward()`` averages (DDP
    adds the averaged gradients where Horovod averaged their sum), named at the line and in the
    report; the native program prints the original's losses and weights to 1e-5."""
    assert "backward_passes_per_step=2" in ACCUMULATING and "if step % 2 == 1:" in ACCUMULATING
    result = migrate_source(ACCUMULATING, "original.py")
    assert not_native([result.source], result.findings) is None
    assert "replicate(self.net, find_unused_parameters=True)  # DDP in place; unused parameters keep grad None " \
        "(Horovod: zeros); averages every backward() (Horovod: every 2)\n" in result.source
    assert "backward_passes_per_step=2: every backward() averages" in optimizer_note(result)
    original, native = tmp_path / "original.py", tmp_path / "native.py"
    original.write_text(ACCUMULATING)
    native.write_text(result.source)
    line = r"SUM rank=(\d) (step=\d loss|final)=(\S+)"
    want = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original))
    got = native_printed(native, 2, line)
    assert len(want) == 14 and [w[:2] for w in want] == [g[:2] for g in got], (want, got)
    assert all(abs(float(w[2]) - float(g[2])) <= 1e-5 * max(1.0, abs(float(w[2]))) for w, g in zip(want, got)), \
        (want, got)


#: A backend class of the kind libraries write (itwinai's, mlrun's): Horovod is imported where the
#: backend starts and held in an attribute; one backend imports it by name at run time.
HELD = '''\
import importlib
import torch


class HorovodBackend:
    def __init__(self, by_name=False):
        self.hvd = None
        self.by_name = by_name

    def init(self):
        if self.by_name:
            self.hvd = importlib.import_module("horovod.torch")
        else:
            import horovod.torch as hvd
            self.hvd = hvd
        self.hvd.init()

    def distributed(self, model, optimizer):
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def rank(self):
        return self.hvd.rank()

    def mean(self, value):
        return self.hvd.allreduce(torch.tensor(value)).item()


def main():
    for by_name in (False, True):
        backend = HorovodBackend(by_name)
        backend.init()
        torch.manual_seed(backend.rank())  # different weights: the broadcast must make them equal
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        model, optimizer = backend.distributed(model, optimizer)
        g = torch.Generator().manual_seed(3 + backend.rank())
        for step in range(3):
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"HELD by_name={by_name} rank={backend.rank()} step={step} "
                  f"loss={backend.mean(loss.item()):.6f}")
        print(f"HELD by_name={by_name} rank={backend.rank()} "
              f"final={sum(p.sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    main()
'''


def test_horovod_held_in_an_attribute_is_followed_and_the_backend_prints_horovods_numbers(tmp_path):
    """``self.hvd = hvd`` after a local import, and ``self.hvd =
    importlib.import_module("horovod.torch")`` beside ``self.hvd = None``: each
    ``self.hvd.NAME`` is Horovod's NAME, so the backend comes out native with its model replicated,
    and prints under the torchrun contract what it printed under horovodrun."""
    result = migrated_alike(tmp_path, HELD, r"HELD by_name=\w+ rank=\d (?:step=\d loss=\S+|final=\S+)", 16)
    assert not_native([result.source], result.findings) is None
    assert "self.hvd." not in result.source and "horovod" not in result.source.split("class HorovodBackend")[1]
    assert replicated(result.source) == ["model"]


@pytest.mark.parametrize("spoiler", [
    "        if self.hvd is None:\n            return 0\n",   # the attribute is used as an on/off flag
    "        self.hvd = object()\n",                           # it holds something else too
])
def test_an_attribute_holding_horovod_and_used_otherwise_keeps_its_todo(spoiler):
    source = HELD.replace("    def rank(self):\n", "    def rank(self):\n" + spoiler)
    result = migrate_source(source, "original.py")
    assert "self.hvd.DistributedOptimizer" in result.source
    assert any(f.kind is Kind.TODO and f.name.startswith("self.hvd.") for f in result.findings)


def test_an_attribute_followed_but_not_wholly_rewritten_stays_as_written():
    """A use the rewrite cannot take (a timeline) keeps the file on Horovod; its other uses
    would name ``hvd`` where only ``init`` binds it, so every ``self.hvd.NAME`` stays as written."""
    source = HELD.replace("        self.hvd.init()\n", "        self.hvd.init()\n        self.hvd.start_timeline('t.json')\n")
    assert "start_timeline" in source
    result = migrate_source(source, "original.py")
    assert not_native([result.source], result.findings) is not None
    assert "self.hvd.DistributedOptimizer(" in result.source and "hvd.rank()" in result.source
    tree = ast.parse(result.source)
    bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "hvd"]
    assert bare == [], bare  # no `hvd.X` outside the method that binds hvd


#: The word-language-model form: after training, the program reads a whole module back from a file
#: and tests it under the same name.
RELOADED = '''\
import os
import torch
import horovod.torch as hvd

hvd.init()
torch.manual_seed(11)
reference = torch.nn.Linear(3, 1)
best = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"best_{hvd.rank()}.pt")
torch.save(reference, best)
model = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
g = torch.Generator().manual_seed(hvd.rank())
for step in range(3):
    x, y = torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    optimizer.step()
    print(f"RELOADED rank={hvd.rank()} step={step} loss={loss.item():.6f}")
with open(best, "rb") as f:
    model = torch.load(f, weights_only=False)
print(f"RELOADED rank={hvd.rank()} test={model(torch.ones(2, 3)).sum().item():.6f}")
'''


def test_a_model_read_back_from_a_file_after_training_leaves_the_wrap_in_place(tmp_path):
    """``model = torch.load(f)`` after the loop holds new parameters, none of the optimizer's:
    Horovod did not average them and the replicated module does not run them, so the re-binding no
    longer blocks the in-place rewrite; the native program prints the original's numbers."""
    result = migrated_alike(tmp_path, RELOADED, r"RELOADED rank=\d (?:step=\d loss=\S+|test=\S+)", 8)
    assert replicated(result.source) == ["model"] and not_native([result.source], result.findings) is None
    blocked = migrate_source(RELOADED.replace("torch.load(f, weights_only=False)", "model[0]"), "original.py")
    assert any(f.kind is Kind.TODO and "re-bound at line" in f.message for f in blocked.findings)


#: Training that calls ``model.forward(x)`` (facial-segmentation's train() and test()), the model
#: passed to the functions that do.
FORWARDS = '''\
import torch
import horovod.torch as hvd


def train(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        loss = ((model.forward(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    return loss.item()


def main():
    hvd.init()
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(30 + hvd.rank())
    batches = [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(3)]
    for epoch in range(2):
        loss = train(model, optimizer, batches)
        print(f"FORWARDS rank={hvd.rank()} epoch={epoch} loss={loss:.6f} "
              f"test={[model.forward(x).sum().item() for x, _ in batches][0]:.6f}")


if __name__ == "__main__":
    main()
'''


def test_a_replicated_models_forward_calls_become_calls_of_the_module_named_at_their_lines(tmp_path):
    """``model.forward(x)`` skips the module's hooks, DDP's among them: each becomes ``model(x)``
    with a comment above its statement, and the native program prints the original's numbers."""
    result = migrated_alike(tmp_path, FORWARDS, r"FORWARDS rank=\d epoch=\d loss=\S+ test=\S+", 4)
    assert replicated(result.source) == ["model"] and not_native([result.source], result.findings) is None
    assert ".forward(" not in result.source
    assert result.source.count("# DDP: the module is called, not its forward()") == 2
    assert "loss = ((model(x) - y) ** 2).mean()" in result.source


def test_an_attribute_holding_another_librarys_module_of_the_same_name_is_left_alone():
    """``import bluefog.torch as hvd`` then ``self.comm = hvd``: the name is Horovod's usual one,
    but the module is not Horovod's, so that store stays as written (only the attribute that
    holds ``importlib.import_module("horovod.torch")`` is followed)."""
    source = textwrap.dedent('''\
        import importlib
        import bluefog.torch as hvd


        class Backend:
            def init(self):
                self.comm = hvd
                self.hvd = importlib.import_module("horovod.torch")
                self.hvd.init()
                return self.comm.size()
        ''')
    result = migrate_source(source, "original.py")
    assert "        self.comm = hvd\n" in result.source and "import bluefog.torch as hvd\n" in result.source
    assert "self.hvd.init()" not in result.source and "import horovod" not in result.source


#: CLAP's form (from open_clip's main.py): two optimizers over one model's parameter groups, each
#: wrapped in the same block, and a single one in the other branch of the run's choice.
TWO_OPTIMIZERS = '''\
import sys
import torch
import horovod.torch as hvd


def main(split):
    hvd.init()
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    if split:
        body = torch.optim.SGD(model[0].parameters(), lr=0.05, momentum=0.9)
        head = torch.optim.Adam(model[2].parameters(), lr=0.01)
        body = hvd.DistributedOptimizer(body, named_parameters=model.named_parameters())
        head = hvd.DistributedOptimizer(head, named_parameters=model.named_parameters())
        optimizers = [body, head]
    else:
        optimizers = [hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                               named_parameters=model.named_parameters())]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(50 + hvd.rank())
    for step in range(3):
        x, y = torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)
        for opt in optimizers:
            opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        for opt in optimizers:
            opt.step()
        print(f"TWO split={split} rank={hvd.rank()} step={step} loss={loss.item():.6f}")
    print(f"TWO split={split} rank={hvd.rank()} final={sum(p.sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    main(len(sys.argv) > 1)
'''


def test_two_optimizers_over_one_model_share_its_replicate_and_print_horovods_numbers(tmp_path):
    """The second wrap of a model in the same block, both with Horovod's plain average, shares the
    first's ``replicate()``; the wrap in the other branch has its own (only one branch runs). The
    native program prints the original's numbers either way. Before, each wrap redirected the
    model's forward calls to its own DDP module, the last one's in the other branch."""
    result = migrate_source(TWO_OPTIMIZERS, "original.py")
    assert not_native([result.source], result.findings) is None
    assert result.source.count("replicate(model, ") == 2 and "DDP(" not in result.source
    original, native = tmp_path / "original.py", tmp_path / "native.py"
    original.write_text(TWO_OPTIMIZERS)
    native.write_text(result.source)
    line = r"TWO split=\w+ rank=\d (?:step=\d loss=\S+|final=\S+)"
    for argv in ((), ("split",)):
        want = printed(tmp_path, line, *HOROVODRUN, "2", sys.executable, str(original), *argv)
        assert len(want) == 8 and native_printed(native, 2, line, argv=argv) == want


SAVED_PROGRAM = '''\
import os
import torch
import horovod.torch as hvd


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x, scale=1.0):
        return self.head(torch.tanh(self.body(x)) * scale)


def main(path):
    def save_checkpoint(net, where):
        torch.save(net, where)  # the whole module

    def evaluate(epoch):
        if hvd.rank() == 0:
            save_checkpoint(model, os.path.join(path, f"net{hvd.rank()}.pt"))

    hvd.init()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    data = torch.Generator().manual_seed(hvd.rank())
    for step in range(4):
        x = torch.randn(8, 4, generator=data)
        loss = (model(x, scale=0.5) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"SAVED rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
        evaluate(step)
    weights = model.parameters()
    if hvd.rank() == 0:  # the checkpoint, read back
        weights = torch.load(os.path.join(path, "net0.pt"), weights_only=False).parameters()
    print(f"SAVED rank={hvd.rank()} final={sum(p.sum().item() for p in weights):.6f}", flush=True)


main(os.path.dirname(os.path.abspath(__file__)))
'''


def test_a_model_saved_whole_by_a_function_of_the_file_gets_ddp_with_unused_parameters(tmp_path):
    """`save_checkpoint(model, where)`, a function of the file that only torch.save()s the module,
    runs no forward pass: the DDP wrap stays provable (torch.save of the module DDP wraps works,
    of a replicated one it does not). The forward takes a keyword, so every parameter's gradient
    is not proven: the wrap gets find_unused_parameters=True, named at the line and in the
    report. The native program prints the original's losses and rank 0's saved weights."""
    result = migrated_alike(tmp_path, SAVED_PROGRAM, r"SAVED rank=\d (?:step=\d loss=\S+|final=\S+)", 10)
    assert not_native([result.source], result.findings) is None
    assert ("ddp_model = DDP(model, forward_sync_buffers=False, find_unused_parameters=True)  # unused "
            "parameters keep grad None (Horovod: zeros)\n") in result.source
    assert "save_checkpoint(model, " in result.source and "replicate" not in result.source
    notes = [f.message for f in result.findings if f.name == "hvd.DistributedOptimizer"]
    assert any("find_unused_parameters=True" in n and "not made in place: the whole module `model` (as `net`, a parameter it is passed to) is pickled"
               in n for n in notes), notes


@pytest.mark.parametrize("callee", [
    "net(where)",  # a forward pass outside the wrapper
    "net.forward(where)",
    "keep.append(net)",  # handed on where the rewriter cannot see
])
def test_a_function_that_may_run_the_model_keeps_ddp_unproven(callee):
    """The same function running or handing on the module: no DDP wrap (the module is made
    data-parallel in place instead, as nothing pickles it now)."""
    program = SAVED_PROGRAM.replace("torch.save(net, where)  # the whole module", callee)
    result = migrate_source(program, "original.py")
    assert "= DDP(" not in result.source and replicated(result.source) == ["model"]


GROUPS_PROGRAM = '''\
import torch
import horovod.torch as hvd


class Generator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(3, 3)
        self.style = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.body(x) + self.style(x)


hvd.init()
torch.manual_seed(0)
generator = Generator()
optimizer = torch.optim.SGD(generator.body.parameters(), lr=0.1)
optimizer.add_param_group({"params": generator.style.parameters(), "lr": 0.01})
hvd.broadcast_parameters(generator.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=generator.named_parameters())
data = torch.Generator().manual_seed(hvd.rank())
for step in range(3):
    x = torch.randn(4, 3, generator=data)
    loss = generator(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"GROUPS rank={hvd.rank()} step={step} loss={loss.item():.6f}", flush=True)
print(f"GROUPS rank={hvd.rank()} final={sum(p.sum().item() for p in generator.parameters()):.6f}", flush=True)
'''


def test_a_group_added_to_the_optimizer_gets_horovods_check_of_named_parameters(tmp_path):
    """``optimizer.add_param_group(...)`` before the wrap: Horovod refused a parameter of the
    optimizer that named_parameters does not name (a ValueError at the wrap), and the native wrap
    would leave it unaveraged, so the check goes before the wrap. Where every group is of the
    named module, the native program prints the original's numbers; where one is not (a group
    of another module, as in style-based-gan-pytorch's), the check raises Horovod's error."""
    result = migrated_alike(tmp_path, GROUPS_PROGRAM, r"GROUPS rank=\d (?:step=\d loss=\S+|final=\S+)", 8)
    check = [line for line in result.source.splitlines(keepends=True) if "param_groups" in line or "raise" in line]
    assert len(check) == 2 and check[0].startswith("if {id(p) for group in optimizer.param_groups"), check
    notes = [f.message for f in result.findings if f.name == "hvd.DistributedOptimizer"]
    assert any("a check stops the program, as Horovod did" in n for n in notes), notes
    # the same check on a group of another module: Horovod's error
    import torch

    body, style = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(body.parameters(), lr=0.1)
    optimizer.add_param_group({"params": style.parameters()})
    with pytest.raises(ValueError, match="one or more model parameters were not named"):
        exec("".join(check), {"optimizer": optimizer, "generator": body})
    result = migrate_source(GROUPS_PROGRAM.replace("optimizer.add_param_group", "optimizer.zero_grad()\n#"),
                            "original.py")
    assert "param_groups" not in result.source  # no group added: no check


FOLDS_PROGRAM = '''\
import torch
import horovod.torch as hvd

FP16_ALLREDUCE = False
USE_ADASUM = False

hvd.init()
for fold in [0, 1]:
    torch.manual_seed(fold)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = hvd.Compression.fp16 if FP16_ALLREDUCE else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if USE_ADASUM else hvd.Sum)
    gen = torch.Generator().manual_seed(5 + hvd.rank())
    for step in range(3):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 1, generator=gen)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"FOLD rank={hvd.rank()} fold={fold} step={step} loss={loss.item():.6f}")
    total = sum(p.double().sum().item() for p in model.parameters())
    print(f"FOLD rank={hvd.rank()} fold={fold} final={total:.6f}")
'''


def test_a_fold_loop_that_builds_its_model_and_chooses_sum_or_adasum_keeps_the_numbers(tmp_path):
    """A k-fold script (a real ImageNet trainer's form): each turn of the loop builds its model, and
    the wrap chooses ``op=hvd.Adasum if ... else hvd.Sum`` with a compression held in a variable.
    Each turn's module is replicated (a new one each turn); the Sum branch registers the comm hook
    that sums, wrapped for fp16 when the variable holds DDP's fp16 hook; the Adasum branch is
    averaged and named at the line. On the Sum branch the native program prints the original's
    losses and weights on both ranks."""
    result = migrated_alike(tmp_path, FOLDS_PROGRAM, r"FOLD rank=\d fold=\d (?:step=\d loss=\S+|final=\S+)", 16)
    assert replicated(result.source) == ["model"] and not_native([result.source], result.findings) is None
    assert "Horovod: Adasum when USE_ADASUM; DDP averages" in result.source
    assert ("if not USE_ADASUM:\n        model.register_comm_hook(None, default_hooks.fp16_compress_wrapper("
            "_native_sum_gradients) if compression is not None else _native_sum_gradients)") in result.source
    assert ("    elif compression is not None:\n"
            "        model.register_comm_hook(None, default_hooks.fp16_compress_hook)\n") in result.source


def test_a_loop_whose_model_is_built_before_it_still_refuses_the_wrap():
    """The same loop with the model built once, before it: the second turn would replicate the
    same module again (replicate() refuses that), so the wrap keeps its reason."""
    program = FOLDS_PROGRAM.replace(
        "for fold in [0, 1]:\n    torch.manual_seed(fold)\n    model = torch.nn.Sequential(",
        "model = torch.nn.Sequential(").replace(
        "torch.nn.Linear(8, 1))\n", "torch.nn.Linear(8, 1))\nfor fold in [0, 1]:\n", 1)
    assert program != FOLDS_PROGRAM and "for fold" in program
    result = migrate_source(program, "original.py")
    todos = [f.message for f in result.findings if f.kind is Kind.TODO and f.name == "hvd.DistributedOptimizer"]
    assert todos and "replicate() makes a module data-parallel only once" in todos[0], todos


REGIME_PROGRAM = '''\
import torch
import horovod.torch as hvd


class Regime:
    """A library's optimizer holder: every Horovod option comes from its caller."""

    def __init__(self, model, compression, reduction, passes=1):
        self.compression, self.reduction = compression, reduction
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        self.optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                  compression=self.compression, op=self.reduction,
                                                  backward_passes_per_step=passes)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def main():
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    regime = Regime(model, hvd.Compression.none, hvd.Sum)
    gen = torch.Generator().manual_seed(7 + hvd.rank())
    for step in range(4):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 1, generator=gen)
        regime.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        regime.optimizer.step()
        print(f"REGIME rank={hvd.rank()} step={step} loss={loss.item():.6f}")
    total = sum(p.double().sum().item() for p in model.parameters())
    print(f"REGIME rank={hvd.rank()} final={total:.6f}")


if __name__ == "__main__":
    main()
'''


def test_options_from_the_caller_become_hooks_chosen_by_their_values(tmp_path):
    """A library class whose compression and op come from its caller (a continual-learning
    library's form): in a native file they hold DDP's fp16 hook or None and "average", "sum" or
    "adasum", so the replicated module gets the summing hook when the op is "sum", fp16 when the
    compression is set, and Adasum is named at the line. With the caller's ``hvd.Sum`` the native
    program prints the original's losses and weights on both ranks."""
    result = migrated_alike(tmp_path, REGIME_PROGRAM, r"REGIME rank=\d (?:step=\d loss=\S+|final=\S+)", 10)
    assert replicated(result.source) == ["model"] and not_native([result.source], result.findings) is None
    assert "Regime(model, None, \"sum\")" in result.source
    assert 'Horovod: Adasum when self.reduction == "adasum"; DDP averages' in result.source
    assert 'if self.reduction == "sum":\n' in result.source
    assert "elif self.compression is not None:\n" in result.source
