"""Fixtures for the Spark job tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epochal.parts import registry
from epochal_map import MapStore

HERE = Path(__file__).parent


@pytest.fixture
def map_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A map file with 200 events in the journal 'input'."""
    path = str(tmp_path / "map.sqlite")
    with MapStore(path) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(200)])
    monkeypatch.setenv("EPOCHAL_TEST_MAP", path)
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return path


@pytest.fixture
def weak_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the test connector 'weakmap' (at most at-least-once) here and in drivers."""
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "plugins.weak")
    registry.plugin_manager.cache_clear()
    yield
    registry.plugin_manager.cache_clear()
