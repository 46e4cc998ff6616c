"""Rewrite Horovod PyTorch code into native ``torch.distributed`` / DDP code.

``python -m horovod_compat.migrate SRC... [-o OUT] [--diff] [--check]`` (see cli.py).  The
rewrite is source to source with libcst, so comments and formatting survive; what cannot be
rewritten without changing the training is left in place with a ``# TODO(horovod-compat):``
comment and listed in the report.
"""
from horovod_compat.migrate.engine import MigrationError, Unit, UnitResult, migrate_source, migrate_units
from horovod_compat.migrate.report import Finding, Kind

__all__ = ["Finding", "Kind", "MigrationError", "Unit", "UnitResult", "migrate_source", "migrate_units"]
