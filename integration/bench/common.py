"""What the benchmark commands share."""

from __future__ import annotations

from typing import Any


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
