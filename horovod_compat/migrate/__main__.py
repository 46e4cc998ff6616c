"""``python -m horovod_compat.migrate``: see cli.py."""
import sys

from horovod_compat.migrate.cli import main

sys.exit(main())
