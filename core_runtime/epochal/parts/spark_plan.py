"""Every part of a streaming query, read before it starts: its sources and its sink, Spark's
own included, each with the guarantee it can give inside an epochal job.

epochal's own parts (``format("epochal.<name>")``) are checked by epochal's data source when
Spark plans them (:func:`epochal.parts.effective.effective`); this module lists them and
leaves them to that check. Every other part is judged here, from one table
(:data:`SPARK_PARTS`), before the query starts:

* sources: Kafka, files, rate, Delta, Iceberg are replayable (exactly-once); socket and
  memory are not (none);
* sinks: Spark's Kafka sink and ``foreach`` give at-least-once, the file sink exactly-once
  through its own log, ``console`` and ``memory`` none, Delta's and Iceberg's sinks
  exactly-once (idempotent per batch id), ``foreachBatch`` at-least-once unless the job
  declares its function idempotent with the writer option :data:`IDEMPOTENT_FOREACH_BATCH`
  (``epochal.foreachBatchIdempotent`` = ``true``);
* a Python data source that is not epochal's gives what its class declares in the attribute
  :data:`DECLARED_GUARANTEE` (``epochal_guarantee = "exactly-once"``), else at-least-once;
* anything else is unknown: at most at-least-once, so refused under exactly-once.

A batch (static) relation joined to a stream is read whole in every micro-batch: it is listed
with the role ``static`` and counts for nothing.

Use: ``plan = read_query(writer)`` on a PySpark classic ``DataStreamWriter`` that is not
started, then ``verdict = judge(plan.parts, asked, allow_downgrade=...)``; ``verdict.to_json()``
is what a job record shows, :func:`part_records` what the run's store keeps of each part. The
plan is read through py4j from the JVM: the DataFrame's analysed logical plan and the JVM
writer's private fields (``source``, ``extraOptions``). A Spark Connect writer has no JVM
objects in this process: :func:`read_query` raises :class:`UnreadablePlanError`.

A supervised driver reads its query before it starts it. A query started in a plain session
is read once started, before Spark plans its sources and sink (:func:`read_started_query`,
from a ``StreamingQueryListener``'s ``onQueryStarted``, which Spark calls synchronously
before it plans them): :func:`check_session_query` warns about every part below the job's
guarantee and, under exactly-once, writes a refusal that epochal's data source raises when it
plans the query (:func:`session_refusal`). The verdict is kept per driver JVM
(``sessions/<driver>.verdict.json`` in the job's directory) and written again at every query
start, so a query never meets another one's, nor a verdict of an earlier JVM.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import pickle
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from epochal.control import processes
from epochal.control.lease_keeper import DriverProcess
from epochal.parts.job_context import JobContext
from epochal.parts.records import PartRecord
from epochal.state import files
from epochal.state.layout import JobLayout
from epochal_sdk import ConfigError, Guarantee, GuaranteeError

log = logging.getLogger("epochal.parts.spark_plan")

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

_FILE_FORMAT_CLASSES = (
    "org.apache.spark.sql.execution.datasources.FileFormat",
    "org.apache.spark.sql.execution.datasources.v2.FileDataSourceV2",
)
_DATA_SOURCE_REGISTER = "org.apache.spark.sql.sources.DataSourceRegister"
_PYTHON_PROVIDER = "org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2"
_DELTA_PACKAGES = ("org.apache.spark.sql.delta.", "io.delta.")
_ICEBERG_PACKAGES = ("org.apache.iceberg.",)

# The streaming leaves of an analysed plan (a query not started yet) ...
_STREAMING_RELATION_V2 = "org.apache.spark.sql.catalyst.streaming.StreamingRelationV2"
_STREAMING_RELATION_V1 = "org.apache.spark.sql.execution.streaming.runtime.StreamingRelation"
# ... and those of a started query's plan (``StreamExecution.logicalPlan``)
_STREAMING_EXECUTION_RELATION = (
    "org.apache.spark.sql.execution.streaming.runtime.StreamingExecutionRelation"
)
_STREAMING_V2_RELATION = (
    "org.apache.spark.sql.execution.datasources.v2.StreamingDataSourceV2Relation"
)
_STREAMING_V2_SCAN_RELATION = (
    "org.apache.spark.sql.execution.datasources.v2.StreamingDataSourceV2ScanRelation"
)

_STREAM_CLASS_FORMATS = (
    # (JVM class name prefix of a running source's stream, its format)
    ("org.apache.spark.sql.execution.streaming.runtime.MemoryStream", "memory"),
    ("org.apache.spark.sql.execution.streaming.runtime.FileStreamSource", "file"),
    ("org.apache.spark.sql.kafka010.Kafka", "kafka"),
    ("org.apache.spark.sql.execution.streaming.sources.RateStream", "rate"),
    ("org.apache.spark.sql.execution.streaming.sources.RatePerMicroBatch", "rate-micro-batch"),
    ("org.apache.spark.sql.execution.streaming.sources.TextSocket", "socket"),
    ("org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream", "python"),
)
"""What a started query's sources are, by the class of their stream."""


