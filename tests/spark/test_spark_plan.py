"""Reading a whole streaming query before it starts (epochal.parts.spark_plan): every source
and the sink, Spark's own included, each with the guarantee it can give; the effective
guarantee is the weakest, and exactly-once with a part that cannot keep it is refused.

One SparkSession for the module. Queries are built and read, not started, except where a
started query's own plan is read. Spark's Kafka connector comes from the integration cache
(the session of ``tests/spark/sessions.py``, which every module here uses); Spark plans a
Kafka source without contacting a broker, so none is started.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epochal.parts.spark_plan import (
    IDEMPOTENT_FOREACH_BATCH,
    Origin,
    PlanPart,
    Role,
    UnreadablePlanError,
    judge,
    read_plan_sources,
    read_query,
)
from epochal.spark import ordered_kafka
from epochal_sdk import ConfigError, Guarantee
from epochal_sdk.errors import GuaranteeError
from tests.spark.sessions import kafka_jars, plain_session

pytestmark = pytest.mark.spark

EXACTLY_ONCE, AT_LEAST_ONCE, NONE = (
    Guarantee.EXACTLY_ONCE,
    Guarantee.AT_LEAST_ONCE,
    Guarantee.NONE,
)
SECRET = "sasl-secret-7f3a"


KAFKA_JARS, NO_KAFKA = kafka_jars()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = plain_session("test_spark_plan", "WARN")
    yield session
    session.stop()


def _rate(spark: Any) -> Any:
    return spark.readStream.format("rate").load()


def _only(parts: tuple[PlanPart, ...]) -> PlanPart:
    assert len(parts) == 1, parts
    return parts[0]


def _memory_stream(spark: Any) -> Any:
    """A DataFrame over Spark's MemoryStream (no Python API: built through the JVM)."""
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    stream = jvm.org.apache.spark.sql.execution.streaming.runtime.MemoryStream.apply(
        jvm.org.apache.spark.sql.Encoders.INT(), spark._jsparkSession
    )
    return DataFrame(stream.toDF(), spark)


