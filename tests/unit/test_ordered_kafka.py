"""The ordered Kafka provider's jar (:mod:`epochal.spark.ordered_kafka`) ships built: it must
be what its Java source compiles to."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pyspark

from epochal.spark import ordered_kafka


def _entries(jar: str) -> dict[str, bytes]:
    with zipfile.ZipFile(jar) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_shipped_jar_is_built_from_its_source(tmp_path: Path) -> None:
    """Compiled again here, every entry of the jar (classes, the data source registration)
    is the same as in the shipped one; after a change to the source, ``python -m
    epochal.spark.ordered_kafka`` rebuilds it."""
    spark_jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    built = ordered_kafka.build_jar(spark_jars, str(tmp_path / "built.jar"))
    shipped = _entries(ordered_kafka.jar())
    assert set(shipped) == set(_entries(built))
    stale = [name for name, data in _entries(built).items() if shipped[name] != data]
    assert not stale, (
        f"{ordered_kafka.JAR_NAME} is not built from {ordered_kafka.SOURCE} ({stale}): "
        "run python -m epochal.spark.ordered_kafka"
    )
    registration = shipped["META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"]
    assert registration.decode().strip() == ordered_kafka.PROVIDER_CLASS
