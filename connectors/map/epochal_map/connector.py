"""The map connector: a source over a map's journal and a sink into the map."""

from __future__ import annotations

from epochal_map.sink import MapSink
from epochal_map.source import MapJournalSource
from epochal_map.store import MapTarget
from epochal_sdk import Connector, Options


class MapConnector(Connector):
    """``format("epochal.map")``: an embedded key-value map with an event journal (SQLite)."""

    name = "map"
    description = "Embedded durable key-value map with an event journal, in a local SQLite file."
    source_class = MapJournalSource
    sink_class = MapSink
    source_options = frozenset({"path", "map", "partitions", "startingPosition"})
    sink_options = frozenset({"path", "map", "partitions", "keyColumn", "valueColumn", "mode"})
    target_options = ("path", "map")

    def target(self, options: Options, kind: str) -> dict[str, str]:
        """The map's file (an absolute path, as the part opens it) and the map's name."""
        target = MapTarget.from_options(options)
        return {"path": target.path, "map": target.map}
