"""A test connector that can give at most at-least-once: the map sink, declared weaker."""

from __future__ import annotations

from epochal_map.connector import MapConnector
from epochal_map.sink import MapSink
from epochal_sdk import Guarantee
from epochal_sdk.hookspecs import hookimpl


class WeakMapSink(MapSink):
    """The map sink, claiming only at-least-once."""

    MAX_GUARANTEE = Guarantee.AT_LEAST_ONCE


class WeakMapConnector(MapConnector):
    """A connector whose sink cannot give exactly-once."""

    name = "weakmap"
    description = "test connector: the map sink limited to at-least-once"
    sink_class = WeakMapSink


@hookimpl
def register_connectors(register) -> None:
    """Register the weak connector."""
    register(WeakMapConnector)
