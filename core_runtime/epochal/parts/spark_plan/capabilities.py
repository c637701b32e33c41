"""What a part of a streaming query is (:class:`PlanPart`, :class:`QueryPlan`) and what each
kind of part can give: the table of Spark's own sources and sinks (:data:`SPARK_PARTS`), what a
Python data source that declares nothing or an unknown part gives, and the formats and option
names the reader knows.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from epochal_sdk import Guarantee

EPOCHAL_FORMAT_PREFIX = "epochal."
"""The formats of epochal's own connectors: ``epochal.<connector>``."""

IDEMPOTENT_FOREACH_BATCH = "epochal.foreachBatchIdempotent"
"""The writer option by which a job declares its ``foreachBatch`` function idempotent (it
writes each batch id's effect once, however often Spark calls it): ``true`` makes that sink
exactly-once. Any other value, or none, leaves it at-least-once."""

DECLARED_GUARANTEE = "epochal_guarantee"
"""The class attribute by which a Python data source that is not epochal's declares the
guarantee it keeps as a source and as a sink: ``epochal_guarantee = "exactly-once"`` (or
``"at-least-once"``, ``"none"``). PySpark's ``DataSource`` has no such declaration of its own;
a class without it counts as at-least-once."""

FILE_FORMATS = frozenset({"parquet", "json", "csv", "orc", "text", "avro", "xml", "binaryfile"})
"""Spark's file formats by short name; any other ``FileFormat`` class is a file format too."""


class Role(enum.StrEnum):
    """What a part does in the query."""

    SOURCE = "source"
    SINK = "sink"
    STATIC = "static"
    """A batch relation (a stream-static join): read whole in every micro-batch, so it
    neither loses nor repeats records of the stream; it counts for nothing."""


class Origin(enum.StrEnum):
    """Who says what a part can give."""

    SPARK = "spark"
    """Spark's own part, or Delta's or Iceberg's: the table :data:`SPARK_PARTS`."""
    PYTHON = "python"
    """A Python data source that is not epochal's: its :data:`DECLARED_GUARANTEE`."""
    EPOCHAL = "epochal"
    """epochal's connector: its data source checks it when Spark plans it."""
    UNKNOWN = "unknown"
    """A format epochal does not know: at most at-least-once."""


@dataclass(frozen=True)
class Capability:
    """The strongest guarantee a kind of part can give, and why.

    Attributes:
        guarantee: the strongest guarantee.
        why: the reason, for people.
        moves_rows_on_replay: a source whose replay of a batch reads the same records but
            may give them to other Spark partitions than the first attempt did.
    """

    guarantee: Guarantee
    why: str
    moves_rows_on_replay: bool = False


ORDERED_KAFKA_FORMAT = "kafka-ordered"
"""Spark's Kafka source with every batch planned in one order
(:mod:`epochal.spark.ordered_kafka`)."""
_REPLAYABLE = Guarantee.EXACTLY_ONCE
SPARK_PARTS: Mapping[tuple[Role, str], Capability] = MappingProxyType(
    {
        (Role.SOURCE, "kafka"): Capability(
            _REPLAYABLE,
            "replayable: Spark keeps each batch's offsets in its checkpoint and reads the "
            "same offsets again after a failure, while the topic's retention keeps them",
            moves_rows_on_replay=True,
        ),
        (Role.SOURCE, ORDERED_KAFKA_FORMAT): Capability(
            _REPLAYABLE,
            "replayable: Spark's Kafka source, whose batches epochal's provider plans in one "
            "order (by topic, partition and offset), so a replayed batch gives every Spark "
            "partition the records it had",
        ),
        (Role.SOURCE, "file"): Capability(
            _REPLAYABLE,
            "replayable: Spark's file source logs the files of each batch in its checkpoint "
            "and reads the same files again after a failure, while they stay",
        ),
        (Role.SOURCE, "rate"): Capability(
            _REPLAYABLE, "replayable: a batch's rows are computed again from its offsets"
        ),
        (Role.SOURCE, "rate-micro-batch"): Capability(
            _REPLAYABLE, "replayable: a batch's rows are computed again from its offsets"
        ),
        (Role.SOURCE, "delta"): Capability(
            _REPLAYABLE, "replayable: Delta's source reads table versions from the table's log"
        ),
        (Role.SOURCE, "iceberg"): Capability(
            _REPLAYABLE, "replayable: Iceberg's source reads table snapshots by id"
        ),
        (Role.SOURCE, "socket"): Capability(
            Guarantee.NONE,
            "not replayable: the lines a failed batch read are gone from the socket",
        ),
        (Role.SOURCE, "memory"): Capability(
            Guarantee.NONE,
            "not replayable: its rows live in the driver's memory, a new driver has none",
        ),
        (Role.SINK, "kafka"): Capability(
            Guarantee.AT_LEAST_ONCE,
            "Spark's Kafka sink is not transactional: a batch written again after a failure "
            "writes its records again",
        ),
        (Role.SINK, "file"): Capability(
            Guarantee.EXACTLY_ONCE,
            "Spark's file sink commits each batch once in its own log (_spark_metadata); "
            "readers that read the output through that log see each batch once",
        ),
        (Role.SINK, "delta"): Capability(
            Guarantee.EXACTLY_ONCE,
            "Delta's streaming sink is idempotent per batch: it records the query id and "
            "batch id in the table's log and skips a batch it has committed",
        ),
        (Role.SINK, "iceberg"): Capability(
            Guarantee.EXACTLY_ONCE,
            "Iceberg's streaming sink is idempotent per batch: it records the query id and "
            "batch id in the table's snapshots and skips a batch it has committed",
        ),
        (Role.SINK, "console"): Capability(
            Guarantee.NONE, "it prints rows to the driver's output; nothing keeps or checks them"
        ),
        (Role.SINK, "memory"): Capability(
            Guarantee.NONE, "it keeps rows in the driver's memory: a driver failure loses them"
        ),
        (Role.SINK, "noop"): Capability(
            Guarantee.EXACTLY_ONCE, "it writes nothing, so nothing is lost or repeated"
        ),
        (Role.SINK, "foreach"): Capability(
            Guarantee.AT_LEAST_ONCE,
            "Spark calls the writer again for the rows of a batch that did not commit",
        ),
        (Role.SINK, "foreachbatch"): Capability(
            Guarantee.AT_LEAST_ONCE,
            "Spark calls the function again with the same batch id after a failure; it is "
            f"not declared idempotent (writer option {IDEMPOTENT_FOREACH_BATCH}=true)",
        ),
        (Role.SINK, "foreachbatch, idempotent"): Capability(
            Guarantee.EXACTLY_ONCE,
            "the job declares the function idempotent (writer option "
            f"{IDEMPOTENT_FOREACH_BATCH}=true): called again with a batch id it has "
            "written, it writes nothing twice",
        ),
    }
)
"""What Spark's own sources and sinks (and Delta's and Iceberg's, where installed) give inside
an epochal job: ``(role, format family) → Capability``. A format family is the short name
(``kafka``, ``console``), ``file`` for every file format."""

