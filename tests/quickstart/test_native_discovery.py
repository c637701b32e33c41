"""Spark-native discovery: an installed connector is ``format("epochal.<name>")`` in a plain
SparkSession, without ``epochal.register(spark)``.

PySpark's lookup (``pyspark.sql.worker.lookup_data_sources``, run in a Python worker the
first time a session uses a Python data source) imports every top-level ``pyspark_*``
module and registers its ``DefaultSource``. The first two tests run that very code without
a JVM; the last one runs a streaming query in a new Python process whose driver never
imports epochal's runtime.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.serializers import read_int
from pyspark.sql.datasource import DataSource

CONNECTORS = ("jdbc", "jms", "kafka", "map")


def spark_lookup() -> dict[str, type]:
    """What Spark's data source lookup registers in this interpreter: name → class."""
    from pyspark.sql.worker.lookup_data_sources import _main
    from pyspark.worker_util import pickleSer

    out = io.BytesIO()
    _main(io.BytesIO(), out)
    out.seek(0)
    found = {}
    for _ in range(read_int(out)):
        name = out.read(read_int(out)).decode()
        found[name] = pickleSer._read_with_length(out)
    return found


def test_spark_lookup_registers_every_installed_connector() -> None:
    from epochal.spark.datasource import EpochalDataSource

    found = spark_lookup()
    for name in CONNECTORS:
        source = found.get(f"epochal.{name}")
        assert source is not None, f"epochal.{name} not found by Spark's lookup: {sorted(found)}"
        assert issubclass(source, EpochalDataSource) and issubclass(source, DataSource)
        assert source.connector_name == name
        assert source.__module__ == f"pyspark_epochal_{name}"  # pickled by reference


def test_without_the_runtime_the_lookup_skips_the_formats_and_says_why() -> None:
    """A connector installed without epochal (the runtime) must not break Spark's lookup
    (one failing ``pyspark_*`` module would hide every Python data source)."""
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["epochal"] = None  # as if only the connector packages were installed
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_native_discovery import spark_lookup
        print(json.dumps(sorted(spark_lookup())))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    names = json.loads(result.stdout.strip().splitlines()[-1])
    assert not [n for n in names if n.startswith("epochal.")], names
    for name in CONNECTORS:
        assert f"format('epochal.{name}') is not available" in result.stderr, result.stderr
    assert "pip install epochal" in result.stderr


@pytest.mark.spark
def test_a_plain_session_runs_epochal_formats_without_register(tmp_path: Path) -> None:
    """A new Python process builds a SparkSession and runs map → map, exactly-once, with
    ``format("epochal.map")`` only: Spark finds the formats, and with the session check's
    attachment off (``EPOCHAL_ATTACH=0``) the driver never imports epochal's runtime (Spark's
    Python workers do). With it on, a plain session is a full job: tests/releases runs the
    kit's plain-session case without ``register``."""
    from epochal_map import MapStore

    journal = tmp_path / "journal.sqlite"
    with MapStore(str(journal)) as store:
        store.append_events("events", [(str(i), f"v{i}") for i in range(50)])
    script = textwrap.dedent(
        f"""
        import sys
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[1]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .getOrCreate()
        )
        job = {{"epochal.job": "plain", "epochal.snapshotDir": {str(tmp_path / "snap")!r}}}
        events = (
            spark.readStream.format("epochal.map")
            .option("path", {str(journal)!r})
            .option("map", "events")
            .options(**job)
            .load()
        )
        query = (
            events.selectExpr("key", "upper(value) AS value")
            .writeStream.format("epochal.map")
            .option("path", {str(journal)!r})
            .option("map", "upper")
            .option("mode", "transactional")
            .options(**job)
            .option("checkpointLocation", {str(tmp_path / "checkpoint")!r})
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert query.exception() is None, query.exception()
        spark.stop()
        print("epochal imported by the driver:", "epochal.spark.datasource" in sys.modules)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "EPOCHAL_ATTACH": "0"},  # the formats alone (see epochal.spark.attach)
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "epochal imported by the driver: False" in result.stdout, result.stdout
    with MapStore(str(journal)) as store:
        assert store.entries("upper") == {str(i): f"V{i}" for i in range(50)}