class UnreadablePlanError(Exception):
    """The query's plan cannot be read from this process: a Spark Connect writer (its plan is
    on the Connect server), or a writer whose JVM objects do not look like Spark 4.3's."""


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
    """The strongest guarantee a kind of part can give, and why."""

    guarantee: Guarantee
    why: str


_REPLAYABLE = Guarantee.EXACTLY_ONCE
SPARK_PARTS: Mapping[tuple[Role, str], Capability] = MappingProxyType(
    {
        (Role.SOURCE, "kafka"): Capability(
            _REPLAYABLE,
            "replayable: Spark keeps each batch's offsets in its checkpoint and reads the "
            "same offsets again after a failure, while the topic's retention keeps them; a "
            "replayed batch may give a topic partition's records to another Spark partition "
            "than its first attempt did, so a sink that settles each Spark partition on its "
            "own (epochal's Kafka sink, an idempotent sink's key check) needs the rows routed "
            "by key before it (repartition(<column>), a keyed aggregation)",
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
_CHECKED_AT_PLANNING = (
    "epochal's connector: its data source checks it (the connector's max_guarantee and the "
    "part's 'guarantee' option) when Spark plans the query"
)
_STATIC = "a batch relation, read whole in every micro-batch: it counts for nothing"


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
    """

    role: Role
    format: str
    label: str
    origin: Origin
    guarantee: Guarantee | None
    why: str

    @property
    def judged_here(self) -> bool:
        """Whether this module judges it: a source or sink that is not epochal's."""
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


@dataclass(frozen=True)
class PartResult:
    """What one part runs with in a job.

    Attributes:
        part: the part.
        runs_with: the guarantee it runs with (the job's, or what the part can give when that
            is less and the job allows the downgrade); ``None`` when not judged here.
        downgraded: it gives less than the job asks, and runs so because the job allows it.
    """

    part: PlanPart
    runs_with: Guarantee | None
    downgraded: bool

    def to_json(self) -> dict[str, Any]:
        """The result as JSON values, for the job's record, status and metrics."""
        part = self.part
        return {
            "role": part.role.value,
            "format": part.format,
            "label": part.label,
            "origin": part.origin.value,
            "can_give": part.guarantee.label if part.guarantee is not None else None,
            "runs_with": self.runs_with.label if self.runs_with is not None else None,
            "downgraded": self.downgraded,
            "why": part.why,
        }


@dataclass(frozen=True)
class Verdict:
    """The guarantee a query runs with, as far as the parts judged here go.

    Attributes:
        asked: the job's guarantee.
        allow_downgrade: whether the job accepts less than it asks.
        effective: the weakest of ``asked`` and what every part judged here can give.
            epochal's own parts are not in it: each is checked, and its guarantee recorded,
            by its data source when Spark plans it; the job's guarantee is the weakest of
            this and theirs.
        parts: one result per part, in the order of the plan.
    """

    asked: Guarantee
    allow_downgrade: bool
    effective: Guarantee
    parts: tuple[PartResult, ...]

    def to_json(self) -> dict[str, Any]:
        """The verdict as JSON values, for the job's record, status and metrics."""
        return {
            "asked": self.asked.label,
            "allow_downgrade": self.allow_downgrade,
            "effective": self.effective.label,
            "parts": [result.to_json() for result in self.parts],
        }


def part_records(verdict: Verdict) -> list[PartRecord]:
    """What a run's store keeps of each source and sink judged here (epochal's own parts
    record themselves when planned; static relations count for nothing): the part's
    connector (``spark:kafka``), the guarantee it runs with, its label (where it reads or
    writes, no secrets) as its target, and why it gives what it gives."""
    return [
        PartRecord(
            kind=result.part.role.value,
            part_id=result.part.part_id,
            connector=result.part.connector,
            guarantee=result.runs_with.label,
            contract=result.part.origin.value,
            reason=result.part.why,
            target={"label": result.part.label},
        )
        for result in verdict.parts
        if result.runs_with is not None and result.part.role is not Role.STATIC
    ]


# --- the judgement ------------------------------------------------------------------------


def judge(
    parts: Sequence[PlanPart],
    asked: Guarantee | str,
    *,
    allow_downgrade: bool,
    in_session: bool = False,
) -> Verdict:
    """The guarantee the parts judged here let a job run with.

    Args:
        parts: the query's parts (:attr:`QueryPlan.parts`).
        asked: the job's guarantee.
        allow_downgrade: the job accepts a weaker guarantee than it asks.
        in_session: the query runs in a plain session (its job given in ``epochal.*``
            options): the remedies name those options instead of ``JobConfig``/the CLI.

    Raises:
        GuaranteeError: a part judged here gives less than the job asks and the job does not
            allow the downgrade; the message names every such part, why, and what to do.
    """
    wanted = Guarantee.parse(asked)
    short = below(parts, wanted)
    if short and not allow_downgrade:
        raise GuaranteeError(_refusal(short, wanted, in_session=in_session))
    for part in short:
        assert part.guarantee is not None
        log.warning(
            "%s can give at most %s (%s), but the job asks for %s: running it %s because the "
            "job allows the downgrade",
            part.name,
            part.guarantee.label,
            part.why,
            wanted.label,
            part.guarantee.label,
        )
    results = tuple(
        PartResult(
            part,
            runs_with=min(wanted, part.guarantee) if part.guarantee is not None else None,
            downgraded=part in short,
        )
        for part in parts
    )
    effective = min([wanted, *(p.guarantee for p in parts if p.guarantee is not None)])
    return Verdict(wanted, allow_downgrade, effective, results)


def below(parts: Sequence[PlanPart], wanted: Guarantee) -> list[PlanPart]:
    """The parts judged here that give less than ``wanted``."""
    return [p for p in parts if p.guarantee is not None and p.guarantee < wanted]


def _refusal(short: Sequence[PlanPart], wanted: Guarantee, *, in_session: bool = False) -> str:
    """The message of a refusal, in the words of epochal's own parts' refusals."""
    lowest = min(p.guarantee for p in short if p.guarantee is not None)
    reasons = "; ".join(
        f"{p.name} can give at most {p.guarantee.label} ({p.why})"
        for p in short
        if p.guarantee is not None
    )
    if in_session:
        remedies = [
            f"lower the job's guarantee (.option('epochal.guarantee', '{lowest.label}') on "
            "the query's epochal source or sink)",
            "allow the downgrade for the job (.option('epochal.allowDowngrade', 'true'))",
        ]
    else:
        remedies = [
            f"lower the job's guarantee (--guarantee {lowest.label} / "
            f"JobConfig(guarantee='{lowest.label}'))",
            "allow the downgrade for the job (JobConfig(allow_downgrade=True) / --allow-downgrade)",
        ]
    for part in short:
        remedy = _remedy(part, wanted)
        if remedy not in remedies:
            remedies.append(remedy)
    return (
        f"{reasons}; but the job asks for {wanted.label}. Refusing to start. Either "
        f"{', '.join(remedies[:-1])}, or {remedies[-1]}."
    )


def _remedy(part: PlanPart, wanted: Guarantee) -> str:
    """What else can make ``part`` fit a job that asks for ``wanted``."""
    if part.role is Role.SINK and part.format.lower() == "foreachbatch":
        return (
            "declare the foreachBatch function idempotent, if it is, with "
            f".option('{IDEMPOTENT_FOREACH_BATCH}', 'true')"
        )
    if part.origin is Origin.PYTHON:
        return (
            f"declare the Python data source's guarantee, if it keeps {wanted.label}, with "
            f"the class attribute {DECLARED_GUARANTEE} = '{wanted.label}'"
        )
    return f"use a {part.role.value} that can give {wanted.label}"


# --- reading the plan ----------------------------------------------------------------------


def read_query(writer: Any) -> QueryPlan:
    """Every part of the query that ``writer`` (a PySpark classic ``DataStreamWriter``, not
    started) would start: its streaming sources, the static relations joined to them, and its
    sink.

    Raises:
        UnreadablePlanError: ``writer`` is not a classic ``DataStreamWriter`` (a Spark Connect
            writer: its plan is on the Connect server), or its JVM objects are not Spark
            4.3's.
        ConfigError: a Python data source declares a guarantee that is not one.
    """
    jwrite = getattr(writer, "_jwrite", None)
    frame = getattr(writer, "_df", None)
    jdf = getattr(frame, "_jdf", None)
    if jwrite is None or jdf is None:
        kind = f"{type(writer).__module__}.{type(writer).__qualname__}"
        raise UnreadablePlanError(
            f"cannot read the streaming query of a {kind}: only a PySpark classic "
            "DataStreamWriter (pyspark.sql.streaming.readwriter) has its plan in this "
            "process; a Spark Connect writer's plan is on the Connect server. Spark's own "
            "sources and sinks of this query are not checked; epochal's own parts still are, "
            "by their data source"
        )
    jvm = _Jvm(frame.sparkSession)
    try:
        plan = jdf.queryExecution().analyzed()
        leaves = list(_leaves(plan))
        sources = tuple(_source_part(leaf, jvm) for leaf in leaves if leaf.isStreaming())
        static = tuple(_static_part(leaf) for leaf in leaves if not leaf.isStreaming())
        sink = _sink_part(
            str(_private_field(jwrite, "source")),
            _scala_map(_private_field(jwrite, "extraOptions")),
            jvm,
        )
    except (ConfigError, UnreadablePlanError):
        raise
    except Exception as exc:  # py4j: a class or field that is not Spark 4.3's
        raise _unreadable(exc, "classic DataStreamWriter and plan classes") from exc
    return QueryPlan(sources, static, sink)


def _unreadable(exc: Exception, known: str) -> UnreadablePlanError:
    first = str(exc).splitlines()[0] if str(exc) else repr(exc)
    return UnreadablePlanError(
        f"cannot read the streaming query's plan through py4j ({type(exc).__name__}: "
        f"{first}); this reader knows Spark 4.3's {known}"
    )


def read_plan_sources(spark: Any, plan: Any) -> tuple[PlanPart, ...]:
    """The streaming sources of a JVM ``LogicalPlan`` of ``spark`` (a classic SparkSession):
    an analysed plan, or a started query's (``StreamExecution.logicalPlan``)."""
    jvm = _Jvm(spark)
    return tuple(_source_part(leaf, jvm) for leaf in _leaves(plan) if leaf.isStreaming())


@dataclass(frozen=True)
class StartedQuery:
    """A started query whose sources and sink Spark has not planned yet.

    Attributes:
        plan: its parts.
        job_options: the ``epochal.*`` options of its epochal parts (lower-cased names; the
            sink's over the sources'): the job it runs in, as epochal's data source reads it.
    """

    plan: QueryPlan
    job_options: Mapping[str, str]

    @property
    def has_epochal_part(self) -> bool:
        """Whether one of its sources or its sink is epochal's."""
        return any(part.origin is Origin.EPOCHAL for part in self.plan.parts)


def read_started_query(spark: Any, execution: Any) -> StartedQuery:
    """Every part of a query that has started but whose sources and sink Spark has not
    planned yet (in a ``StreamingQueryListener``'s ``onQueryStarted``): ``execution`` is its
    JVM ``StreamExecution`` (``query._jsq.streamingQuery()``), read through its private
    fields ``analyzedPlan``, ``sink`` and ``extraOptions``.

    Raises:
        UnreadablePlanError: its JVM objects are not Spark 4.3's.
        ConfigError: a Python data source declares a guarantee that is not one.
    """
    jvm = _Jvm(spark)
    try:
        options = _scala_map(_private_field(execution, "extraOptions"))
        streaming = []
        static = []
        for leaf in _leaves(_private_field(execution, "analyzedPlan")):
            if leaf.isStreaming():
                streaming.append((leaf, _source_part(leaf, jvm)))
            else:
                static.append(_static_part(leaf))
        sink = _running_sink(_private_field(execution, "sink"), options, jvm)
        job_options = _runtime_options(options) if sink.origin is Origin.EPOCHAL else {}
        for leaf, source in streaming:
            if source.origin is Origin.EPOCHAL:
                for name, value in _runtime_options(_leaf_options(leaf)).items():
                    job_options.setdefault(name, value)
    except (ConfigError, UnreadablePlanError):
        raise
    except Exception as exc:  # py4j: a class or field that is not Spark 4.3's
        raise _unreadable(exc, "StreamExecution and plan classes") from exc
    plan = QueryPlan(tuple(source for _, source in streaming), tuple(static), sink)
    return StartedQuery(plan, MappingProxyType(job_options))


# --- the check of a query started in a plain session ------------------------------------

SESSION_VERDICT_SUFFIX = ".verdict.json"
"""A session driver's verdict: ``sessions/<driver>.verdict.json`` in the job's directory,
beside the driver's session record (:mod:`epochal.control.lease_keeper`)."""


def session_driver(spark: Any) -> DriverProcess:
    """The driver JVM of the classic SparkSession ``spark``, as its Python workers name it
    (:meth:`DriverProcess.current`): its pid comes from the JVM itself, so it is right whether
    Python started the JVM (``python app.py``) or the JVM started Python (``spark-submit``)."""
    pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    return DriverProcess(pid, processes.start_ticks(pid) or 0)


def session_verdict_path(job_dir: str, driver: DriverProcess) -> str:
    """Where the session check keeps ``driver``'s verdict for the job in ``job_dir``."""
    snapshot_dir, _, name = job_dir.rstrip("/").rpartition("/")
    sessions = JobLayout(snapshot_dir, name).sessions
    return os.path.join(sessions, f"{driver.key}{SESSION_VERDICT_SUFFIX}")


def check_session_query(spark: Any, query_id: str, driver: DriverProcess) -> dict[str, Any] | None:
    """Check a query just started in a plain session (``epochal.register``'s listener calls
    it from ``onQueryStarted``, before Spark plans the query's sources and sink).

    A query with an epochal source or sink runs in the job its ``epochal.*`` options give
    (:meth:`JobContext.current`). Every part judged here that gives less than that job's
    guarantee is named in a warning (the driver's log). Under exactly-once, unless the job
    allows the downgrade (``epochal.allowDowngrade``), the query is refused: the refusal is
    written to the driver's verdict in the job's directory, and epochal's data source raises
    it as a ``GuaranteeError`` when Spark plans the query, before any batch runs
    (:func:`session_refusal`). The verdict is written at every start of a query of the job,
    refusing or not, so a later query of the same driver never meets an earlier one's.

    Returns:
        the verdict written (also when the job has no directory to write it to), or None when
        the query has no epochal part (it is none of epochal's business).
    """
    query = spark.streams.get(query_id)
    if query is None:
        return None
    started = read_started_query(spark, query._jsq.streamingQuery())
    if not started.has_epochal_part:
        return None
    context = JobContext.current(started.job_options)
    asked, parts = context.guarantee, started.plan.parts
    short = below(parts, asked)
    refused = bool(short) and asked is Guarantee.EXACTLY_ONCE and not context.allow_downgrade
    message = _refusal(short, asked, in_session=True) if refused else None
    name = str(query.name or query_id)
    for part in short:
        assert part.guarantee is not None
        log.warning(
            "epochal: query %r of job %r: %s can give at most %s (%s), below the job's "
            "guarantee %s%s",
            name,
            context.job,
            part.name,
            part.guarantee.label,
            part.why,
            asked.label,
            "; the query is refused before its first batch" if refused else "",
        )
    verdict = Verdict(
        asked,
        context.allow_downgrade,
        min([asked, *(p.guarantee for p in short if p.guarantee is not None)]),
        tuple(
            PartResult(p, min(asked, p.guarantee) if p.guarantee is not None else None, p in short)
            for p in parts
        ),
    )
    written = {
        "driver": driver.key,
        "job": context.job,
        "query_id": query_id,
        "run_id": str(query.runId),
        "query_name": name,
        "refused": message,
        "verdict": verdict.to_json(),
        "written": time.time(),
    }
    if context.job_dir:
        path = session_verdict_path(context.job_dir, driver)
        files.makedirs(os.path.dirname(path))
        temporary = f"{path}.{os.getpid()}.tmp"
        with files.open_private(temporary) as fh:
            json.dump(written, fh)
        os.replace(temporary, path)
    return written


def session_refusal(context: JobContext) -> str | None:
    """The refusal the session check wrote for the query this process's driver JVM plans now
    (:func:`check_session_query`), or None: for a supervised run (its driver judged the
    query before it started it), a job without a directory, no verdict, or a verdict that
    does not refuse. Read by epochal's data source when Spark plans a streaming read or
    write."""
    if context.supervised or not context.job_dir:
        return None
    path = session_verdict_path(context.job_dir, DriverProcess.current())
    try:
        with open(path) as fh:
            found = json.load(fh)
    except (OSError, ValueError):
        return None
    refusal = found.get("refused") if isinstance(found, dict) else None
    return str(refusal) if refusal else None


class _Jvm:
    """The JVM side of a classic SparkSession, and the look-ups the reader makes there."""

    def __init__(self, spark: Any) -> None:
        self.jvm = spark._jvm
        self.gateway = spark.sparkContext._gateway
        self.session = spark._jsparkSession
        self.conf = self.session.sessionState().conf()

    def java_class(self, name: str) -> Any:
        return self.jvm.java.lang.Class.forName(name)

    def is_a(self, cls: Any, names: Sequence[str]) -> bool:
        """Whether the JVM class ``cls`` is (a subclass of) one of the classes ``names``."""
        return any(self.java_class(name).isAssignableFrom(cls) for name in names)

    def provider_class(self, name: str) -> Any | None:
        """The class Spark uses for ``format(name)``, or None where Spark finds none."""
        try:
            return self.jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                name, self.conf
            )
        except Exception:  # Py4JJavaError: no such data source here
            return None

    def short_name(self, provider: Any) -> str | None:
        """A provider instance's ``DataSourceRegister.shortName()``, if it has one."""
        if self.java_class(_DATA_SOURCE_REGISTER).isInstance(provider):
            return str(provider.shortName())
        return None

    def short_name_of_class(self, cls: Any) -> str | None:
        """The short name of a provider class (Spark creates providers the same way)."""
        if not self.java_class(_DATA_SOURCE_REGISTER).isAssignableFrom(cls):
            return None
        no_classes = self.gateway.new_array(self.jvm.java.lang.Class, 0)
        no_arguments = self.gateway.new_array(self.jvm.java.lang.Object, 0)
        try:
            return str(cls.getDeclaredConstructor(no_classes).newInstance(no_arguments).shortName())
        except Exception:  # no constructor without arguments: Spark could not create it either
            return None

    def python_data_source(self, name: str) -> Any | None:
        """The session's Python data source ``name`` (a ``UserDefinedPythonDataSource``)."""
        manager = self.session.sessionState().dataSourceManager()
        return manager.lookupDataSource(name) if manager.dataSourceExists(name) else None


def _leaves(plan: Any) -> Iterator[Any]:
    """The leaf nodes of a JVM logical plan, left to right."""
    children = plan.children()
    if children.isEmpty():
        yield plan
        return
    iterator = children.iterator()
    while iterator.hasNext():
        yield from _leaves(iterator.next())


def _source_part(leaf: Any, jvm: _Jvm) -> PlanPart:
    """The source a streaming leaf of the plan reads."""
    kind = leaf.getClass().getName()
    if kind == _STREAMING_RELATION_V2:
        return _v2_source(leaf, jvm)
    if kind == _STREAMING_RELATION_V1:
        return _v1_source(leaf, jvm)
    if kind == _STREAMING_EXECUTION_RELATION:
        return _running_source(leaf.source(), None, jvm)
    if kind in (_STREAMING_V2_RELATION, _STREAMING_V2_SCAN_RELATION):
        relation = leaf.relation() if kind == _STREAMING_V2_SCAN_RELATION else leaf
        stream = leaf.stream() if kind == _STREAMING_V2_SCAN_RELATION else None
        return _running_source(stream, relation.table(), jvm)
    return _unknown(Role.SOURCE, str(leaf.nodeName()), f"a streaming plan node {kind}")


def _v2_source(leaf: Any, jvm: _Jvm) -> PlanPart:
    """``StreamingRelationV2``: a DSv2 source (Kafka, rate, socket, memory, Python ones)."""
    name = str(leaf.sourceName())
    options = {str(k): str(v) for k, v in leaf.extraOptions().asCaseSensitiveMap().items()}
    if leaf.source().isEmpty():  # a catalog table: what its class says
        table = leaf.table()
        return _classify(Role.SOURCE, str(table.name()), table.getClass().getName(), options)
    provider = leaf.source().get()
    provider_class = provider.getClass().getName()
    if provider_class == _PYTHON_PROVIDER:
        return _python_part(Role.SOURCE, name, provider.source())
    short = jvm.short_name(provider) or name
    return _classify(Role.SOURCE, short, provider_class, options)


def _v1_source(leaf: Any, jvm: _Jvm) -> PlanPart:
    """``StreamingRelation``: a DSv1 source (Spark's file source, Delta's)."""
    source = leaf.dataSource()
    provider = source.providingClass()
    options = _scala_map(source.options())
    name = str(source.className())
    if jvm.is_a(provider, _FILE_FORMAT_CLASSES):
        short = jvm.short_name_of_class(provider) or name
        return _file_part(Role.SOURCE, short, options)
    short = jvm.short_name_of_class(provider) or name
    return _classify(Role.SOURCE, short, provider.getName(), options)


def _running_source(stream: Any | None, table: Any | None, jvm: _Jvm) -> PlanPart:
    """A source of a started query, by the class of its stream (or of its table)."""
    table_name = str(table.name()) if table is not None else ""
    classes = [x.getClass().getName() for x in (stream, table) if x is not None]
    for prefix, fmt in _STREAM_CLASS_FORMATS:
        if any(name.startswith(prefix) for name in classes):
            if fmt == "python":  # PythonTable.name(): the data source's short name
                return _python_part(Role.SOURCE, table_name, jvm.python_data_source(table_name))
            if fmt == "file":
                return _file_part(Role.SOURCE, "file", {})
            return _classify(Role.SOURCE, fmt, classes[0], {})
    return _classify(Role.SOURCE, table_name or classes[0], classes[-1], {})


_PYTHON_TABLE = "org.apache.spark.sql.execution.datasources.v2.python.PythonTable"
_FILE_STREAM_SINK = "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink"
_SINK_CLASS_FORMATS = (
    # (JVM class name prefix of a started query's sink, its format)
    ("org.apache.spark.sql.kafka010.", "kafka"),
    ("org.apache.spark.sql.execution.streaming.ConsoleTable", "console"),
    ("org.apache.spark.sql.execution.streaming.sources.MemorySink", "memory"),
    ("org.apache.spark.sql.execution.streaming.sources.ForeachWriterTable", "foreach"),
    ("org.apache.spark.sql.execution.streaming.sources.ForeachBatchSink", "foreachBatch"),
    ("org.apache.spark.sql.execution.datasources.noop.NoopTable", "noop"),
)
"""What a started query's sink is, by its class (``StreamExecution.sink``)."""


def _running_sink(sink: Any, options: Mapping[str, str], jvm: _Jvm) -> PlanPart:
    """The sink of a started query (a ``Table`` or a DSv1 ``Sink``), with the writer's
    options."""
    class_name = sink.getClass().getName()
    if class_name == _PYTHON_TABLE:  # PythonTable.name(): the data source's short name
        name = str(sink.name())
        return _python_part(Role.SINK, name, jvm.python_data_source(name))
    if class_name.startswith(_FILE_STREAM_SINK):
        fmt = jvm.short_name(_private_field(sink, "fileFormat")) or "file"
        return _file_part(Role.SINK, fmt, options)
    for prefix, fmt in _SINK_CLASS_FORMATS:
        if class_name.startswith(prefix):
            return _sink_part(fmt, options, jvm)
    return _classify(Role.SINK, str(sink.getClass().getSimpleName()), class_name, options)


def _leaf_options(leaf: Any) -> dict[str, str]:
    """The options of a streaming leaf of an analysed plan (a DSv2 or DSv1 relation)."""
    kind = leaf.getClass().getName()
    if kind == _STREAMING_RELATION_V2:
        return {str(k): str(v) for k, v in leaf.extraOptions().asCaseSensitiveMap().items()}
    if kind == _STREAMING_RELATION_V1:
        return _scala_map(leaf.dataSource().options())
    return {}


def _runtime_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``epochal.*`` options among ``options``, by lower-cased name."""
    return {
        str(k).lower(): str(v)
        for k, v in options.items()
        if str(k).lower().startswith(EPOCHAL_FORMAT_PREFIX)
    }


def _sink_part(fmt: str, options: Mapping[str, str], jvm: _Jvm) -> PlanPart:
    """The sink of a writer whose ``format`` (or ``foreach``/``foreachBatch``) is ``fmt``."""
    lowered = fmt.lower()
    if lowered == "foreachbatch":
        idempotent = options.get(IDEMPOTENT_FOREACH_BATCH.lower(), "").strip().lower() == "true"
        key = "foreachbatch, idempotent" if idempotent else "foreachbatch"
        label = "a foreachBatch function" + (", declared idempotent" if idempotent else "")
        return _known(Role.SINK, fmt, label, SPARK_PARTS[(Role.SINK, key)])
    if lowered.startswith(EPOCHAL_FORMAT_PREFIX) or (Role.SINK, lowered) in SPARK_PARTS:
        return _classify(Role.SINK, fmt, "", options)
    if lowered in FILE_FORMATS:
        return _file_part(Role.SINK, fmt, options)
    provider = jvm.provider_class(fmt)
    if provider is None:
        return _classify(Role.SINK, fmt, "", options)
    if provider.getName() == _PYTHON_PROVIDER:
        return _python_part(Role.SINK, fmt, jvm.python_data_source(fmt))
    short = jvm.short_name_of_class(provider) or fmt
    if jvm.is_a(provider, _FILE_FORMAT_CLASSES):
        return _file_part(Role.SINK, short, options)
    return _classify(Role.SINK, short, provider.getName(), options)


def _classify(role: Role, fmt: str, class_name: str, options: Mapping[str, str]) -> PlanPart:
    """A part by its short name and provider class: epochal's, in the table, or unknown."""
    lowered = fmt.lower()
    if lowered.startswith(EPOCHAL_FORMAT_PREFIX):
        connector = fmt[len(EPOCHAL_FORMAT_PREFIX) :]
        return PlanPart(
            role,
            fmt,
            f"epochal's {connector!r} connector",
            Origin.EPOCHAL,
            None,
            _CHECKED_AT_PLANNING,
        )
    if lowered in FILE_FORMATS:
        return _file_part(role, fmt, options)
    family = lowered
    if lowered == "delta" or class_name.startswith(_DELTA_PACKAGES):
        family = "delta"
    elif lowered == "iceberg" or class_name.startswith(_ICEBERG_PACKAGES):
        family = "iceberg"
    capability = SPARK_PARTS.get((role, family))
    if capability is None:
        what = f"format {fmt!r}" + (f" ({class_name})" if class_name else "")
        return _unknown(role, fmt, what)
    return _known(role, fmt, _spark_label(role, family, options), capability)


def _known(role: Role, fmt: str, label: str, capability: Capability) -> PlanPart:
    return PlanPart(role, fmt, label, Origin.SPARK, capability.guarantee, capability.why)


def _unknown(role: Role, fmt: str, what: str) -> PlanPart:
    return PlanPart(role, fmt, what, Origin.UNKNOWN, UNKNOWN_PART.guarantee, UNKNOWN_PART.why)


def _file_part(role: Role, fmt: str, options: Mapping[str, str]) -> PlanPart:
    path = options.get("path")
    label = f"Spark's {fmt} file {role.value}" + (f" ({_safe_path(path)})" if path else "")
    return _known(role, fmt, label, SPARK_PARTS[(role, "file")])


def _static_part(leaf: Any) -> PlanPart:
    node = str(leaf.nodeName())
    return PlanPart(Role.STATIC, node, f"a batch relation ({node})", Origin.SPARK, None, _STATIC)


_SPARK_NAMES = {
    "kafka": "Kafka",
    "rate": "rate",
    "rate-micro-batch": "rate-micro-batch",
    "socket": "socket",
    "memory": "memory",
    "console": "console",
    "noop": "noop",
    "foreach": "foreach",
    "delta": "Delta",
    "iceberg": "Iceberg",
}


def _spark_label(role: Role, family: str, options: Mapping[str, str]) -> str:
    """``Spark's Kafka source (topics: a,b)``: names from the options, never other values."""
    owner = {"delta": "Delta's", "iceberg": "Iceberg's"}.get(family, "Spark's")
    label = f"{owner} {_SPARK_NAMES.get(family, family)} {role.value}"
    lowered = {k.lower(): v for k, v in options.items()}
    detail = ""
    if family == "kafka" and role is Role.SOURCE:
        topics = lowered.get("subscribe") or lowered.get("subscribepattern") or ""
        detail = f"topics: {topics}" if topics else ""
    elif family == "kafka":
        topic = lowered.get("topic")
        detail = f"topic: {topic}" if topic else "topic: each row's 'topic' column"
    elif family == "socket" and lowered.get("host"):
        detail = f"{lowered['host']}:{lowered.get('port', '')}"
    elif family in ("delta", "iceberg") and lowered.get("path"):
        detail = _safe_path(lowered["path"])
    return f"{label} ({detail})" if detail else label


def _safe_path(path: str) -> str:
    """A path or URI without user information (``s3a://key:secret@bucket/x``)."""
    parts = urlsplit(path)
    if parts.username is None and parts.password is None:
        return path
    return urlunsplit(parts._replace(netloc=parts.hostname or ""))


def _python_part(role: Role, name: str, data_source: Any | None) -> PlanPart:
    """A Python data source: epochal's (checked when planned), or one judged by what its class
    declares (``UserDefinedPythonDataSource`` holds the class, pickled)."""
    if name.lower().startswith(EPOCHAL_FORMAT_PREFIX):
        return _classify(role, name, "", {})
    cls, unreadable = _python_class(data_source)
    label = f"Python data source {name!r}" + (
        f" ({cls.__module__}.{cls.__qualname__})" if cls is not None else ""
    )
    declared = getattr(cls, DECLARED_GUARANTEE, None) if cls is not None else None
    if declared is None:
        why = UNDECLARED_PYTHON.why + (f"; {unreadable}" if unreadable else "")
        return PlanPart(role, name, label, Origin.PYTHON, UNDECLARED_PYTHON.guarantee, why)
    try:
        guarantee = Guarantee.parse(declared)
    except ValueError as exc:
        raise ConfigError(
            label,
            f"{DECLARED_GUARANTEE} (class attribute)",
            str(exc),
            "Set it to 'exactly-once', 'at-least-once' or 'none', or remove it "
            "(a Python data source that declares nothing counts as at-least-once)",
        ) from None
    why = f"its class declares {DECLARED_GUARANTEE} = {guarantee.label!r}"
    return PlanPart(role, name, label, Origin.PYTHON, guarantee, why)


def _python_class(data_source: Any | None) -> tuple[type | None, str]:
    """The class of a registered Python data source, and why not when it cannot be read."""
    if data_source is None:
        return None, "its class is not registered in this session"
    try:
        command = data_source.dataSourceCls().command()
        loaded = pickle.loads(bytes(command.unsafeArray()))
    except Exception as exc:  # not importable in the driver, or not a pickled class
        return None, f"its class cannot be read in the driver ({type(exc).__name__})"
    if isinstance(loaded, tuple) and loaded:  # (class, return type) in some PySpark versions
        loaded = loaded[0]
    if not isinstance(loaded, type):
        return None, "its registration holds no class"
    return loaded, ""


# --- py4j helpers -------------------------------------------------------------------------


def _private_field(obj: Any, name: str) -> Any:
    """The value of a JVM object's private field, by Java reflection."""
    cls = obj.getClass()
    while cls is not None:
        for field in cls.getDeclaredFields():
            if field.getName() == name:
                field.setAccessible(True)
                return field.get(obj)
        cls = cls.getSuperclass()
    raise UnreadablePlanError(
        f"{obj.getClass().getName()} has no field {name!r}: this reader knows Spark 4.3's "
        "classic DataStreamWriter"
    )


def _scala_map(value: Any) -> dict[str, str]:
    """A Scala ``Map[String, String]`` (a ``CaseInsensitiveMap`` too) as a dict."""
    result = {}
    iterator = value.iterator()
    while iterator.hasNext():
        pair = iterator.next()
        result[str(pair._1())] = str(pair._2())
    return result
