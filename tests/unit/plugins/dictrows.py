"""A test connector whose ``read`` yields dict rows (by column name, in any order), and which
counts what it read through its context's metrics handle."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from epochal_sdk import Connector, Offsets, ReplayableSource, Split


class DictRowsSource(ReplayableSource):
    """One partition of ``size`` records (option ``size``): ``{"i": i, "label": "r<i>"}``."""

    def schema(self) -> str:
        return "label string, i bigint"

    def partitions(self) -> list[str]:
        return ["0"]

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        return dict.fromkeys(partitions, 0)

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        return dict.fromkeys(partitions, self.options.int("size", 3))

    def read(self, split: Split) -> Iterator[dict[str, Any]]:
        for i in range(int(split.start), int(split.end)):
            self.context.metrics.count("rows_made")
            yield {"i": i, "label": f"r{i}"}


class DictRowsConnector(Connector):
    """Registered by naming the class (one-line registration)."""

    name = "dictrows"
    source_class = DictRowsSource


register_connectors = DictRowsConnector.register_connectors
"""A module named in EPOCHAL_PLUGINS registers through this hook (the class's own)."""
