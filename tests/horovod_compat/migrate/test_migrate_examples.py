"""End to end: the worked examples in migration_guide/examples, rewritten and run natively.

For every example: the rewriter's output equals the committed train_ddp.py and imports no Horovod;
the rewritten script, run on 2 ranks under the torchrun contract, prints the golden per-step trace
(expected_output.txt); the golden trace itself equals a single-process simulation of Horovod's
semantics (so it is not just "whatever DDP printed"); and the unchanged Horovod script run the
same way on the hvd shim prints the same trace. A rewritten example started as one plain process
(`python train_ddp.py`, no launcher) runs alone, as Horovod did, and prints the one-rank trace.
"""
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distributor.rank_env import TORCHRUN_VARS
from horovod_compat.migrate import Kind, migrate_source
from warm import run_script_warm

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "migration_guide" / "examples"
NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "train_horovod.py").is_file())
HELPERS_SCRIPT = Path(__file__).parent / "e2e" / "helpers_horovod.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run_torchrun_script(script: Path, timeout: float = 120, env=None) -> str:
    """Run `script`, written for torchrun, on 2 local ranks under the torchrun contract (our engine's
    script mode, its ranks forked warm: tests/warm.py); return rank 0's stdout. A failing rank raises with its
    traceback. Unlike plain torchrun, ranks leave without the interpreter's teardown, where gloo's
    threads sometimes abort (SIGABRT) after a script has already succeeded."""
    lines = []

    def keep_rank0_stdout(rank, stream, line):
        if rank == 0 and stream == "stdout":
            lines.append(line)

    run_script_warm(str(script), num_processes=2, env={"OMP_NUM_THREADS": "1", **(env or {})},
               timeout=timeout, output=keep_rank0_stdout)
    return "\n".join(lines) + "\n"


def _trace(stdout: str):
    return [line for line in stdout.splitlines() if line.startswith("step ")]


def assert_same_trace(actual, expected, rel=1e-5):
    assert len(actual) == len(expected) and expected, (actual, expected)
    number = re.compile(r"-?\d+(?:\.\d+)?")
    for got, want in zip(actual, expected):
        assert number.sub("#", got) == number.sub("#", want), (got, want)
        for a, b in zip(number.findall(got), number.findall(want)):
            assert float(a) == pytest.approx(float(b), rel=rel, abs=1e-6), (got, want)


def _no_horovod(source: str) -> None:
    """No Horovod/sparkdl import and no `hvd` name anywhere in the code (docstrings may say hvd)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] in ("horovod", "sparkdl") for a in node.names)
        if isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in ("horovod", "sparkdl")
        if isinstance(node, ast.Name):
            assert node.id != "hvd"


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    """The examples folder rewritten by one run of the CLI into a temporary directory (one
    interpreter and one libcst import for all of them, not one per example); returns the folder
    in which each example's rewritten train_horovod.py is ``NAME.py``. Every file must come out
    native: the report's table says so per file (the committed train_ddp.py files, already native,
    pass through unchanged)."""
    out = tmp_path_factory.mktemp("rewritten")
    proc = subprocess.run([sys.executable, "-m", "horovod_compat.migrate", str(EXAMPLES), "-o", str(out / "tree")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "0 TODO(s)" in proc.stderr
    rows = {line.split()[0]: line for line in proc.stderr.splitlines() if line.startswith(str(EXAMPLES))}
    for name in NAMES:
        source = EXAMPLES / name / "train_horovod.py"
        assert rows[str(source)].endswith("  native"), proc.stderr
        (out / f"{name}.py").write_text((out / "tree" / name / "train_horovod.py").read_text())
    return out


@pytest.mark.parametrize("name", NAMES)
def test_rewrite_equals_committed_ddp_and_imports_no_horovod(name, rewritten):
    result = migrate_source((EXAMPLES / name / "train_horovod.py").read_text(), "train_horovod.py")
    assert not [f for f in result.findings if f.kind is Kind.TODO]
    committed = (EXAMPLES / name / "train_ddp.py").read_text()
    assert result.source == committed == (rewritten / f"{name}.py").read_text()
    _no_horovod(committed)


@pytest.mark.parametrize("name", NAMES)
def test_rewritten_example_runs_natively_with_the_golden_trace(name, rewritten):
    stdout = run_torchrun_script(rewritten / f"{name}.py")
    expected = (EXAMPLES / name / "expected_output.txt").read_text().splitlines()
    assert_same_trace(_trace(stdout), expected)


def _simulate():
    spec = importlib.util.spec_from_file_location("migrate_e2e_simulate", Path(__file__).parent / "e2e" / "simulate.py")
    simulate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(simulate)
    return simulate


def test_rewritten_example_runs_as_one_plain_process(rewritten):
    """`python train_ddp.py` with no launcher (no RANK, ...) runs as rank 0 of 1, as the Horovod
    original did without horovodrun, and prints the one-rank trace. The same file on 2 ranks under
    the torchrun contract: test_rewritten_example_runs_natively_with_the_golden_trace (a migrated
    program under real torchrun: test_migrate_safety's exit test)."""
    env = {k: v for k, v in ENV.items() if k not in TORCHRUN_VARS}
    proc = subprocess.run([sys.executable, str(rewritten / "basic_training.py")], cwd=rewritten,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_trace(proc.stdout)) == 16  # the whole data set on one rank: twice the steps of 2
    assert_same_trace(_trace(proc.stdout), _simulate().basic_training(ranks=1), rel=1e-4)
    # under mpirun (here: its variable alone) a process must not train alone as rank 0 of 1:
    # init_process_group names what is missing
    proc = subprocess.run([sys.executable, str(rewritten / "basic_training.py")], cwd=rewritten,
                          env=dict(env, OMPI_COMM_WORLD_RANK="0"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and _trace(proc.stdout) == [], proc.stdout[-2000:]
    assert "environment variable RANK expected, but not set" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("name", NAMES)
def test_golden_trace_matches_a_single_process_simulation_of_horovod(name):
    expected = (EXAMPLES / name / "expected_output.txt").read_text().splitlines()
    assert_same_trace(_simulate().SIMULATIONS[name](), expected, rel=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_unchanged_horovod_example_on_the_shim_prints_the_same_trace(name):
    stdout = run_torchrun_script(EXAMPLES / name / "train_horovod.py")
    expected = (EXAMPLES / name / "expected_output.txt").read_text().splitlines()
    assert_same_trace(_trace(stdout), expected)


def test_rewritten_helpers_keep_horovod_semantics(tmp_path):
    result = migrate_source(HELPERS_SCRIPT.read_text(), "helpers_horovod.py")
    assert not [f for f in result.findings if f.kind is Kind.TODO]
    _no_horovod(result.source)
    script = tmp_path / "helpers_native.py"
    script.write_text(result.source)
    stdout = run_torchrun_script(script)
    assert "rank 0: helpers ok" in stdout


def test_helper_expectations_hold_on_the_shim(tmp_path):
    stdout = run_torchrun_script(HELPERS_SCRIPT)
    assert "rank 0: helpers ok" in stdout


def test_guide_recipes_behave_as_documented(tmp_path):
    """migration_guide/recipes.py: unequal-size allgather, no_sync accumulation, profiler trace."""
    env = {"RECIPES_DIR": str(ROOT / "migration_guide"), "TRACE_DIR": str(tmp_path)}
    stdout = run_torchrun_script(Path(__file__).parent / "e2e" / "recipes_check.py", env=env)
    assert "rank 0: recipes ok" in stdout
    assert (tmp_path / "trace_rank0.json").is_file()
