"""What the source and sink adapters share."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from epochal.base import secrets
from epochal.metrics import recording
from epochal.parts import registry
from epochal.parts.job_context import JobContext
from epochal.parts.records import PartRecord, check_target, part_id_in_job
from epochal.spark import worker_gc
from epochal_sdk import ConnectorContext, Guarantee, Options, Schema
from epochal_sdk.context import Metrics
from epochal_sdk.errors import RESTARTABLE_MARK
from epochal_sdk.schema import Field

log = logging.getLogger("epochal.spark")


@dataclass(frozen=True)
class SparkTask:
    """What Spark says about the running task (its local properties and ids)."""

    batch: int | None
    partition: int
    attempt: int
    query_id: str

    @classmethod
    def current(cls) -> SparkTask | None:
        """The running task, or None outside a Spark task (on the driver)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return None
        worker_gc.settle_imports()  # a task's Python worker: once per process
        batch = context.getLocalProperty("streaming.sql.batchId")
        return cls(
            batch=int(batch) if batch is not None else None,
            partition=context.partitionId(),
            attempt=context.attemptNumber(),
            query_id=context.getLocalProperty("sql.streaming.queryId") or "",
        )


def task_batch_id() -> int | None:
    """The micro-batch id of the running Spark task (None outside a streaming task)."""
    task = SparkTask.current()
    return task.batch if task is not None else None


def user_options(options: dict[str, str]) -> dict[str, str]:
    """The options meant for the connector (without ``epochal.*`` and Spark's own)."""
    return {
        k: v
        for k, v in options.items()
        if not k.lower().startswith("epochal.") and k.lower() not in registry.SPARK_OWN_OPTIONS
    }


