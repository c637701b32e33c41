"""``epochal demo`` runs on the map connector, an extra of the runtime (``epochal[demo]``):
without it the demo says what to install instead of failing on an import."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from epochal.ops import demo
from epochal_sdk import EpochalError

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_names_the_map_connector_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "epochal_map", None)  # an import of it fails
    with pytest.raises(EpochalError, match=r"pip install 'epochal\[demo\]'"):
        demo.map_store()


def test_the_runtime_declares_the_demo_s_connector_as_an_extra() -> None:
    project = tomllib.loads((ROOT / "core_runtime" / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["demo"] == [demo.MAP_DISTRIBUTION]
    assert demo.map_store().__module__.startswith("epochal_map")
