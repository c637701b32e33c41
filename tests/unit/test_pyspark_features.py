"""What the installed pyspark offers, as :mod:`epochal.spark.features` detects it (the suite
runs on pyspark 4.3, which has every feature; tests/releases runs the older releases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from epochal.config import JobConfig
from epochal.control.job_requests import submit
from epochal.spark import features

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("n", LongType()),
        StructField("at", TimestampType()),
    ]
)


def test_every_feature_is_found_on_the_suites_pyspark() -> None:
    assert all(f.available for f in features.FEATURES), [f.name for f in features.FEATURES]
    assert features.refusals(available_now=True) == []


def test_a_feature_that_is_not_there_is_not_found_and_its_message_says_what_to_do() -> None:
    absent = features.Feature("a thing", "9.9", "pyspark.sql.datasource", "NoSuchClass")
    assert not absent.available
    message = absent.missing("do this")
    assert message.startswith("a thing needs pyspark 9.9+; you have ")
    assert features.pyspark_version() in message and message.endswith(": do this")


def test_rows_become_record_batches_in_the_schemas_arrow_form() -> None:
    rows = [Row(key=str(i), n=i, at=None) for i in range(features.ROWS_PER_ARROW_BATCH + 3)]
    batches = list(features.arrow_batches(iter(rows), SCHEMA))
    assert [b.num_rows for b in batches] == [features.ROWS_PER_ARROW_BATCH, 3]
    assert all(b.schema == features.arrow_schema(SCHEMA) for b in batches)
    assert batches[1].column("n").to_pylist() == list(
        range(features.ROWS_PER_ARROW_BATCH, len(rows))
    )
    assert batches[0].schema.field("at").type == pa.timestamp("us", tz="UTC")


def test_record_batches_pass_through() -> None:
    batch = pa.RecordBatch.from_pydict({"key": ["a"], "n": [1]})
    assert list(features.arrow_batches(iter([batch]), SCHEMA)) == [batch]


def test_only_the_refusal_of_a_found_data_source_is_told_apart() -> None:
    assert features.found_by_spark(
        Exception("[DATA_SOURCE_ALREADY_EXISTS] Data source 'epochal.map' already exists.")
    )
    assert not features.found_by_spark(Exception("[DATA_SOURCE_NOT_FOUND] no such source"))


def test_a_pyspark_newer_than_any_tested_is_run_with_a_warning_that_says_so(
    monkeypatch: Any, tmp_path: Path
) -> None:
    assert features.untested_release() == ""  # the suite's own release is tested
    monkeypatch.setattr(features, "pyspark_version", lambda: "4.4.0")
    warning = features.untested_release()
    assert warning.startswith("pyspark 4.4.0 is newer than any epochal is tested on (3.5-4.3)")
    assert "pin pyspark<=4.3.*" in warning
    said: list[str] = []
    submit(
        "newer", "epochal.pipelines:copy", JobConfig(snapshot_dir=str(tmp_path)), report=said.append
    )
    assert said == [f"epochal: {warning}"]  # submitted, not refused
    monkeypatch.setattr(features, "pyspark_version", lambda: "none")
    assert features.untested_release() == ""
