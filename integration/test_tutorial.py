"""The tutorial's program (docs/tutorial/kafka-to-postgres.md), run as the page shows it:
its ``# file: orders_job.py`` block is written out and started as a plain PySpark
application (Spark's Kafka connector given as jars, the way ``--packages`` would) against the
harness's Kafka and PostgreSQL. Every order of the topic must be in the table once, with the
columns the page names, and nothing left prepared."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from integration.bench.kafka_bench import spark_kafka_jars
from integration.harness.kafka import KafkaServer
from integration.harness.plugin import PostgresDatabase

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorial" / "kafka-to-postgres.md"
ORDERS = 120
PARTITIONS = 3


def page_files(text: str) -> dict[str, str]:
    """The page's code blocks that start with ``# file: <name>``, by name."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        first, _, rest = block.partition("\n")
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = rest
    return files


def produce_orders(kafka: KafkaServer, topic: str) -> None:
    """``ORDERS`` JSON orders keyed by their id, spread over the topic's partitions."""
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config(acks="all", **{"enable.idempotence": True}))
    for i in range(ORDERS):
        order = {"order_id": i, "customer": f"c{i % 7}", "amount": f"{i}.25"}
        producer.produce(topic, key=f"o-{i}", value=json.dumps(order), partition=i % PARTITIONS)
    assert producer.flush(30) == 0, "orders still unsent after 30 s"


def test_the_page_shows_the_program() -> None:
    assert "orders_job.py" in page_files(PAGE.read_text())


@pytest.mark.kafka_topic(partitions=PARTITIONS)
def test_the_tutorials_program_writes_every_order_once(
    kafka_server: KafkaServer, kafka_topic: str, postgres_db: PostgresDatabase, tmp_path: Path
) -> None:
    program = tmp_path / "orders_job.py"
    program.write_text(page_files(PAGE.read_text())["orders_job.py"])
    produce_orders(kafka_server, kafka_topic)
    dsn = urlsplit(postgres_db.dsn)
    assert dsn.password, "the harness's DSN names its password"
    without_password = dsn._replace(netloc=f"{dsn.username}@{dsn.hostname}:{dsn.port}")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_server.bootstrap_servers,
        "ORDERS_TOPIC": kafka_topic,
        "ORDERS_DB_URL": urlunsplit(without_password),
        "ORDERS_DB_PASSWORD": dsn.password,
        "EPOCHAL_DIR": str(tmp_path / "epochal"),
        "PYSPARK_SUBMIT_ARGS": f"--jars {','.join(spark_kafka_jars())} pyspark-shell",
    }
    done = subprocess.run(
        [sys.executable, str(program), "--once"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    with postgres_db.connect() as conn:
        rows = conn.execute(
            "SELECT order_key, order_id, customer, amount, kafka_partition FROM orders"
        ).fetchall()
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
    assert sorted(row[1] for row in rows) == list(range(ORDERS)), "lost or duplicated orders"
    for key, order_id, customer, amount, partition in rows:
        assert key == f"o-{order_id}" and customer == f"c{order_id % 7}"
        assert amount == Decimal(f"{order_id}.25") and partition == order_id % PARTITIONS
    assert prepared == [], "transactions left prepared"

    # what the page says `jobs status` shows: a session run, the sink exactly-once
    command = ["jobs", "status", "orders", "--json", "--snapshot-dir", env["EPOCHAL_DIR"]]
    shown = subprocess.run(
        [sys.executable, "-m", "epochal", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert [run["kind"] for run in status["runs"]] == ["session"]
    sinks = [p for p in status["metrics"]["parts"].values() if p["kind"] == "sink"]
    assert [(s["connector"], s["guarantee"]) for s in sinks] == [("jdbc", "exactly-once")]