def recordable_options(connector: str, options: dict[str, str]) -> dict[str, str]:
    """The connector's options as the snapshot store keeps them for operators' tools (such
    as ``epochal in-doubt``): secret options left out, secrets inside values masked
    (:mod:`epochal.base.secrets`); ``${env:...}``/``${file:...}`` references are kept as such."""
    return secrets.recordable(user_options(options), registry.declared_secrets(connector))


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
    entry_point: str = ""
    """The connector plugin's entry point value as the driver found it ("": search for it);
    see :func:`epochal.parts.registry.connector`."""

    @classmethod
    def in_job(
        cls,
        kind: str,
        connector: str,
        options: dict[str, str],
        context: JobContext,
        entry_point: str = "",
    ) -> Part:
        """Connector ``connector``'s ``kind`` (``"source"`` or ``"sink"``) part of the job of
        ``context``, with the id the job knows it by (:func:`~epochal.parts.records.
        part_id_in_job`). On the driver, where a query plans it."""
        store = context.store(connector) if context.job_dir else None
        part_id = part_id_in_job(store, kind, connector, options)
        return cls(connector, options, part_id, context, entry_point=entry_point)

    @property
    def label(self) -> str:
        """For messages: ``connector 'map' (map-1a2b3c)``."""
        return f"connector {self.connector!r} ({self.part_id})"

    def connector_context(
        self, batch: int | None = None, task: SparkTask | None = None, schema: Schema = ()
    ) -> ConnectorContext:
        """What a source or sink object of this part is told about where it runs: in a task
        (``task``) its batch, partition, attempt and the ``schema`` a sink's task writes; on
        the driver the ``batch`` a commit works on (None while planning and recovering)."""
        return ConnectorContext(
            job=self.context.job,
            part_id=self.part_id,
            run=self.context.run,
            query_id=task.query_id if task is not None else self.query_id(),
            batch=task.batch if task is not None else batch,
            partition=task.partition if task is not None else None,
            attempt=task.attempt if task is not None else 0,
            schema=schema,
            guarantee=self.guarantee,
            metrics=Metrics(),
            incarnation=self.context.incarnation,
        )

    def query_id(self) -> str:
        """Spark's query id, on the driver: from the checkpoint's metadata when epochal knows
        the checkpoint (a supervised run after its query started once), else ""."""
        known = self.__dict__.get("_query_id", "")
        location = self.context.checkpoint
        if known or not location:
            return known
        try:
            from epochal.state.checkpoint import Checkpoint

            data = Checkpoint(location).read("metadata")
            known = str(json.loads(data.decode()).get("id", "")) if data else ""
        except Exception:  # the id is informative: never fail a step over it
            return ""
        self.__dict__["_query_id"] = known
        return known

    def connector_options(self, context: ConnectorContext | None = None) -> Options:
        """The options as the connector sees them, with its context."""
        return Options(
            self.connector,
            secrets.resolved(user_options(self.options)),
            context or self.connector_context(),
        )

    def build_source(self, context: ConnectorContext | None = None) -> Any:
        """A fresh source object (with ``context``, else a driver-side one)."""
        return registry.connector(self.connector, self.entry_point).source(
            self.connector_options(context)
        )

    def build_sink(self, context: ConnectorContext | None = None) -> Any:
        """A fresh sink object (with ``context``, else a driver-side one)."""
        return registry.connector(self.connector, self.entry_point).sink(
            self.connector_options(context)
        )

    def report(
        self,
        kind: str,
        batch: int | None,
        values: dict[str, float],
        *,
        task_side: bool = False,
        task: int | None = None,
    ) -> None:
        """Leave what a step of this part measured for the job's metrics (best effort);
        ``task``: the reporting task's Spark partition (see :func:`recording.report`)."""
        recording.report(
            self.context.job_dir,
            kind,
            self.part_id,
            self.connector,
            batch,
            values,
            task_side=task_side,
            task=task,
        )

    def target(self, kind: str) -> dict[str, str]:
        """Where this part writes (``kind`` ``"sink"``) or reads (``"source"``), without
        secrets (:func:`~epochal.parts.registry.target_of`; references resolved)."""
        return registry.target_of(self.connector, kind, self.connector_options())

    def check_target(self, kind: str) -> None:
        """Refuse to run this part when the run's store records it (same part id) with
        another target: its snapshot entries (commit decisions, in-doubt transactions,
        stored batches) belong to that target (:func:`~epochal.parts.records.
        check_target`). Called on the driver when a query plans the part, before the part
        writes or recovers anything."""
        if not self.context.job_dir:
            return
        check_target(self.context.store(self.connector), kind, self.part_id, self.target(kind))

    def record(self, kind: str, contract: str, reason: str = "") -> None:
        """Note the part, its contract, its effective guarantee and its target in the run's
        store, for status, metrics, ``epochal in-doubt`` and the target check of the next
        run (:class:`~epochal.parts.records.PartRecord`)."""
        if not self.context.job_dir:
            return
        PartRecord(
            kind,
            self.part_id,
            self.connector,
            self.guarantee.label,
            contract,
            recordable_options(self.connector, self.options),
            reason,
            self.target(kind),
        ).write(self.context.store(self.connector))


STEP_NOTE = "epochal step:"


@contextlib.contextmanager
def protocol_step(part: Part, batch: int | None, step: str) -> Iterator[None]:
    """Name the job, the part, the batch and the step on any error raised inside (as an
    exception note, which survives the trip through Spark's JVM in the traceback text), and
    mark an error of a class the part's connector declares restartable
    (:attr:`~epochal_sdk.Connector.restartable_errors`) with
    :data:`~epochal_sdk.errors.RESTARTABLE_MARK`, which the driver's classification of the
    failure reads (:mod:`epochal.control.failures`)."""
    try:
        yield
    except BaseException as exc:
        notes = [str(n) for n in getattr(exc, "__notes__", ())]
        if not any(n.startswith(STEP_NOTE) for n in notes):
            exc.add_note(
                f"{STEP_NOTE} job {part.context.job!r}, {part.label}, batch {batch}, step {step}"
            )
        declared = registry.restartable_errors(part.connector) if isinstance(exc, Exception) else ()
        if declared and isinstance(exc, declared) and not any(RESTARTABLE_MARK in n for n in notes):
            exc.add_note(
                f"{RESTARTABLE_MARK} {type(exc).__module__}.{type(exc).__qualname__} is "
                f"restartable for connector {part.connector!r}: the job restarts from its "
                "last snapshot"
            )
        raise
