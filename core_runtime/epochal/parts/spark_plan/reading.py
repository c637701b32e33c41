"""Reading a streaming query's parts through py4j: the query of a writer not started yet
(:func:`read_query`), the streaming sources of a plan (:func:`read_plan_sources`), and a query
started but whose sources and sink Spark has not planned yet (:func:`read_started_query`); on
the way, whether a node between a source and the sink routes the source's rows by key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from epochal.parts.spark_plan.capabilities import EPOCHAL_FORMAT_PREFIX, Origin, PlanPart, QueryPlan
from epochal.parts.spark_plan.classification import (
    leaf_options,
    running_sink,
    sink_part,
    source_part,
    static_part,
)
from epochal.parts.spark_plan.judgement import settled_by_partition
from epochal.parts.spark_plan.jvm import Jvm, UnreadablePlanError, private_field, scala_map
from epochal_sdk import ConfigError


def read_query(
    writer: Any, foreach_batch_sink: tuple[str, Mapping[str, str]] | None = None
) -> QueryPlan:
    """Every part of the query that ``writer`` (a PySpark classic ``DataStreamWriter``, not
    started) would start: its streaming sources, the static relations joined to them, and its
    sink. ``foreach_batch_sink``: the connector and options of the epochal ``foreachBatch``
    writer the query's ``foreachBatch`` function is (:func:`epochal.spark.foreach_batch.
    writers_made`): the sink is then that connector's, epochal's own part.

    Raises:
        UnreadablePlanError: ``writer`` is not a classic ``DataStreamWriter`` (a Spark Connect
            writer: its plan is on the Connect server), or its JVM objects are not Spark
            4.3's.
        ConfigError: a Python data source declares a guarantee that is not one.
    """
    jwrite = getattr(writer, "_jwrite", None)
    frame = getattr(writer, "_df", None)
    jdf = getattr(frame, "_jdf", None)
    if jwrite is None or frame is None or jdf is None:
        kind = f"{type(writer).__module__}.{type(writer).__qualname__}"
        raise UnreadablePlanError(
            f"cannot read the streaming query of a {kind}: only a PySpark classic "
            "DataStreamWriter (pyspark.sql.streaming.readwriter) has its plan in this "
            "process; a Spark Connect writer's plan is on the Connect server. Spark's own "
            "sources and sinks of this query are not checked; epochal's own parts still are, "
            "by their data source"
        )
    jvm = Jvm(frame.sparkSession)
    try:
        plan = jdf.queryExecution().analyzed()
        leaves = list(_routed_leaves(plan))
        sources = tuple(
            source_part(leaf, jvm, routed) for leaf, routed in leaves if leaf.isStreaming()
        )
        static = tuple(static_part(leaf) for leaf, _ in leaves if not leaf.isStreaming())
        options = scala_map(private_field(jwrite, "extraOptions"))
        fmt = str(private_field(jwrite, "source"))
        if foreach_batch_sink is not None and fmt.lower() == "foreachbatch":
            connector, writer_options = foreach_batch_sink
            fmt, options = f"{EPOCHAL_FORMAT_PREFIX}{connector}", dict(writer_options)
        sink = sink_part(fmt, options, jvm)
    except (ConfigError, UnreadablePlanError):
        raise
    except Exception as exc:  # py4j: a class or field that is not Spark 4.3's
        raise _unreadable(exc, "classic DataStreamWriter and plan classes") from exc
    return QueryPlan(settled_by_partition(sources, sink, options), static, sink)


def _unreadable(exc: Exception, known: str) -> UnreadablePlanError:
    first = str(exc).splitlines()[0] if str(exc) else repr(exc)
    return UnreadablePlanError(
        f"cannot read the streaming query's plan through py4j ({type(exc).__name__}: "
        f"{first}); this reader knows Spark 4.3's {known}"
    )


def read_plan_sources(spark: Any, plan: Any) -> tuple[PlanPart, ...]:
    """The streaming sources of a JVM ``LogicalPlan`` of ``spark`` (a classic SparkSession):
    an analysed plan, or a started query's (``StreamExecution.logicalPlan``)."""
    jvm = Jvm(spark)
    return tuple(
        source_part(leaf, jvm, routed)
        for leaf, routed in _routed_leaves(plan)
        if leaf.isStreaming()
    )


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
    jvm = Jvm(spark)
    try:
        options = scala_map(private_field(execution, "extraOptions"))
        streaming = []
        static = []
        for leaf, routed in _routed_leaves(private_field(execution, "analyzedPlan")):
            if leaf.isStreaming():
                streaming.append((leaf, source_part(leaf, jvm, routed)))
            else:
                static.append(static_part(leaf))
        sink = running_sink(private_field(execution, "sink"), options, jvm)
        job_options = _runtime_options(options) if sink.origin is Origin.EPOCHAL else {}
        for leaf, source in streaming:
            if source.origin is Origin.EPOCHAL:
                for name, value in _runtime_options(leaf_options(leaf)).items():
                    job_options.setdefault(name, value)
    except (ConfigError, UnreadablePlanError):
        raise
    except Exception as exc:  # py4j: a class or field that is not Spark 4.3's
        raise _unreadable(exc, "StreamExecution and plan classes") from exc
    sources = settled_by_partition(tuple(source for _, source in streaming), sink, options)
    return StartedQuery(QueryPlan(sources, tuple(static), sink), MappingProxyType(job_options))


def _runtime_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``epochal.*`` options among ``options``, by lower-cased name."""
    return {
        str(k).lower(): str(v)
        for k, v in options.items()
        if str(k).lower().startswith(EPOCHAL_FORMAT_PREFIX)
    }


_KEY_ROUTING_NODES = frozenset(
    {
        "Aggregate",
        "Deduplicate",
        "DeduplicateWithinWatermark",
        "FlatMapGroupsWithState",
        "FlatMapGroupsInPandasWithState",
        "FlatMapGroupsInPandas",
        "FlatMapCoGroupsInPandas",
        "TransformWithState",
        "TransformWithStateInPySpark",
    }
)
"""Logical plan nodes that route each row to a Spark partition by a key of the row (a hash
shuffle): after one, the partition a row lands in does not depend on where it came from.
``RepartitionByExpression`` with partition expressions (``repartition(<column>)``) too."""


def _routes_by_key(node: Any) -> bool:
    name = str(node.nodeName())
    if name == "RepartitionByExpression":
        return not node.partitionExpressions().isEmpty()
    return name in _KEY_ROUTING_NODES


def _routed_leaves(plan: Any, routed: bool = False) -> Iterator[tuple[Any, bool]]:
    """The leaf nodes of a JVM logical plan, left to right, each with whether a node on its
    way to the root routes its rows by key."""
    routed = routed or _routes_by_key(plan)
    children = plan.children()
    if children.isEmpty():
        yield plan, routed
        return
    iterator = children.iterator()
    while iterator.hasNext():
        yield from _routed_leaves(iterator.next(), routed)
