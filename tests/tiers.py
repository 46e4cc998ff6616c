"""CI's round and the long round (docs/testing.md: what a test may cost).

CI runs the suite with ``CI=true``: every tier that is costly (many processes, more than ~30 s)
then runs its short form, which checks every behaviour once; the long round (the same command
without ``CI=true``, or with the tier's own variables) adds the repetitions: more rounds, seeds,
sizes, transports. This is the one place that reads ``CI``.
"""
from __future__ import annotations

import os

#: True in CI's round (``CI`` is ``true``, ``1`` or ``yes``).
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
