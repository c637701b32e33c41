"""A replayable source over a map's event journal."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from epochal_map.store import Event, MapStore, MapTarget
from epochal_sdk import (
    ConfigError,
    DataGoneError,
    Guarantee,
    Offsets,
    Options,
    ReplayableSource,
    Split,
)

if TYPE_CHECKING:
    import pyarrow as pa

CHUNK_ROWS = 10_000


@functools.cache
def arrow_schema() -> pa.Schema:
    """The source's rows as Arrow batches, built where rows are read (pyarrow imported
    there: docs/authors/connectors.md, "Where the code runs")."""
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.string()),
            ("value", pa.string()),
            ("partition", pa.int32()),
            ("sequence", pa.int64()),
            ("event_time", pa.timestamp("us", tz="UTC")),
        ]
    )


def to_batch(partition: int, events: list[Event]) -> pa.RecordBatch:
    """Journal events of one partition as an Arrow record batch in the source's schema."""
    import pyarrow as pa

    sequences, keys, values, times = zip(*events, strict=True)
    columns = [keys, values, [partition] * len(events), sequences, times]
    schema = arrow_schema()
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


class MapJournalSource(ReplayableSource):
    """Reads the journal of one map: every change to an entry, once, in order per partition.

    Options: ``path``, ``map`` (required), ``partitions`` (only used by writers that create
    the map), ``startingPosition`` (``earliest`` or ``latest``), ``maxRecordsPerBatch``.
    Partitions are the journal partitions ("0", "1", ...); offsets are the next sequence.
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.target = MapTarget.from_options(options)
        self.starting_position = options.choice(
            "startingPosition", "earliest", ("earliest", "latest")
        )

    @property
    def store(self) -> MapStore:
        """The map store, opened on first use."""
        return self.target.store

    def schema(self) -> str:
        """The journal's columns."""
        return "key string, value string, partition int, sequence bigint, event_time timestamp"

    def check(self) -> None:
        """Fail if the map does not exist (the source never creates one)."""
        self.max_records_per_batch()
        exists = os.path.exists(self.target.path)
        if not exists or self.store.partition_count(self.target.map) is None:
            raise ConfigError(
                "map",
                "map",
                f"map {self.target.map!r} does not exist in {self.target.path}",
                "Write to it first or check the name (and the 'path' option).",
            )

    def partitions(self) -> list[str]:
        """The journal partitions of the map, as strings."""
        return [str(p) for p in self.store.journal_partitions(self.target.map)]

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        """0 for ``earliest``; the current end of each partition for ``latest``."""
        if self.starting_position == "latest":
            return self.latest_offsets(partitions)
        return {p: 0 for p in partitions}

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        """The next sequence of each partition."""
        return {p: self.store.journal_end(self.target.map, int(p)) for p in partitions}

    def read(self, split: Split) -> Iterator[pa.RecordBatch]:
        """The events ``start <= sequence < end`` of one partition, in chunks."""
        partition, start, end = int(split.partition), int(split.start), int(split.end)
        for low in range(start, end, CHUNK_ROWS):
            high = min(low + CHUNK_ROWS, end)
            events = self.store.journal_read(self.target.map, partition, low, high)
            if len(events) != high - low:
                raise DataGoneError(
                    "map",
                    f"map {self.target.map!r} in {self.target.path}, partition {partition} "
                    f"(it holds {len(events)} of the events {low}..{high - 1})",
                    "the file was replaced or edited since the snapshot",
                    "Restore it, or start the job afresh with a new checkpoint.",
                )
            yield to_batch(partition, events)

    def close(self) -> None:
        """Close the store."""
        self.target.close()
