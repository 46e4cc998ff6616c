"""The rewriter on programs written the way real projects write them (corpus/: 73 training
programs of our own, in research, library-integration and domain styles, written without reading
the rewriter; the d*, u* and then v* dozens came last, each measured before any change for it:
migration_guide/rewriter.md): every one comes out native -- those of EMULATED with ``--emulate``,
their optimizer's model being one torch's data parallelism cannot take (by default it keeps a TODO
that says so), and PARTIAL's stay partly on Horovod with a TODO that says what is left -- parses on
Python 3.9, is a fixed point, and keeps its meaning: the output under the torchrun contract prints
the losses and final weights the original printed under horovodrun, on 2 CPU ranks (the
representative set below in every run; every program with HOROVOD_COMPAT_CORPUS_ALL=1).

Each program prints ``CORPUS rank=R step=S loss=L`` per optimizer step and ``CORPUS rank=R
final=F`` (the sum of its weights) at the end.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from horovod_compat.migrate import Kind, migrate_source, torch_api
from horovod_compat.migrate.cli import not_native
from migrate_runs import HOROVODRUN, native_printed, printed
from tiers import CI

CORPUS = Path(__file__).parent / "corpus"
PROGRAMS = sorted(p.name for p in CORPUS.glob("*.py"))
LINE = r"CORPUS rank=\d+ (?:step=\d+ loss=-?\d+\.\d+|final=-?\d+\.\d+)"

#: Run side by side in every run: one of each kind of rewrite the corpus needs.
REPRESENTATIVE = [
    "a01_trainer_class.py",         # optimizer on an attribute -> replicate(self.model) in place
    "a03_example_flags.py",         # fp16 / Adasum / passes chosen by flags at run time
    "a06_grad_accum.py",            # backward_passes_per_step -> DDP + no_sync()
    "a07_gan.py",                   # two models, two optimizers, prefixed names
    "a08_checkpoint_resume.py",     # resume: optimizer state broadcast after a load
    "a12_multitask_heads.py",       # a head without gradient on odd steps (DDP would refuse; the
    #                                 same named difference as d03_moe_top1.py's experts)
    "b03_optional_horovod.py",      # try/except import, state broadcast before the wrap
    "b07_elastic_state.py",         # hvd.elastic.run + TorchState
    "b08_async_metrics.py",         # allreduce_async / poll / synchronize
    "b09_uneven_join.py",           # uneven batches + hvd.join() -> the loop under DDP's Join
    "b11_reduce_op_table.py",       # reduce ops kept in a table
    "b12_process_sets.py",          # add_process_set / process_set= / remove_process_set
    "c04_optim_factory.py",         # DistributedOptimizer(opt, **kwargs)
    "c12_simclr_allgather.py",      # differentiable allgather inside the loss
    "d05_finetune_frozen.py",       # frozen backbone, two LR groups, 2 passes per step
    "u03_model_passed.py",          # `import horovod.torch` used as horovod.torch.NAME
    "v01_hf_trainer.py",            # synchronize()/skip_synchronize() on the optimizer under another name
    "v12_backend_abstraction.py",   # partial: the module stored on self._hvd (imports at module level)
    "v13_clip_no_synchronize.py",   # clips after backward() without synchronize(): a named difference
]


#: The programs whose DistributedOptimizer torch's data parallelism cannot take (neither DDP nor
#: replicate() in place), and why: native only with --emulate (_native_distributed_optimizer).
EMULATED = {
    "c04_optim_factory.py": "the options come as **kwargs",
}


#: Programs that stay partly on Horovod, and why: the output keeps running where the original did
#: (the equivalence test runs it as it runs the native ones) and a TODO names what is left.
PARTIAL = {
    "v12_backend_abstraction.py": "the module is stored on `self._hvd` and called through it",
}


def test_the_corpus_is_what_the_docstring_says():
    assert len(PROGRAMS) >= 73 and set(REPRESENTATIVE) | set(EMULATED) | set(PARTIAL) <= set(PROGRAMS)
    assert set(CI_LONG_ROUND_ONLY) <= set(REPRESENTATIVE)


@pytest.fixture(scope="module")
def rewritten():
    """Each program as the CLI writes it: by default, and with --emulate for EMULATED."""
    return {name: migrate_source((CORPUS / name).read_text(), name, emulate=name in EMULATED)
            for name in PROGRAMS}


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_a_partial_program_says_what_is_left(name, rewritten):
    result = rewritten[name]
    todos = [f.message for f in result.findings if f.kind is Kind.TODO]
    assert todos and not_native([result.source], result.findings) is not None
    ast.parse(result.source, feature_version=(3, 9))
    assert migrate_source(result.source, name).source == result.source


@pytest.mark.parametrize("name", [p for p in PROGRAMS if p not in PARTIAL])
def test_every_program_comes_out_native(name, rewritten):
    result = rewritten[name]
    todos = [f"{f.line}: {f.name}: {f.message}" for f in result.findings if f.kind is Kind.TODO]
    assert not todos, todos
    assert not_native([result.source], result.findings) is None
    ast.parse(result.source, feature_version=(3, 9))
    # a re-run changes nothing
    assert migrate_source(result.source, name, emulate=name in EMULATED).source == result.source
    assert ("_native_distributed_optimizer(" in result.source) == (name in EMULATED)


@pytest.mark.parametrize("name", sorted(EMULATED))
def test_without_emulate_the_optimizer_keeps_a_todo_that_says_why_and_names_the_option(name):
    """The default never writes the emulation: the DistributedOptimizer stays, with a TODO that
    says why torch's data parallelism cannot take it and that --emulate would."""
    result = migrate_source((CORPUS / name).read_text(), name)
    assert "_native_distributed_optimizer(" not in result.source
    todos = [f for f in result.findings if f.kind is Kind.TODO and f.name == "hvd.DistributedOptimizer"]
    assert todos, [f"{f.line}: {f.name}: {f.message}" for f in result.findings if f.kind is Kind.TODO]
    assert all("--emulate" in f.message for f in todos), [f.message for f in todos]


