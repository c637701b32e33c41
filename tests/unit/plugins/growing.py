"""A test connector whose partitions and data come from a JSON file the test edits:
``{"partition id": number of records}``; record i of partition p is (p, i)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from epochal_sdk import Connector, Offsets, ReplayableSource, Split
from epochal_sdk.hookspecs import hookimpl


class GrowingSource(ReplayableSource):
    """Partitions appear when the file names them."""

    def _sizes(self) -> dict[str, int]:
        with open(self.options.required("path")) as fh:
            return json.load(fh)

    def schema(self) -> str:
        return "partition string, i bigint"

    def partitions(self) -> list[str]:
        return sorted(self._sizes())

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        return {p: 0 for p in partitions}

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        sizes = self._sizes()
        return {p: sizes[p] for p in partitions}

    def read(self, split: Split) -> Iterator[tuple[str, int]]:
        for i in range(int(split.start), int(split.end)):
            yield (split.partition, i)


class GrowingConnector(Connector):
    """Registers the growing source."""

    name = "growing"
    source_class = GrowingSource


@hookimpl
def register_connectors(register) -> None:
    """Register it."""
    register(GrowingConnector)
