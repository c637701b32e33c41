"""An installed connector that fails to load is refused with its import error where a query
names its format, never left for Spark to look up (a ``ClassNotFoundException`` that hides
the cause), and ``epochal connectors`` reports it as an error.

The broken connector is a real installed distribution in a temporary directory: a package,
its ``pyspark_epochal_jsonl`` package, and the ``.dist-info`` whose entry point names a plugin
module that imports a name the SDK does not export (and never did: a name an older SDK exported
still imports, with a warning).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.parts import registry
from epochal.spark import datasource
from epochal_sdk import ConfigError

IMPORT_ERROR = "cannot import name 'connector_hook' from 'epochal_sdk'"


@pytest.fixture
def broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``epochal-jsonl`` installed in ``tmp_path`` (on ``sys.path``), its plugin module
    importing a name no SDK ever exported (``connector_hook``)."""
    (tmp_path / "epochal_jsonl").mkdir()
    (tmp_path / "epochal_jsonl" / "__init__.py").write_text("")
    (tmp_path / "epochal_jsonl" / "plugin.py").write_text(
        "from epochal_sdk import connector_hook\n\n\n"
        "@connector_hook\ndef register_connectors(register):\n    pass\n"
    )
    (tmp_path / "pyspark_epochal_jsonl").mkdir()
    (tmp_path / "pyspark_epochal_jsonl" / "__init__.py").write_text(
        "from epochal_sdk import define_default_source\n\n"
        'define_default_source(globals(), "jsonl")\n'
    )
    info = tmp_path / "epochal_jsonl-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epochal-jsonl\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[epochal]\njsonl = epochal_jsonl.plugin\n")
    monkeypatch.delenv(registry.EXTRA_PLUGINS_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    registry.plugin_manager.cache_clear()
    registry._installed_alone.cache_clear()
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0].endswith("epochal_jsonl")]:
        del sys.modules[name]
    registry.plugin_manager.cache_clear()
    registry._installed_alone.cache_clear()


def test_the_format_of_a_connector_that_fails_to_load_is_refused_with_its_import_error(
    broken: Path,
) -> None:
    with pytest.raises(ConfigError) as refused:
        registry.connector("jsonl")
    message = str(refused.value)
    assert "format('epochal.jsonl')" in message
    assert "epochal-jsonl" in message and "epochal_jsonl.plugin" in message
    assert f"ImportError: {IMPORT_ERROR}" in message
    assert "map" in registry.connectors()  # the others still load


def test_spark_finds_the_format_and_creating_it_says_why_it_failed(broken: Path) -> None:
    """What Spark does with a ``pyspark_*`` package (lookup_data_sources): import it, take
    its ``DefaultSource`` and its name; then a query that names the format creates one."""
    module = importlib.import_module("pyspark_epochal_jsonl")
    source = module.DefaultSource
    assert source.name() == "epochal.jsonl"
    assert source.__module__ == "pyspark_epochal_jsonl"
    with pytest.raises(ConfigError, match=IMPORT_ERROR):
        source({})


def test_a_failed_connector_is_one_register_registers(broken: Path) -> None:
    """``epochal.register(spark)`` registers the formats of the loaded connectors and of the
    failed ones (``failed_connectors``), so that Spark does not look for a class of that name
    (ClassNotFoundException) but creates the data source, which says why it failed."""
    assert "jsonl" in registry.failed_connectors()
    assert "jsonl" not in registry.connectors()
    with pytest.raises(ConfigError, match=IMPORT_ERROR):
        datasource.data_source_class("jsonl")({})


def test_the_connectors_command_reports_it_as_an_error(broken: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), *sys.path])}
    for args in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "epochal", "connectors", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert IMPORT_ERROR in result.stdout + result.stderr
        assert "jsonl" in result.stdout + result.stderr
