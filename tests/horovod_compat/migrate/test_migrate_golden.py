"""One golden-file test per rewrite rule family: golden/<rule>/input.py -> expected.py.

expected_todos.txt lists the TODO findings (``line: name``) the rewriter must report.  A case
with a file ``emulate`` (which says why) is rewritten as ``--emulate`` does: its input has a
DistributedOptimizer that torch's data parallelism cannot take, and the case is about what the
rest of a native file becomes.  To regenerate after a deliberate change, run with
MIGRATE_GOLDEN_UPDATE=1 and review the diff.
"""
import os
from pathlib import Path

import pytest

from horovod_compat.migrate import Kind, migrate_source
from horovod_compat.migrate.report import TODO_MARKER

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "input.py").is_file())


def _migrate(case: str, name: str):
    folder = GOLDEN / case
    return migrate_source((folder / name).read_text(), name, emulate=(folder / "emulate").is_file())


def _todos(result):
    return [f"{f.line}: {f.name}" for f in result.findings if f.kind is Kind.TODO]


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    folder = GOLDEN / case
    result = _migrate(case, "input.py")
    if os.environ.get("MIGRATE_GOLDEN_UPDATE"):
        (folder / "expected.py").write_text(result.source)
        (folder / "expected_todos.txt").write_text("".join(t + "\n" for t in _todos(result)))
    assert result.source == (folder / "expected.py").read_text()
    assert _todos(result) == (folder / "expected_todos.txt").read_text().splitlines()
    compile(result.source, f"{case}/expected.py", "exec")
    # Every reported TODO is also a comment in the output, and nothing else is one.
    assert result.source.count(TODO_MARKER) == len(_todos(result))


@pytest.mark.parametrize("case", CASES)
def test_golden_output_is_a_fixed_point(case):
    """Rewriting the output again changes nothing (TODO comments are not duplicated)."""
    expected = (GOLDEN / case / "expected.py").read_text()
    assert _migrate(case, "expected.py").source == expected


def test_every_rule_family_has_a_golden_case():
    assert {"topology", "optimizer_ddp", "optimizer_fp16", "optimizer_flagged", "allreduce",
            "broadcast_helpers", "sampler", "horovod_runner", "flags", "imports_in_function",
            "keep_hvd_import", "no_horovod", "dataflow_choices", "horovod_run", "lightning_trainer",
            "elastic_state", "accumulation_sub_batches", "import_forms", "import_fallback",
            "values_and_handles"} <= set(CASES)


def test_no_horovod_file_is_untouched():
    source = (GOLDEN / "no_horovod" / "input.py").read_text()
    result = migrate_source(source)
    assert result.source == source and not result.changed and result.findings == []
