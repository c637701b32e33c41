"""The pipelines the conformance kit runs. The driver process imports them by name and reads
their parameters from the job's directory (or, for tests that set it, the environment): the
spec names an epochal connector for the source (``source``) and the sink (``sink``), or any
other format (``source_format``, ``sink_format``: Spark's own ``kafka``, for instance)."""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from epochal.parts.job_context import ENV_JOB_DIR

SPEC_ENV = "EPOCHAL_CONFORMANCE_SPEC"
SPEC_FILE = "conformance.json"
"""The kit writes a scenario's spec into the job's directory: a warm driver (a standby, a
driver of a pool) started before the scenario cannot see it in its environment."""


def _spec() -> dict[str, Any]:
    directory = os.environ.get(ENV_JOB_DIR)
    if directory and os.path.exists(f"{directory}/{SPEC_FILE}"):
        with open(f"{directory}/{SPEC_FILE}") as fh:
            return dict(json.load(fh))
    return dict(json.loads(os.environ[SPEC_ENV]))


SOURCE_JARS_OPTION = "spark.jars"
"""A source option the kit's pipelines take for themselves: jars (comma-separated paths) the
source's format needs, e.g. Spark's Kafka connector for ``format("kafka")``. They are added
to the session (``ADD JAR``) before the source is read, so a driver of the kit's usual
session profile (a warm one of its pool) can read it; Spark never sees the option."""


def _source(spark: Any, spec: dict[str, Any]) -> Any:
    """The spec's source: ``format(spec["source_format"])``, by default the epochal
    connector ``epochal.<spec["source"]>``, with ``spec["source_options"]``."""
    options = dict(spec["source_options"])
    add_jars(spark, options.pop(SOURCE_JARS_OPTION, ""))
    fmt = spec.get("source_format") or f"epochal.{spec['source']}"
    return spark.readStream.format(fmt).options(**options).load()


def _sink(rows: Any, spec: dict[str, Any]) -> Any:
    """The spec's sink: ``format(spec["sink_format"])``, by default the epochal connector
    ``epochal.<spec["sink"]>``, with ``spec["sink_options"]``, in append mode; or, when
    ``spec["sink_path"]`` is ``foreachBatch``, the epochal connector as a ``foreachBatch``
    writer (:func:`_foreach_batch_sink`)."""
    if spec.get("sink_path") == "foreachBatch":
        return _foreach_batch_sink(rows, spec)
    fmt = spec.get("sink_format") or f"epochal.{spec['sink']}"
    return rows.writeStream.format(fmt).options(**spec["sink_options"]).outputMode("append")


def _foreach_batch_sink(rows: Any, spec: dict[str, Any]) -> Any:
    """The epochal connector ``spec["sink"]`` as a ``foreachBatch`` writer
    (:func:`epochal.spark.foreach_batch.foreach_batch`, or the factory of the same signature
    that ``spec["writer"]`` names as ``module:attribute``: a broken writer a test measures
    the kit with), with ``spec["sink_options"]``, in ``spec["output_mode"]`` (default
    append)."""
    from epochal.spark.foreach_batch import foreach_batch

    factory: Any = foreach_batch
    if spec.get("writer"):
        module, _, attribute = str(spec["writer"]).partition(":")
        factory = getattr(importlib.import_module(module), attribute)
    writer = factory(spec["sink"], options=spec["sink_options"])
    return rows.writeStream.foreachBatch(writer).outputMode(spec.get("output_mode", "append"))


def add_jars(spark: Any, jars: str) -> None:
    """Add ``jars`` (comma-separated paths) to a running session: Spark SQL's ``ADD JAR``
    puts them on the class path of the session's data source look-ups in the calling thread
    (and the query threads it starts) and ships them to the executors. Added again on every
    call (a query restarted in place), since only the calling thread sees them; Spark then
    only notes that the jar was added already."""
    for jar in (part.strip() for part in jars.split(",")):
        if jar:
            spark.sql(f"ADD JAR '{jar}'")


