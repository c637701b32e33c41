"""The ``foreachBatch`` writer's API and its imports (no Spark started): the path must run on
pyspark 3.5, which has no Python data source API."""

from __future__ import annotations

import subprocess
import sys

import pytest

import epochal
from epochal.spark.foreach_batch import ForeachBatchWriter, foreach_batch
from epochal_sdk import ConfigError


def test_the_writer_module_imports_nothing_of_the_data_source_api() -> None:
    code = (
        "import sys, epochal.spark.foreach_batch; "
        "bad = sorted(m for m in sys.modules if m.startswith('pyspark.sql.datasource') "
        "or m in ('epochal.spark.datasource', 'epochal.spark.sources', 'epochal.spark.sinks')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_job_is_named_as_a_data_source_sink_names_it(tmp_path: object) -> None:
    writer = foreach_batch(
        "map",
        job="orders",
        snapshot_dir=str(tmp_path),
        allow_downgrade=False,
        options={"epochal.leaseTtl": "8"},
        path=str(tmp_path),
        map="out",
    )
    assert isinstance(writer, ForeachBatchWriter)
    assert writer.options == {
        "epochal.leaseTtl": "8",
        "path": str(tmp_path),
        "map": "out",
        "epochal.job": "orders",
        "epochal.snapshotDir": str(tmp_path),
        "epochal.allowDowngrade": "false",
    }
    assert epochal.foreach_batch is foreach_batch


def test_an_unknown_runtime_option_is_refused_when_the_writer_is_built() -> None:
    with pytest.raises(ConfigError):
        foreach_batch("map", options={"epochal.nosuchOption": "1"}, path="/x", map="out")