def _python_data_source(spark: Any, name: str, declared: str | None) -> type:
    """A Python data source that is not epochal's, registered as ``name``; it declares
    ``declared`` (``epochal_guarantee``) unless that is None. Defined in a function so that
    PySpark pickles it by value for its workers."""
    from pyspark.sql.datasource import DataSource

    class Ticks(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return "n int"

    if declared is not None:
        Ticks.epochal_guarantee = declared
    spark.dataSource.register(Ticks)
    return Ticks


def _refusal(parts: tuple[PlanPart, ...], asked: Guarantee = EXACTLY_ONCE) -> str:
    with pytest.raises(GuaranteeError) as refused:
        judge(parts, asked, allow_downgrade=False)
    return str(refused.value)


# --- sources --------------------------------------------------------------------------------


def test_socket_source_gives_none_and_is_refused_under_exactly_once(spark: Any) -> None:
    frame = spark.readStream.format("socket").option("host", "localhost").option("port", 9).load()
    plan = read_query(frame.writeStream.format("noop"))
    source = _only(plan.sources)
    assert (source.role, source.format, source.origin) == (Role.SOURCE, "socket", Origin.SPARK)
    assert source.guarantee is NONE
    assert source.label == "Spark's socket source (localhost:9)"
    message = _refusal(plan.parts)
    assert "source 'socket' (Spark's socket source (localhost:9)) can give at most none" in message
    assert "not replayable" in message and "the job asks for exactly-once" in message
    assert "--guarantee none" in message and "--allow-downgrade" in message
    assert "JobConfig(allow_downgrade=True)" in message


def test_memory_source_gives_none(spark: Any) -> None:
    plan = read_query(_memory_stream(spark).writeStream.format("noop"))
    source = _only(plan.sources)
    assert (source.format, source.guarantee) == ("memory", NONE)
    assert "driver's memory" in source.why
    assert judge(plan.parts, AT_LEAST_ONCE, allow_downgrade=True).effective is NONE


def test_rate_source_is_replayable(spark: Any) -> None:
    plan = read_query(_rate(spark).writeStream.format("noop"))
    source = _only(plan.sources)
    assert (source.format, source.origin, source.guarantee) == ("rate", Origin.SPARK, EXACTLY_ONCE)
    verdict = judge(plan.parts, EXACTLY_ONCE, allow_downgrade=False)
    assert verdict.effective is EXACTLY_ONCE
    assert [r.runs_with for r in verdict.parts] == [EXACTLY_ONCE, EXACTLY_ONCE]


def test_json_file_source_is_replayable(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"a": 1}\n')
    frame = spark.readStream.format("json").schema("a int").load(str(tmp_path / "in"))
    source = _only(read_query(frame.writeStream.format("noop")).sources)
    assert (source.format, source.origin, source.guarantee) == ("json", Origin.SPARK, EXACTLY_ONCE)
    assert source.label == f"Spark's json file source ({tmp_path / 'in'})"
    assert "logs the files of each batch" in source.why


@pytest.mark.skipif(not KAFKA_JARS, reason=NO_KAFKA or "no Kafka jars")
def test_kafka_source_is_replayable_and_kafka_sink_at_least_once(spark: Any) -> None:
    frame = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", "localhost:1")  # nothing listens: not contacted
        .option("subscribe", "events")
        .option("kafka.sasl.jaas.config", SECRET)
        .load()
    )
    writer = (
        frame.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", "localhost:1")
        .option("topic", "out")
        .option("kafka.sasl.jaas.config", SECRET)
    )
    plan = read_query(writer)
    source = _only(plan.sources)
    assert (source.format, source.guarantee) == ("kafka", EXACTLY_ONCE)
    assert source.label == "Spark's Kafka source (topics: events)"
    assert (plan.sink.format, plan.sink.guarantee) == ("kafka", AT_LEAST_ONCE)
    assert plan.sink.label == "Spark's Kafka sink (topic: out)"
    message = _refusal(plan.parts)
    assert "sink 'kafka'" in message and "source 'kafka'" not in message
    assert "not transactional" in message and "--guarantee at-least-once" in message
    verdict = judge(plan.parts, AT_LEAST_ONCE, allow_downgrade=False)
    assert verdict.effective is AT_LEAST_ONCE
    assert SECRET not in json.dumps(verdict.to_json()) and SECRET not in message


@pytest.mark.skipif(not KAFKA_JARS, reason=NO_KAFKA or "no Kafka jars")
def test_kafka_source_into_a_sink_that_settles_each_partition_needs_rows_routed_by_key(
    spark: Any, map_path: str
) -> None:
    """Spark's Kafka source may give a replayed batch's records to other Spark partitions;
    a sink that settles each partition on its own (epochal's Kafka sink commits in
    ``prepare``; an idempotent sink's keys are checked per partition) makes that
    at-least-once, unless a node routes the rows by key between them. A sink that decides
    the batch as a whole (the map's transactional mode) does not care."""
    rows = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", "localhost:1")  # nothing listens: not contacted
        .option("subscribe", "events")
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
    )

    def into_map(frame: Any, mode: str) -> Any:
        return (
            frame.writeStream.format("epochal.map")
            .option("path", map_path)
            .option("map", "out")
            .option("mode", mode)
        )

    into_kafka = (
        rows.writeStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", "localhost:1")
        .option("topic", "out")
    )
    for writer in (into_map(rows, "idempotent"), into_kafka):
        plan = read_query(writer)
        source = _only(plan.sources)
        assert (source.guarantee, source.moves_rows_on_replay) == (AT_LEAST_ONCE, True)
        assert "settles each Spark partition on its own" in source.why
        message = _refusal(plan.parts)
        assert "source 'kafka'" in message and "route the rows by key" in message
        assert "format('kafka-ordered')" in message
    for writer in (
        into_map(rows.repartition("key"), "idempotent"),
        into_map(
            rows.groupBy("key").count().selectExpr("key", "CAST(count AS STRING) AS value"),
            "idempotent",
        ),
        into_map(rows, "transactional"),
    ):
        plan = read_query(writer)
        assert _only(plan.sources).guarantee is EXACTLY_ONCE
        assert judge(plan.parts, EXACTLY_ONCE, allow_downgrade=False).effective is EXACTLY_ONCE
    round_robin = read_query(into_map(rows.repartition(4), "idempotent"))
    assert _only(round_robin.sources).guarantee is AT_LEAST_ONCE


