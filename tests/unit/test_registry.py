"""Connector discovery through pluggy entry points, extra plugins, and part ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pluggy
import pytest

from epochal.parts import registry
from epochal.testing import broker
from epochal_map import MapConnector
from epochal_sdk import ConfigError
from epochal_sdk import hookspecs as specs

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the plugins of its own environment (plugin_manager is cached)."""
    monkeypatch.delenv(registry.EXTRA_PLUGINS_ENV, raising=False)
    monkeypatch.syspath_prepend(str(PLUGINS))
    registry.plugin_manager.cache_clear()
    registry._installed_alone.cache_clear()
    yield
    registry.plugin_manager.cache_clear()
    registry._installed_alone.cache_clear()


def test_map_is_found_through_its_entry_point() -> None:
    found = registry.connectors()
    assert found["map"] is MapConnector
    assert "testqueue" not in found
    assert isinstance(registry.connector("map"), MapConnector)


def test_a_connector_is_loaded_without_importing_the_others() -> None:
    """A Python process Spark starts for a query needs one connector: it must not pay the
    imports of every installed one (and their client libraries)."""
    import subprocess
    import sys

    code = (
        "import sys; from epochal.parts import registry; registry.connector('map'); "
        "print(sorted(m for m in sys.modules if m.startswith('epochal_') and '.' not in m))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != registry.EXTRA_PLUGINS_ENV}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.strip() == "['epochal_map', 'epochal_sdk']"


def test_a_connector_is_loaded_from_the_entry_point_its_driver_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Python processes Spark starts for a query get the plugin's entry point value
    from their driver (the data source class and each part carry it) and load the plugin
    from it, for every later look-up too: searching the installed distributions' metadata
    reads every entry of Python's path, Spark's core jar among them. A value that no longer
    loads falls back to the search."""
    from epochal.spark.datasource import data_source_class

    value = registry.entry_point_value("map")
    assert value.startswith("epochal_map"), value
    assert data_source_class("map").connector_entry_point == value
    monkeypatch.setattr(registry, "_ENTRY_POINTS_GIVEN", {})

    def no_search(**_: object) -> None:
        raise AssertionError("the metadata was searched")

    with monkeypatch.context() as searchless:
        searchless.setattr(registry.importlib.metadata, "entry_points", no_search)
        assert isinstance(registry.connector("map", value), MapConnector)
        assert isinstance(registry.connector("map"), MapConnector)  # remembered
    registry._installed_alone.cache_clear()
    monkeypatch.setattr(registry, "_ENTRY_POINTS_GIVEN", {})
    assert isinstance(registry.connector("map", "epochal_map_gone:plugin"), MapConnector)


def test_extra_plugins_are_loaded_alone_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """With EPOCHAL_PLUGINS, a Python process Spark starts loads a connector those modules
    register from them alone, and any other from its installed plugin alone: no search of
    every installed plugin (each Spark process of a query paid 0.4 s of CPU for it). An
    extra module that fails to load leaves it to the full discovery, which reports why."""
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker")

    def no_discovery() -> None:
        raise AssertionError("every plugin was loaded")

    with monkeypatch.context() as alone:
        alone.setattr(registry, "plugin_manager", no_discovery)
        assert registry.connector("testqueue").name == "testqueue"
        assert isinstance(registry.connector("map"), MapConnector)
    registry._installed_alone.cache_clear()
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker,epochal_unit_gone")
    assert registry._installed_alone("testqueue") is None
    assert registry.connector("testqueue").name == "testqueue"
    assert "epochal_unit_gone" in registry.BROKEN


def test_unknown_connector_names_the_installed_ones() -> None:
    with pytest.raises(ConfigError) as info:
        registry.connector("kafak")
    message = str(info.value)
    assert info.value.option == "format"
    assert "no connector named 'kafak' is installed (installed: " in message
    assert "map" in message.split("installed: ")[1]
    assert "pip install epochal-kafak" in message


def test_extra_plugins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker")
    registry.plugin_manager.cache_clear()
    found = registry.connectors()
    assert {"map", "testqueue"} <= set(found)
    assert found["testqueue"] is broker.TestQueueConnector
    assert registry.connector("testqueue").name == "testqueue"


def test_several_extra_plugins_with_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker, epochal_unit_extra")
    registry.plugin_manager.cache_clear()
    assert {"map", "testqueue", "unitextra"} <= set(registry.connectors())


def test_the_plugin_manager_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    first = registry.plugin_manager()
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker")
    assert registry.plugin_manager() is first
    assert "testqueue" not in registry.connectors()
    registry.plugin_manager.cache_clear()
    assert "testqueue" in registry.connectors()


def test_two_plugins_with_the_same_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal_unit_dup_a,epochal_unit_dup_b")
    registry.plugin_manager.cache_clear()
    with pytest.raises(ConfigError) as info:
        registry.connectors()
    message = str(info.value)
    assert "two plugins register a connector named 'dup'" in message
    assert "epochal_unit_dup_a" in message
    assert "epochal_unit_dup_b" in message
    assert "Uninstall one of them." in message


def test_a_plugin_registering_the_same_class_twice_is_fine() -> None:
    import epochal_unit_extra

    manager = pluggy.PluginManager(specs.PROJECT)
    manager.add_hookspecs(specs)
    manager.register(epochal_unit_extra)

    class Again:
        @specs.hookimpl
        def register_connectors(self, register) -> None:
            register(epochal_unit_extra.ExtraConnector)

    manager.register(Again())
    assert registry.connectors(manager) == {"unitextra": epochal_unit_extra.ExtraConnector}


def test_register_refuses_a_non_connector() -> None:
    manager = pluggy.PluginManager(specs.PROJECT)
    manager.add_hookspecs(specs)

    class Bad:
        @specs.hookimpl
        def register_connectors(self, register) -> None:
            register(object)

    manager.register(Bad())
    with pytest.raises(TypeError, match="takes a Connector subclass"):
        registry.connectors(manager)


# -- part ids -------------------------------------------------------------------------------


def test_part_id_is_stable_across_order_and_case() -> None:
    a = registry.part_id("map", {"path": "/data/m.sqlite", "map": "events", "partitions": "4"})
    b = registry.part_id("map", {"Partitions": "4", "MAP": "events", "Path": "/data/m.sqlite"})
    assert a == b
    assert a.startswith("map-")
    assert len(a) == len("map-") + 10
    assert all(c in "0123456789abcdef" for c in a[4:])


def test_part_id_ignores_epochal_options() -> None:
    plain = registry.part_id("map", {"map": "events"})
    with_runtime = registry.part_id(
        "map", {"map": "events", "epochal.job": "j", "Epochal.SnapshotDir": "/tmp/x"}
    )
    assert plain == with_runtime


def test_part_id_differs_for_different_options() -> None:
    ids = {
        registry.part_id("map", {"map": "events"}),
        registry.part_id("map", {"map": "orders"}),
        registry.part_id("map", {"map": "Events"}),  # values keep their case
        registry.part_id("map", {"map": "events", "partitions": "2"}),
        registry.part_id("kafka", {"map": "events"}),
    }
    assert len(ids) == 5


def test_explicit_part_id_wins() -> None:
    assert registry.part_id("map", {"map": "events", "epochal.id": "totals"}) == "totals"
    assert registry.part_id("map", {"map": "other", "EPOCHAL.ID": "totals"}) == "totals"
    # an empty id is no id
    assert registry.part_id("map", {"map": "events", "epochal.id": ""}).startswith("map-")


def test_blank_items_in_extra_plugins_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker, ")
    registry.plugin_manager.cache_clear()
    assert {"map", "testqueue"} <= set(registry.connectors())


def test_an_extra_plugin_that_is_also_installed_is_loaded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal_map.plugin")
    registry.plugin_manager.cache_clear()
    assert registry.connectors()["map"] is MapConnector
    assert "testqueue" not in registry.connectors()


def test_a_part_id_does_not_change_with_the_checkpoint() -> None:
    """The checkpoint moves to the new lease epoch's directory at every take-over; a sink's
    id (its snapshot entries, its transaction ids) must stay the same."""
    first = registry.part_id("map", {"path": "x", "checkpointLocation": "/j/epochs/1/checkpoint"})
    again = registry.part_id("map", {"path": "x", "checkpointLocation": "/j/epochs/2/checkpoint"})
    assert first == again == registry.part_id("map", {"path": "x"})


def test_part_id_leaves_out_the_runtime_tuning_of_a_part() -> None:
    """The guarantee, admission control, tasks per batch, receive timeout and dedupe window
    tune how the runtime drives a part, not what it reads or writes: changing one keeps the
    id, and with it the part's stored batches, dedupe ids and decisions."""
    plain = registry.part_id("map", {"map": "events"})
    for name in registry.TUNING_OPTIONS:
        assert registry.part_id("map", {"map": "events", name: "7"}) == plain, name
    tuned = {"map": "events", "MaxRecordsPerBatch": "9", "guarantee": "at-least-once"}
    assert registry.part_id("map", tuned) == plain
    assert {
        "guarantee",
        "maxrecordsperbatch",
        "minrecordspertask",
        "receivetimeoutms",
        "dedupewindowbatches",
        "dedupewindowids",
    } == registry.TUNING_OPTIONS


def test_ids_of_parts_without_tuning_options_are_the_ids_they_had() -> None:
    """Golden ids (computed by the runtime before tuning options were left out)."""
    assert registry.part_id("map", {"name": "orders"}) == "map-b62bd9e21b"
    assert registry.part_id("map", {"map": "events", "path": "/d/m.sqlite"}) == "map-2f43f763df"
    assert registry.is_options_id("map", "map-b62bd9e21b")
    assert not registry.is_options_id("map", "orders")
    assert not registry.is_options_id("map", "kafka-b62bd9e21b")
    assert not registry.is_options_id("map", "map-b62bd9e21b0")
