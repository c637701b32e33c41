"""Which lane of the suite runs: CI's (``make test``) or the full one (``make test-full``).

The full lane also runs the proofs that repeat, on another release, connector or guarantee,
what a test of CI's lane proves: the root ``conftest.py``'s ``FULL_LANE_ONLY`` names whole
tests; a kit suite of epochal's own connectors uses :data:`FULL` for the parts of a case it
leaves to the full lane (docs/contributing/testing.md).
"""

from __future__ import annotations

import os

LANE_ENV = "EPOCHAL_TEST_LANE"
"""``full`` runs every test; unset, CI's lane."""
FULL = os.environ.get(LANE_ENV) == "full"
"""Whether this run is the full lane."""