@pytest.mark.skipif(not KAFKA_JARS, reason=NO_KAFKA or "no Kafka jars")
def test_kafka_source_read_in_order_keeps_exactly_once_into_a_sink_that_settles_each_partition(
    spark: Any,
) -> None:
    """``format("kafka-ordered")`` (:mod:`epochal.spark.ordered_kafka`) plans every batch's
    partitions in one order: straight into epochal's Kafka sink, it stays exactly-once."""
    rows = (
        spark.readStream.format(ordered_kafka.FORMAT)
        .option("kafka.bootstrap.servers", "localhost:1")  # nothing listens: not contacted
        .option("subscribe", "events")
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
    )
    plan = read_query(
        rows.writeStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", "localhost:1")
        .option("topic", "out")
    )
    source = _only(plan.sources)
    assert (source.format, source.origin, source.guarantee, source.moves_rows_on_replay) == (
        "kafka-ordered",
        Origin.SPARK,
        EXACTLY_ONCE,
        False,
    )
    assert source.label == "Spark's Kafka source (topics: events, batches planned in order)"
    assert judge(plan.parts, EXACTLY_ONCE, allow_downgrade=False).effective is EXACTLY_ONCE


def test_kafka_sink_is_at_least_once_by_name(spark: Any) -> None:
    """A writer's format is a name until the query starts: Spark's Kafka sink is known by it
    without its jars."""
    plan = read_query(_rate(spark).writeStream.format("kafka"))
    assert (plan.sink.format, plan.sink.origin, plan.sink.guarantee) == (
        "kafka",
        Origin.SPARK,
        AT_LEAST_ONCE,
    )
    assert plan.sink.label == "Spark's Kafka sink (topic: each row's 'topic' column)"


# --- sinks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["console", "memory"])
def test_console_and_memory_sinks_give_none(spark: Any, fmt: str) -> None:
    plan = read_query(_rate(spark).writeStream.format(fmt))
    assert (plan.sink.role, plan.sink.format, plan.sink.guarantee) == (Role.SINK, fmt, NONE)
    message = _refusal(plan.parts, AT_LEAST_ONCE)
    assert f"sink '{fmt}' (Spark's {fmt} sink) can give at most none" in message
    assert "the job asks for at-least-once" in message


def test_foreach_batch_is_at_least_once_unless_declared_idempotent(spark: Any) -> None:
    def write(batch: Any, batch_id: int) -> None:  # never called: the query is not started
        raise AssertionError("not started")

    plain = read_query(_rate(spark).writeStream.foreachBatch(write))
    assert (plain.sink.format, plain.sink.guarantee) == ("foreachBatch", AT_LEAST_ONCE)
    message = _refusal(plain.parts)
    assert "sink 'foreachBatch' (a foreachBatch function) can give at most at-least-once" in (
        message
    )
    assert f".option('{IDEMPOTENT_FOREACH_BATCH}', 'true')" in message

    declared = read_query(
        _rate(spark).writeStream.foreachBatch(write).option(IDEMPOTENT_FOREACH_BATCH, "true")
    )
    assert declared.sink.guarantee is EXACTLY_ONCE
    assert declared.sink.label == "a foreachBatch function, declared idempotent"
    assert judge(declared.parts, EXACTLY_ONCE, allow_downgrade=False).effective is EXACTLY_ONCE

    other_value = read_query(
        _rate(spark).writeStream.foreachBatch(write).option(IDEMPOTENT_FOREACH_BATCH, "yes")
    )
    assert other_value.sink.guarantee is AT_LEAST_ONCE


def test_foreach_sink_is_at_least_once(spark: Any) -> None:
    plan = read_query(_rate(spark).writeStream.foreach(lambda row: None))
    assert (plan.sink.format, plan.sink.guarantee) == ("foreach", AT_LEAST_ONCE)