GUIDE = Path(__file__).resolve().parents[3] / "migration_guide" / "torch_apis.md"


def test_the_outputs_use_only_torch_apis_the_guide_lists(rewritten):
    """Every API of torch_api.USED is in the guide's table with its release; every
    ``dist.X``, DDP-module method and replicate() that a corpus output uses is on the page; and
    the outputs do use the APIs the table is about (so the check is not vacuous)."""
    page = GUIDE.read_text()
    for api, _, version in torch_api.USED:
        assert f"| `{api}` | {version} |" in page, api
    used = set()
    for result in rewritten.values():
        source = result.source
        used |= set(re.findall(r"\bdist\.(\w+)", source))
        used |= set(re.findall(r"\bddp_\w+\.(\w+)\(", source))
        used |= {api for api, pattern, _ in torch_api.USED if re.search(pattern, source, re.M)}
    missing = sorted(name for name in used if f"`{name}`" not in page)
    assert not missing, f"used by the corpus's outputs, not in {GUIDE.name}: {missing}"
    assert {"torch.distributed._composable.replicate", "DDP(forward_sync_buffers=...)",
            "all_reduce", "no_sync"} <= used


#: Representative programs whose run CI leaves to the long round (without CI=true), and the CI
#: test that runs the same rewrite against the original.
CI_LONG_ROUND_ONLY = {
    "a01_trainer_class.py": "test_migrate_inplace.py's replicated trainer (replicate(self.model))",
    "b07_elastic_state.py": "test_migrate_upstream.py's elastic MNIST (hvd.elastic.run + TorchState)",
    "b09_uneven_join.py": "test_migrate_join.py's uneven batches (the loop under DDP's Join)",
}


def _equivalence_set():
    if os.environ.get("HOROVOD_COMPAT_CORPUS_ALL") == "1":
        return PROGRAMS
    return [pytest.param(name, marks=pytest.mark.skipif(CI and name in CI_LONG_ROUND_ONLY, reason=(
        f"the long round's: CI runs this rewrite in {CI_LONG_ROUND_ONLY.get(name)}")))
        for name in REPRESENTATIVE]


#: Horovod's behaviour for a parameter that no rank used in a step (it averaged a zero gradient,
#: so momentum and weight decay still moved it), put back by the test in front of a native
#: program: DDP in place leaves that parameter's grad None, the difference the output names at
#: its replicate() line (migration_guide/differences.md).
HOROVOD_ZERO_FILL = """\
import torch.optim.optimizer as _optimizer  # (the test's, not the rewriter's: Horovod's zero gradients put back)
def _horovod_zero_fill(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = p.new_zeros(p.shape)
_optimizer.register_optimizer_step_pre_hook(_horovod_zero_fill)
"""

#: Programs with parameters that get no gradient in some steps, and so a named difference.
UNUSED_PARAMETERS = {"a12_multitask_heads.py", "d03_moe_top1.py"}


#: Programs that read gradients after backward() and before step() without synchronize(), and the
#: same lines written the way Horovod's docs ask (synchronize() first, then the step under
#: skip_synchronize()): under DDP the read sees averaged gradients, which is what that form gives
#: under Horovod; the output names the difference at the line (migration_guide/differences.md).
CLIPPED_UNSYNCHRONIZED = {
    "v13_clip_no_synchronize.py": (
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.clip)\n"
        "            optimizer.step()\n",
        "            optimizer.synchronize()\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.clip)\n"
        "            with optimizer.skip_synchronize():\n"
        "                optimizer.step()\n"),
}


