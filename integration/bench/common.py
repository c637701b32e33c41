"""What the benchmark commands share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Result:
    """One benchmark variant's figures."""

    name: str
    records: int
    seconds: float
    batch_ms: list[float]
    note: str = ""
    batch_rows: list[int] | None = None
    phases: dict[str, float] | None = None
    """Mean ms per batch of Spark's phases (latestOffset, addBatch, walCommit, ...)."""

    @property
    def rate(self) -> float:
        """Records per second over the measured time."""
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def steady(self) -> float:
        """The rate without the first batch (which pays the query's start-up)."""
        rows, ms = self.batch_rows or [], self.batch_ms
        if len(rows) < 2:
            return self.rate
        return sum(rows[1:]) / (sum(ms[1:]) / 1000) if sum(ms[1:]) else 0.0


def run_available_now(reader: Any, fmt: str, options: dict[str, str], checkpoint: str) -> list:
    """Run one ``Trigger.AvailableNow`` query to its end and return the progress reports of
    its batches that had data (the figures come from Spark's own ``triggerExecution``)."""
    query = (
        reader.writeStream.format(fmt)
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [p for p in query.recentProgress if p["numInputRows"] > 0]
