"""rules/gradient_reads.py: where each gradient read sits relative to backward() and step()."""
import textwrap

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from horovod_compat.migrate.context import without_comments
from horovod_compat.migrate.rules.gradient_reads import Where, gradient_reads


def placed(source: str):
    source = textwrap.dedent(source)
    wrapper = MetadataWrapper(cst.parse_module(source))
    resolved = wrapper.resolve_many([PositionProvider, ParentNodeProvider])
    return [(read.text, read.where) for read in
            gradient_reads(without_comments(source), resolved[PositionProvider], resolved[ParentNodeProvider])]


LOOP = """\
def train(model, optimizer, scheduler, batches):
    for x in batches:
        optimizer.zero_grad()
        model(x).sum().backward()
        {before}
        optimizer.step()
        {after}
"""


@pytest.mark.parametrize("before, after, want", [
    ("clip_grad_norm_(model.parameters(), 1.0)", "pass", [("clip_grad_norm_", Where.BETWEEN)]),
    ("pass", "norm = model.weight.grad.norm()", [(".grad", Where.AFTER_STEP)]),
    # a scheduler's step is not the optimizer's: the read is still before the optimizer steps
    ("scheduler.step()\n        g = model.weight.grad", "pass", [(".grad", Where.BETWEEN)]),
    # torch.autograd.grad is a function, not a read of .grad
    ("pass", "d = torch.autograd.grad(y, x)", []),
    # a comment is not a read, nor an import or a setting named after the function (ffvqgan's)
    ("# clip_grad_norm_(model.parameters(), 1.0)", "pass", []),
    ("from torch.nn.utils import clip_grad_norm_", "clip_grad_norm = config.get('clip_grad_norm')", []),
])
def test_a_read_in_the_training_loop(before, after, want):
    assert placed(LOOP.format(before=before, after=after)) == want


def test_a_read_after_the_loop_that_steps_is_after_a_step():
    assert placed("""
        def train(model, optimizer, x):
            for _ in range(3):
                model(x).sum().backward()
                optimizer.step()
            assert all(p.grad is not None for p in model.parameters())
    """) == [(".grad", Where.AFTER_STEP)]


def test_a_method_is_placed_where_it_is_called():
    after = placed("""
        class Trainer:
            def fit(self, x):
                self.model(x).sum().backward()
                self.optimizer.step()
                if self.verbose:
                    self.log_gradients()

            def log_gradients(self):
                print([p.grad.norm() for p in self.model.parameters()])
    """)
    between = placed("""
        class Trainer:
            def fit(self, x):
                self.model(x).sum().backward()
                self.clip()
                self.optimizer.step()

            def clip(self):
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    """)
    assert after == [(".grad", Where.AFTER_STEP)] and between == [("clip_grad_norm_", Where.BETWEEN)]


@pytest.mark.parametrize("source", [
    # never called in this file: a caller elsewhere may call it at any time
    """
    def clip(model):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """,
    # passed as a value (a callback): called from where the rewriter cannot follow
    """
    class Trainer:
        def fit(self, x):
            self.model(x).sum().backward()
            self.optimizer.step()
            self.clip()
            self.hooks.append(self.clip)

        def clip(self):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    """,
    # called once before the step and once after: the earlier call decides, and one of the
    # callers cannot be placed
    """
    def clip(model):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def train(model, optimizer, x):
        model(x).sum().backward()
        optimizer.step()
        clip(model)

    def evaluate(model):
        clip(model)
    """,
])
def test_a_read_that_cannot_be_placed(source):
    assert [where for _, where in placed(source)] == [Where.UNPROVEN]


def test_reads_inside_an_optimizer_class_are_not_counted():
    assert placed("""
        class Clipped(torch.optim.SGD):
            def step(self, closure=None):
                torch.nn.utils.clip_grad_norm_(self.param_groups[0]["params"], 1.0)
                return super().step(closure)
    """) == []
