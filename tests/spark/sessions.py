"""The plain SparkSession that the module-scoped fixtures of ``tests/spark`` share.

A pytest worker has one driver JVM for its whole life: the first module that starts a
SparkSession fixes the driver's class path, and ``spark.jars`` given to a later session of
the same process does not reach it. Every module's session is built here, with Spark's
Kafka connector and epochal's ordered Kafka provider both given at the start and added with
``ADD JAR`` (the route the Kafka docs give a running session; a no-op for a jar already
there), so that whichever module starts the JVM, the others find ``format("kafka")`` and
``format("kafka-ordered")``.
"""

from __future__ import annotations

import sys
from typing import Any


def kafka_jars() -> tuple[list[str], str]:
    """Spark's Kafka connector jars and epochal's ordered provider, from the integration
    cache; none, and why, where they are not available (no cache and no Maven here)."""
    try:
        from epochal.spark import ordered_kafka
        from integration.bench.kafka_bench import spark_kafka_jars

        return [*spark_kafka_jars(), ordered_kafka.jar()], ""
    except Exception as exc:
        return [], f"Spark's Kafka connector jars are not available: {exc}"


def plain_session(app_name: str, log_level: str, **conf: str) -> Any:
    """A local SparkSession (two cores, two shuffle partitions, no UI) with the Kafka jars
    (:func:`kafka_jars`) on its driver's class path, and ``conf`` besides."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    jars, _ = kafka_jars()
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    for jar in jars:
        session.sql(f"ADD JAR '{jar}'")
    return session