UNDECLARED_PYTHON = Capability(
    Guarantee.AT_LEAST_ONCE,
    f"a Python data source that declares nothing ({DECLARED_GUARANTEE} on its class): Spark "
    "runs a batch that did not commit again, so at-least-once as long as it keeps PySpark's "
    "contract",
)
UNKNOWN_PART = Capability(
    Guarantee.AT_LEAST_ONCE,
    "epochal does not know it: Spark runs a batch that did not commit again, so at best "
    "at-least-once, as long as it keeps Spark's contract",
)


@dataclass(frozen=True)
class PlanPart:
    """One source, sink or static relation of a streaming query.

    Attributes:
        role: source, sink or static.
        format: the format as Spark knows it (``kafka``, ``json``, ``foreachBatch``,
            ``epochal.map``, a Python data source's name); for a static relation, its plan
            node (``LocalRelation``).
        label: what it is, for people (``Spark's Kafka source (topics: events)``); option
            values only where they are names (topics, paths, host and port), never secrets.
        origin: who says what it gives.
        guarantee: the strongest it can give; ``None`` when it is not judged here (epochal's
            parts, static relations).
        why: the reason for ``guarantee``.
        moves_rows_on_replay: a source whose replayed batch may give its rows to other Spark
            partitions than the first attempt did, with nothing routing them by key between
            it and the sink (:func:`settled_by_partition`).
    """

    role: Role
    format: str
    label: str
    origin: Origin
    guarantee: Guarantee | None
    why: str
    moves_rows_on_replay: bool = False

    @property
    def judged_here(self) -> bool:
        """Whether this package judges it: a source or sink that is not epochal's."""
        return self.guarantee is not None

    @property
    def name(self) -> str:
        """How errors name it: ``sink 'kafka' (Spark's Kafka sink (topic: out))``."""
        return f"{self.role.value} {self.format!r} ({self.label})"

    @property
    def connector(self) -> str:
        """How the job's records name what it is: ``spark:kafka``, ``spark:foreachBatch``,
        ``python:<name>``, ``unknown:<format>``."""
        return f"{self.origin.value}:{self.format}"

    @property
    def part_id(self) -> str:
        """Its id in the job's part records: ``<origin>-<format>-<digest of role, format
        and label>`` (``spark-kafka-1a2b3c4d5e``): the same query gives the same id in every
        run; the label holds no secret, so neither does the id."""
        digest = hashlib.sha1(f"{self.role}|{self.format}|{self.label}".encode()).hexdigest()
        slug = re.sub(r"[^a-z0-9]+", "-", self.format.lower()).strip("-") or "part"
        return f"{self.origin.value}-{slug[:40]}-{digest[:10]}"


@dataclass(frozen=True)
class QueryPlan:
    """The parts of one streaming query: its sources, its static relations and its sink."""

    sources: tuple[PlanPart, ...]
    static: tuple[PlanPart, ...]
    sink: PlanPart

    @property
    def parts(self) -> tuple[PlanPart, ...]:
        """Every part: sources, static relations, then the sink."""
        return (*self.sources, *self.static, self.sink)