def test_file_sink_is_exactly_once_through_its_log(spark: Any, tmp_path: Path) -> None:
    plan = read_query(_rate(spark).writeStream.format("parquet").option("path", str(tmp_path)))
    assert (plan.sink.format, plan.sink.guarantee) == ("parquet", EXACTLY_ONCE)
    assert plan.sink.label == f"Spark's parquet file sink ({tmp_path})"
    assert "_spark_metadata" in plan.sink.why


def test_a_file_format_by_class_name_is_a_file_sink(spark: Any, tmp_path: Path) -> None:
    fmt = "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"
    plan = read_query(_rate(spark).writeStream.format(fmt).option("path", str(tmp_path)))
    assert (plan.sink.format, plan.sink.guarantee) == ("parquet", EXACTLY_ONCE)


# --- epochal's parts, Python data sources, unknown parts -------------------------------------


def test_epochal_parts_are_left_to_epochals_data_source(spark: Any, map_path: str) -> None:
    frame = (
        spark.readStream.format("epochal.map")
        .option("path", map_path)
        .option("map", "input")
        .load()
    )
    writer = frame.writeStream.format("epochal.map").option("path", map_path).option("map", "out")
    plan = read_query(writer)
    for part in (_only(plan.sources), plan.sink):
        assert (part.format, part.origin, part.guarantee) == ("epochal.map", Origin.EPOCHAL, None)
        assert part.label == "epochal's 'map' connector"
        assert "when Spark plans the query" in part.why
    verdict = judge(plan.parts, EXACTLY_ONCE, allow_downgrade=False)
    assert verdict.effective is EXACTLY_ONCE
    assert [p["can_give"] for p in verdict.to_json()["parts"]] == [None, None]

    to_console = read_query(frame.writeStream.format("console"))
    assert "sink 'console'" in _refusal(to_console.parts)


def test_python_data_source_gives_what_it_declares_else_at_least_once(spark: Any) -> None:
    _python_data_source(spark, "plainticks", None)
    _python_data_source(spark, "onceticks", "exactly-once")
    undeclared = read_query(spark.readStream.format("plainticks").load().writeStream.format("noop"))
    source = _only(undeclared.sources)
    assert (source.format, source.origin, source.guarantee) == (
        "plainticks",
        Origin.PYTHON,
        AT_LEAST_ONCE,
    )
    assert source.label.startswith("Python data source 'plainticks' (")
    assert source.label.endswith(".Ticks)")
    message = _refusal(undeclared.parts)
    assert "source 'plainticks'" in message
    assert "the class attribute epochal_guarantee = 'exactly-once'" in message

    declared = read_query(spark.readStream.format("onceticks").load().writeStream.format("noop"))
    assert _only(declared.sources).guarantee is EXACTLY_ONCE
    assert judge(declared.parts, EXACTLY_ONCE, allow_downgrade=False).effective is EXACTLY_ONCE

    as_sinks = [
        read_query(_rate(spark).writeStream.format(n)).sink for n in ("plainticks", "onceticks")
    ]
    assert [(s.origin, s.guarantee) for s in as_sinks] == [
        (Origin.PYTHON, AT_LEAST_ONCE),
        (Origin.PYTHON, EXACTLY_ONCE),
    ]


def test_a_python_data_source_declaring_no_guarantee_is_a_config_error(spark: Any) -> None:
    _python_data_source(spark, "oddticks", "twice")
    with pytest.raises(ConfigError) as wrong:
        read_query(_rate(spark).writeStream.format("oddticks"))
    assert "Python data source 'oddticks'" in str(wrong.value)
    assert "'twice'" in str(wrong.value) and "epochal_guarantee" in str(wrong.value)


def test_an_unknown_sink_is_refused_under_exactly_once_and_runs_with_the_downgrade(
    spark: Any,
) -> None:
    plan = read_query(_rate(spark).writeStream.format("warehouse"))
    assert (plan.sink.format, plan.sink.origin, plan.sink.guarantee) == (
        "warehouse",
        Origin.UNKNOWN,
        AT_LEAST_ONCE,
    )
    message = _refusal(plan.parts)
    assert "sink 'warehouse' (format 'warehouse') can give at most at-least-once" in message
    assert "epochal does not know it" in message
    assert "--guarantee at-least-once" in message and "--allow-downgrade" in message

    verdict = judge(plan.parts, EXACTLY_ONCE, allow_downgrade=True)
    assert verdict.effective is AT_LEAST_ONCE
    sink = verdict.parts[-1]
    assert (sink.runs_with, sink.downgraded) == (AT_LEAST_ONCE, True)
    assert verdict.to_json()["parts"][-1] == {
        "role": "sink",
        "format": "warehouse",
        "label": "format 'warehouse'",
        "origin": "unknown",
        "can_give": "at-least-once",
        "runs_with": "at-least-once",
        "downgraded": True,
        "why": plan.sink.why,
    }


