"""Fixtures shared by the test directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import wheels


@pytest.fixture(scope="session")
def built_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every distribution's wheel (by its directory), built from the tree once a session
    (once per worker under pytest-xdist)."""
    return wheels.build(tmp_path_factory.mktemp("wheels"))
