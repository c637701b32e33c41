"""What each source, sink and static relation of a JVM plan is, as a :class:`PlanPart`: by its
plan node, provider class or stream class, and its format and options. Spark's own parts (and
Delta's and Iceberg's) get their capability from :data:`SPARK_PARTS`, a Python data source what
its class declares, epochal's own parts are left to their data source, anything else is
unknown. A part's label names where it reads or writes, never a secret.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from epochal.parts.spark_plan.capabilities import (
    DECLARED_GUARANTEE,
    EPOCHAL_FORMAT_PREFIX,
    FILE_FORMATS,
    IDEMPOTENT_FOREACH_BATCH,
    ORDERED_KAFKA_FORMAT,
    SPARK_PARTS,
    UNDECLARED_PYTHON,
    UNKNOWN_PART,
    Capability,
    Origin,
    PlanPart,
    Role,
)
from epochal.parts.spark_plan.jvm import Jvm, private_field, scala_map
from epochal_sdk import ConfigError, Guarantee

_FILE_FORMAT_CLASSES = (
    "org.apache.spark.sql.execution.datasources.FileFormat",
    "org.apache.spark.sql.execution.datasources.v2.FileDataSourceV2",
)
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
    ("org.epochal.spark.OrderedKafkaProvider", ORDERED_KAFKA_FORMAT),
    ("org.apache.spark.sql.kafka010.Kafka", "kafka"),
    ("org.apache.spark.sql.execution.streaming.sources.RateStream", "rate"),
    ("org.apache.spark.sql.execution.streaming.sources.RatePerMicroBatch", "rate-micro-batch"),
    ("org.apache.spark.sql.execution.streaming.sources.TextSocket", "socket"),
    ("org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream", "python"),
)
"""What a started query's sources are, by the class of their stream."""


_STREAMING = "org.apache.spark.sql.execution.streaming."
_MOVED_IN_SPARK_4_1 = (
    # (a class name's start on Spark 4.0, the same class's on 4.1+)
    *(
        (f"{_STREAMING}{name}", f"{_STREAMING}runtime.{name}")
        for name in (
            "StreamingRelation",
            "StreamingExecutionRelation",
            "MemoryStream",
            "FileStreamSource",
        )
    ),
    (f"{_STREAMING}FileStreamSink", f"{_STREAMING}sinks.FileStreamSink"),
)
"""The streaming classes Spark 4.1 moved into ``runtime`` and ``sinks`` packages."""


def class_name(obj: Any) -> str:
    """The JVM class name of ``obj`` as Spark 4.1+ spells it, so that one list of names here
    serves every release (Spark 4.0 keeps :data:`_MOVED_IN_SPARK_4_1`'s classes in
    ``execution.streaming`` itself)."""
    name = str(obj.getClass().getName())
    for old, new in _MOVED_IN_SPARK_4_1:
        if name.startswith(old) and not name.startswith(new):
            return new + name[len(old) :]
    return name


_CHECKED_AT_PLANNING = (
    "epochal's connector: its data source checks it (the connector's max_guarantee and the "
    "part's 'guarantee' option) when Spark plans the query"
)
_STATIC = "a batch relation, read whole in every micro-batch: it counts for nothing"


def source_part(leaf: Any, jvm: Jvm, routed: bool = False) -> PlanPart:
    """The source a streaming leaf of the plan reads (``routed``: a node on its way to the
    root routes its rows by key)."""
    part = _source_of_leaf(leaf, jvm)
    if routed and part.moves_rows_on_replay:
        return dataclasses.replace(part, moves_rows_on_replay=False)
    return part


def _source_of_leaf(leaf: Any, jvm: Jvm) -> PlanPart:
    kind = class_name(leaf)
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


def _v2_source(leaf: Any, jvm: Jvm) -> PlanPart:
    """``StreamingRelationV2``: a DSv2 source (Kafka, rate, socket, memory, Python ones)."""
    name = str(leaf.sourceName())
    options = {str(k): str(v) for k, v in leaf.extraOptions().asCaseSensitiveMap().items()}
    if leaf.source().isEmpty():  # a catalog table: what its class says
        table = leaf.table()
        return _classify(Role.SOURCE, str(table.name()), class_name(table), options)
    provider = leaf.source().get()
    provider_class = class_name(provider)
    if provider_class == _PYTHON_PROVIDER:
        return _python_part(Role.SOURCE, name, provider.source())
    short = jvm.short_name(provider) or name
    return _classify(Role.SOURCE, short, provider_class, options)


