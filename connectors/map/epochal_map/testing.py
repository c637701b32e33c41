"""The map connector under epochal's conformance kit, and pytest fixtures that let any
connector's suite use the map as the other side (``epochal_map_source``, ``epochal_map_sink``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from epochal.testing import SinkUnderTest, SourceUnderTest
from epochal_map.store import MapStore


class MapSourceUnderTest(SourceUnderTest):
    """The map's journal as a replayable source: record IDs are the keys."""

    connector = "map"
    id_expr = "CAST(key AS BIGINT)"

    def __init__(self, path: str | Path, map_name: str = "input") -> None:
        self.path, self.map_name = str(path), map_name

    def options(self) -> dict[str, str]:
        return {"path": self.path, "map": self.map_name}

    def produce(self, ids: Sequence[int]) -> None:
        with MapStore(self.path) as store:
            store.append_events(self.map_name, [(str(i), str(i)) for i in ids])


class MapSinkUnderTest(SinkUnderTest):
    """The map as a sink. Transactional mode is read through the journal (every committed
    write appears there once); idempotent mode through the entries."""

    connector = "map"

    def __init__(self, path: str | Path, map_name: str = "output") -> None:
        self.path, self.map_name = str(path), map_name

    def options(self, mode: str) -> dict[str, str]:
        return {"path": self.path, "map": self.map_name, "mode": mode}

    def committed(self, mode: str) -> list[tuple[str, str]]:
        with MapStore(self.path) as store:
            if mode == "idempotent":
                return sorted(store.entries(self.map_name).items())
            out = []
            for partition in store.journal_partitions(self.map_name):
                end = store.journal_end(self.map_name, partition)
                out += [
                    (k, v) for _, k, v, _ in store.journal_read(self.map_name, partition, 0, end)
                ]
            return out

    def in_doubt(self) -> list[str]:
        with MapStore(self.path) as store:
            return store.in_doubt("ep.")


@pytest.fixture
def epochal_map_source(tmp_path: Any) -> MapSourceUnderTest:
    """A fresh map journal to read from."""
    return MapSourceUnderTest(tmp_path / "source.sqlite")


@pytest.fixture
def epochal_map_sink(tmp_path: Any) -> MapSinkUnderTest:
    """A fresh map to write to."""
    return MapSinkUnderTest(tmp_path / "sink.sqlite")