def copy(spark: Any) -> Any:
    """source → ``key`` = the record ID, ``value`` = the ID again (then through the spec's
    ``transform``, if it names one: the kit's typed record of the ID) → sink; the rows routed
    by
    ``key`` on the way when the spec says ``route_by_key``, into as many partitions as the
    session's shuffle partitions (a number given, so that adaptive execution does not coalesce
    a small batch into one write task: the kit's crash points need several)."""
    spec = _spec()
    out = _source(spark, spec).selectExpr(
        f"CAST({spec['id_expr']} AS STRING) AS key", f"CAST({spec['id_expr']} AS STRING) AS value"
    )
    if spec.get("route_by_key"):
        out = out.repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), "key")
    if spec.get("transform"):
        out = _transformed(out, spec["transform"])
    return _sink(out, spec)


def _transformed(rows: Any, transform: dict[str, Any]) -> Any:
    """``rows`` through the function ``transform["function"]`` names (``module:attribute``)
    with ``transform["args"]``: a step the kit adds to its pipeline (the typed record,
    :func:`epochal.testing.contract_checks.typed.with_typed_columns`)."""
    module, _, attribute = str(transform["function"]).partition(":")
    function = getattr(importlib.import_module(module), attribute)
    return function(rows, *transform.get("args", ()))


def running_totals(events: Any, key_expr: str, id_column: str = "id") -> Any:
    """A keyed running aggregation in Spark state: for every key updated in a batch, one row
    ``(key, "<count>:<sum of ids>")`` with the totals so far.

    Spark's Python data source sinks take append mode only, so the running aggregation is a
    stateful operator (``applyInPandasWithState``, state in the state store, restored per batch
    version) that emits in append mode, instead of ``groupBy().agg()`` in update mode.
    """
    from pyspark.sql.streaming.state import GroupStateTimeout

    def update(key: tuple[str], frames: Any, state: Any) -> Any:
        import pandas as pd

        count, total = state.get if state.exists else (0, 0)
        for frame in frames:
            count += len(frame)
            total += int(frame[id_column].sum())
        state.update((count, total))
        yield pd.DataFrame({"key": [key[0]], "value": [f"{count}:{total}"]})

    keyed = events.selectExpr(
        f"CAST({key_expr} AS STRING) AS key", f"CAST({id_column} AS BIGINT) AS {id_column}"
    )
    return keyed.groupBy("key").applyInPandasWithState(
        update,
        outputStructType="key string, value string",
        stateStructType="n long, total long",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def aggregate(spark: Any) -> Any:
    """source → running count and ID sum per group (Spark state) → sink.

    A group's last ``value`` is ``"<count>:<sum of ids>"``, so a lost or duplicated record
    shows up in the count and the sum of its group.
    """
    spec = _spec()
    groups = int(spec.get("groups", 10))
    events = _source(spark, spec).selectExpr(f"CAST({spec['id_expr']} AS BIGINT) AS id")
    totals = running_totals(events, f"id % {groups}")
    return _sink(totals, spec)


def group_counts(spark: Any) -> Any:
    """source → per group (``id % groups``): ``key`` = the group, ``value`` =
    ``"<count>:<sum of ids>"`` of every record so far → sink, by ``groupBy().agg()`` in the
    spec's ``output_mode`` (``update``: the groups a batch changed; ``complete``: all). Only a
    ``foreachBatch`` sink takes these modes (Spark's Python data source sinks take append)."""
    spec = _spec()
    groups = int(spec.get("groups", 10))
    events = _source(spark, spec).selectExpr(
        f"CAST(CAST({spec['id_expr']} AS BIGINT) % {groups} AS STRING) AS key",
        f"CAST({spec['id_expr']} AS BIGINT) AS id",
    )
    from pyspark.sql import functions

    counted = (
        events.groupBy("key")
        .agg(functions.count("*").alias("n"), functions.sum("id").alias("total"))
        .selectExpr("key", "CONCAT(CAST(n AS STRING), ':', CAST(total AS STRING)) AS value")
    )
    return _sink(counted, spec)