def _v1_source(leaf: Any, jvm: Jvm) -> PlanPart:
    """``StreamingRelation``: a DSv1 source (Spark's file source, Delta's)."""
    source = leaf.dataSource()
    provider = source.providingClass()
    options = scala_map(source.options())
    name = str(source.className())
    if jvm.is_a(provider, _FILE_FORMAT_CLASSES):
        short = jvm.short_name_of_class(provider) or name
        return _file_part(Role.SOURCE, short, options)
    short = jvm.short_name_of_class(provider) or name
    return _classify(Role.SOURCE, short, provider.getName(), options)


def _running_source(stream: Any | None, table: Any | None, jvm: Jvm) -> PlanPart:
    """A source of a started query, by the class of its stream (or of its table)."""
    table_name = str(table.name()) if table is not None else ""
    classes = [class_name(x) for x in (stream, table) if x is not None]
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


def running_sink(sink: Any, options: Mapping[str, str], jvm: Jvm) -> PlanPart:
    """The sink of a started query (a ``Table`` or a DSv1 ``Sink``), with the writer's
    options."""
    sink_class = class_name(sink)
    if sink_class == _PYTHON_TABLE:  # PythonTable.name(): the data source's short name
        name = str(sink.name())
        return _python_part(Role.SINK, name, jvm.python_data_source(name))
    if sink_class.startswith(_FILE_STREAM_SINK):
        fmt = jvm.short_name(private_field(sink, "fileFormat")) or "file"
        return _file_part(Role.SINK, fmt, options)
    for prefix, fmt in _SINK_CLASS_FORMATS:
        if sink_class.startswith(prefix):
            return sink_part(fmt, options, jvm)
    return _classify(Role.SINK, str(sink.getClass().getSimpleName()), sink_class, options)


def leaf_options(leaf: Any) -> dict[str, str]:
    """The options of a streaming leaf of an analysed plan (a DSv2 or DSv1 relation)."""
    kind = class_name(leaf)
    if kind == _STREAMING_RELATION_V2:
        return {str(k): str(v) for k, v in leaf.extraOptions().asCaseSensitiveMap().items()}
    if kind == _STREAMING_RELATION_V1:
        return scala_map(leaf.dataSource().options())
    return {}


def sink_part(fmt: str, options: Mapping[str, str], jvm: Jvm) -> PlanPart:
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
    return PlanPart(
        role,
        fmt,
        label,
        Origin.SPARK,
        capability.guarantee,
        capability.why,
        capability.moves_rows_on_replay,
    )


def _unknown(role: Role, fmt: str, what: str) -> PlanPart:
    return PlanPart(role, fmt, what, Origin.UNKNOWN, UNKNOWN_PART.guarantee, UNKNOWN_PART.why)


def _file_part(role: Role, fmt: str, options: Mapping[str, str]) -> PlanPart:
    path = options.get("path")
    label = f"Spark's {fmt} file {role.value}" + (f" ({_safe_path(path)})" if path else "")
    return _known(role, fmt, label, SPARK_PARTS[(role, "file")])


def static_part(leaf: Any) -> PlanPart:
    """A batch relation of the plan (``leaf``, not streaming): it counts for nothing."""
    node = str(leaf.nodeName())
    return PlanPart(Role.STATIC, node, f"a batch relation ({node})", Origin.SPARK, None, _STATIC)


_SPARK_NAMES = {
    "kafka": "Kafka",
    ORDERED_KAFKA_FORMAT: "Kafka",
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
    if family in ("kafka", ORDERED_KAFKA_FORMAT) and role is Role.SOURCE:
        topics = lowered.get("subscribe") or lowered.get("subscribepattern") or ""
        detail = ", ".join(
            ([f"topics: {topics}"] if topics else [])
            + (["batches planned in order"] if family == ORDERED_KAFKA_FORMAT else [])
        )
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