def _with_prelude(source: str, prelude: str) -> str:
    """`source` with `prelude` after its docstring and ``from __future__`` imports."""
    body = ast.parse(source).body
    first = next(i for i, node in enumerate(body) if not (
        (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        or (isinstance(node, ast.ImportFrom) and node.module == "__future__")))
    lines = source.splitlines(keepends=True)
    at = body[first].lineno - 1
    return "".join(lines[:at]) + prelude + "".join(lines[at:])


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """One directory per side for the whole module, emptied before each program: a side's
    environment (CORPUS_TMP, ELASTIC_CHECKPOINT) is then the same for every program, so all of
    them fork from one warm server per side (tests/warm.py) instead of starting two per program,
    each importing torch. The programs run one after another (one worker takes the file)."""
    root = tmp_path_factory.mktemp("corpus_sides")
    paths = {side: root / side for side in ("original", "native", "as_written")}

    def fresh():
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
        return paths
    return fresh


def _side_env(path: Path) -> dict:
    return {"CORPUS_TMP": str(path), "ELASTIC_CHECKPOINT": str(path / "elastic.pt")}


@pytest.mark.parametrize("name", _equivalence_set())
def test_the_native_program_prints_the_original_numbers(name, rewritten, sides, tmp_path):
    """Exact: the same losses and final weights, to the 6 printed decimals, on every rank. For a
    program of UNUSED_PARAMETERS: the output names the difference, runs as written, and gives the
    original's numbers exactly once Horovod's zero gradients are put back in front of it. For one
    of CLIPPED_UNSYNCHRONIZED: the output names the difference, and prints exactly what the
    original prints once written the way Horovod's docs ask, not what it prints as written."""
    native = tmp_path / f"native_{name}"
    source = rewritten[name].source
    side = sides()  # files (checkpoints) each side writes, apart
    original = CORPUS / name
    if name in CLIPPED_UNSYNCHRONIZED:
        assert "# DDP: the gradients are averaged here already (Horovod, without synchronize(): not yet)" in source
        as_written = printed(tmp_path, LINE, *HOROVODRUN, "2", sys.executable, str(original),
                             env=_side_env(side["as_written"]))
        read, documented = CLIPPED_UNSYNCHRONIZED[name]
        assert read in original.read_text()
        original = tmp_path / f"documented_{name}"
        original.write_text((CORPUS / name).read_text().replace(read, documented))
    if name in UNUSED_PARAMETERS:
        assert "unused parameters keep grad None (Horovod: zeros)" in source
        native.write_text(source)
        as_written = native_printed(native, 2, LINE, env=_side_env(side["as_written"]))
        assert sum("final=" in line for line in as_written) == 2 and len(as_written) > 2, as_written
        source = _with_prelude(source, HOROVOD_ZERO_FILL)
    native.write_text(source)
    want = printed(tmp_path, LINE, *HOROVODRUN, "2", sys.executable, str(original),
                   env=_side_env(side["original"]))
    assert sum("final=" in line for line in want) == 2 and len(want) > 2, want
    assert native_printed(native, 2, LINE, env=_side_env(side["native"])) == want
    if name in CLIPPED_UNSYNCHRONIZED:  # the difference is real
        assert as_written != want
        print("\n".join(line for line in as_written + want if "final=" in line))


def test_adasum_becomes_averaging_named_at_the_wrap_and_measured(tmp_path):
    """DDP has no Adasum: a run that chose it (``--use-adasum``) trains with averaging, and the
    wrap's line and the report say so. Measured: the native program prints exactly what the
    original prints with ``hvd.Adasum`` replaced by ``hvd.Average`` (averaging is the only change),
    and not what the original prints with Adasum (the difference is real:
    migration_guide/differences.md)."""
    name = "c05_adasum_option.py"
    original = (CORPUS / name).read_text()
    result = migrate_source(original, name)
    assert "# Horovod: Adasum when args.use_adasum; DDP averages" in result.source
    assert any("op=hvd.Adasum (the branch taken when args.use_adasum) -> averaged" in f.message
               for f in result.findings if f.kind is Kind.REWRITE), [f.message for f in result.findings]
    native = tmp_path / "native.py"
    native.write_text(result.source)
    averaged = tmp_path / "averaged.py"
    averaged.write_text(original.replace("op=hvd.Adasum if", "op=hvd.Average if"))
    env = {"CORPUS_TMP": str(tmp_path)}
    adasum = printed(tmp_path, LINE, *HOROVODRUN, "2", sys.executable, str(CORPUS / name), "--use-adasum", env=env)
    average = printed(tmp_path, LINE, *HOROVODRUN, "2", sys.executable, str(averaged), "--use-adasum", env=env)
    assert sum("final=" in line for line in average) == 2 and len(average) > 2, average
    assert native_printed(native, 2, LINE, env=env, argv=["--use-adasum"]) == average
    assert adasum != average
    print("\n".join(line for line in adasum + average if "final=" in line))
