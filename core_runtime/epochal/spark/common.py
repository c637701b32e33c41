"""What the source and sink adapters share."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from epochal import registry
from epochal.context import JobContext
from epochal_sdk import Field, Guarantee, Options, Schema

log = logging.getLogger("epochal.spark")


def task_batch_id() -> int | None:
    """The micro-batch id of the running Spark task (None outside a streaming task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    value = context.getLocalProperty("streaming.sql.batchId")
    return int(value) if value is not None else None


def user_options(options: dict[str, str]) -> dict[str, str]:
    """The options meant for the connector (without ``epochal.*`` and Spark's own)."""
    return {
        k: v
        for k, v in options.items()
        if not k.lower().startswith("epochal.") and k.lower() not in registry.SPARK_OWN_OPTIONS
    }


def sdk_schema(schema: StructType) -> Schema:
    """A Spark schema as SDK fields."""
    return tuple(Field(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields)


@dataclass
class Part:
    """One source or sink of a query, as the adapters carry it (picklable)."""

    connector: str
    options: dict[str, str]
    part_id: str
    context: JobContext
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE

    @property
    def label(self) -> str:
        """For messages: ``connector 'map' (map-1a2b3c)``."""
        return f"connector {self.connector!r} ({self.part_id})"

    def connector_options(self) -> Options:
        """The options as the connector sees them."""
        return Options(self.connector, user_options(self.options))

    def build_source(self) -> Any:
        """A fresh source object."""
        return registry.connector(self.connector).source(self.connector_options())

    def build_sink(self) -> Any:
        """A fresh sink object."""
        return registry.connector(self.connector).sink(self.connector_options())

    def record(self, kind: str, extra: dict[str, Any]) -> None:
        """Note the part and its effective guarantee in the job's store (for status)."""
        if not self.context.job_dir:
            return
        store = self.context.store(self.connector)
        store.write_json(
            f"parts/{kind}-{self.part_id}",
            {"kind": kind, "connector": self.connector, "guarantee": self.guarantee.label, **extra},
        )


STEP_NOTE = "epochal step:"


@contextlib.contextmanager
def protocol_step(part: Part, batch: int | None, step: str) -> Iterator[None]:
    """Name the job, the part, the batch and the step on any error raised inside (as an
    exception note, which survives the trip through Spark's JVM in the traceback text)."""
    try:
        yield
    except BaseException as exc:
        if not any(str(n).startswith(STEP_NOTE) for n in getattr(exc, "__notes__", ())):
            exc.add_note(
                f"{STEP_NOTE} job {part.context.job!r}, {part.label}, batch {batch}, step {step}"
            )
        raise
