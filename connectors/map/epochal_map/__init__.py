"""epochal-map: an embedded, durable key-value map with an event journal, on SQLite.

The reference connector of epochal: a replayable source (the journal) and a sink that is both
idempotent (upsert by key) and transactional (two-phase commit through staged rows).
"""

from epochal_map.connector import MapConnector
from epochal_map.sink import MapSink
from epochal_map.source import MapJournalSource
from epochal_map.store import MapStore, MapStoreError, MapTarget

__all__ = [
    "MapConnector",
    "MapJournalSource",
    "MapSink",
    "MapStore",
    "MapStoreError",
    "MapTarget",
]
