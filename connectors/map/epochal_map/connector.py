"""The map connector: a source over a map's journal and a sink into the map."""

from __future__ import annotations

from epochal_map.sink import MapSink
from epochal_map.source import MapJournalSource
from epochal_sdk import Connector


class MapConnector(Connector):
    """``format("epochal.map")``: an embedded key-value map with an event journal (SQLite)."""

    name = "map"
    description = "Embedded durable key-value map with an event journal, in a local SQLite file."
    source_class = MapJournalSource
    sink_class = MapSink
