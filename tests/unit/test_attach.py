"""The session check attaches itself (:mod:`epochal.spark.attach`): the wheel's ``.pth``
installs a finder that patches PySpark's ``DataStreamWriter`` when it is imported, so that its
query starts first attach the check; ``EPOCHAL_ATTACH=0`` turns it off. No Spark here (a
stand-in module); tests/releases runs a plain session's kit case without ``register`` on a
real one."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from epochal.spark import attach

STAND_IN = """
class DataStreamWriter:
    def __init__(self, spark):
        self._spark = spark

    def start(self, path=None):
        return ("started", path)

    def toTable(self, name):
        return ("table", name)
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module standing in for PySpark's, importable and not imported yet."""
    name = f"stand_in_readwriter_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(attach, "WRITER_MODULE", name)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return name


@pytest.fixture
def attached(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(attach, "attach_to", calls.append)
    return calls


def test_a_query_start_attaches_the_check_first_once_the_module_is_imported(
    stand_in: str, attached: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(attach.ENV, raising=False)
    attach.install()
    module = importlib.import_module(stand_in)
    writer = module.DataStreamWriter("session")
    assert writer.start("p") == ("started", "p")
    assert writer.toTable("t") == ("table", "t")
    assert attached == ["session", "session"]
    assert module.DataStreamWriter.start.__name__ == "start"  # wrapped, as it was
    attach.patch(module)  # again: nothing more
    writer.start()
    assert attached == ["session"] * 3


def test_a_module_imported_before_is_patched_at_once(
    stand_in: str, attached: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(attach.ENV, raising=False)
    module = importlib.import_module(stand_in)
    attach.install()
    module.DataStreamWriter("s").start()
    assert attached == ["s"]


def test_the_environment_turns_it_off(
    stand_in: str, attached: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(attach.ENV, "0")
    attach.install()
    importlib.import_module(stand_in).DataStreamWriter("s").start()
    assert attached == []


def test_the_wheel_installs_the_pth_that_calls_install() -> None:
    root = Path(__file__).resolve().parents[2] / "core_runtime"
    line = (root / "epochal-attach.pth").read_text().strip()
    assert line == "import epochal.spark.attach; epochal.spark.attach.install()"
    assert "epochal-attach.pth" in (root / "setup.py").read_text()