# --- the whole query ------------------------------------------------------------------------


def test_the_effective_guarantee_is_the_weakest_of_all_parts(spark: Any) -> None:
    socket = spark.readStream.format("socket").option("host", "localhost").option("port", 9)
    frame = _rate(spark).selectExpr("CAST(value AS STRING) AS value").union(socket.load())
    writer = frame.writeStream.foreachBatch(lambda batch, batch_id: None)
    plan = read_query(writer)
    assert [p.format for p in plan.parts] == ["rate", "socket", "foreachBatch"]
    message = _refusal(plan.parts)
    assert "source 'socket'" in message and "sink 'foreachBatch'" in message
    assert "source 'rate'" not in message
    assert "--guarantee none" in message  # the weakest of the parts that fall short

    verdict = judge(plan.parts, EXACTLY_ONCE, allow_downgrade=True)
    assert verdict.effective is NONE
    assert [(r.runs_with, r.downgraded) for r in verdict.parts] == [
        (EXACTLY_ONCE, False),
        (NONE, True),
        (AT_LEAST_ONCE, True),
    ]
    assert verdict.to_json()["effective"] == "none"
    without_socket = judge(
        (plan.parts[0], plan.parts[2]), EXACTLY_ONCE, allow_downgrade=True
    ).effective
    assert without_socket is AT_LEAST_ONCE


def test_a_static_relation_joined_to_the_stream_counts_for_nothing(spark: Any) -> None:
    frame = _rate(spark).join(spark.range(3).withColumnRenamed("id", "value"), "value")
    plan = read_query(frame.writeStream.format("noop"))
    assert [p.format for p in plan.sources] == ["rate"]
    static = _only(plan.static)
    assert (static.role, static.guarantee, static.format) == (Role.STATIC, None, "Range")
    verdict = judge(plan.parts, EXACTLY_ONCE, allow_downgrade=False)
    assert verdict.effective is EXACTLY_ONCE
    assert verdict.to_json()["parts"][1]["role"] == "static"


def test_a_started_querys_plan_names_its_sources(spark: Any, tmp_path: Path) -> None:
    """After start Spark replaces the relations by running ones
    (StreamingDataSourceV2ScanRelation, StreamingExecutionRelation): still known."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"value": 1}\n')
    files = spark.readStream.format("json").schema("value long").load(str(tmp_path / "in"))
    frame = (
        _rate(spark)
        .select("value")
        .union(files)
        .union(_memory_stream(spark).selectExpr("CAST(value AS BIGINT) AS value"))
    )
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        execution = query._jsq.streamingQuery()
        execution.awaitInitialization(120_000)
        sources = read_plan_sources(spark, execution.logicalPlan())
    finally:
        query.stop()
    assert [(s.format, s.guarantee) for s in sources] == [
        ("rate", EXACTLY_ONCE),
        ("file", EXACTLY_ONCE),
        ("memory", NONE),
    ]


def test_a_spark_connect_writer_cannot_be_read() -> None:
    pytest.importorskip("grpc", reason="Spark Connect's client needs grpcio")
    from pyspark.sql.connect.plan import Range
    from pyspark.sql.connect.streaming.readwriter import DataStreamWriter

    writer = DataStreamWriter(Range(0, 10, 1, None), None).format("console")  # type: ignore[arg-type]
    with pytest.raises(UnreadablePlanError) as unreadable:
        read_query(writer)
    assert "pyspark.sql.connect.streaming.readwriter.DataStreamWriter" in str(unreadable.value)
    assert "Connect server" in str(unreadable.value)
