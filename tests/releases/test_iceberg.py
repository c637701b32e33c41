"""Apache Iceberg as an epochal job's sink and source, exactly-once, with the driver killed,
input that keeps arriving, graceful stops and a plain session's commit window
(``integration/lakehouse/arriving_job.py`` says what each case does): in a new virtual
environment of a pyspark Iceberg publishes a runtime for (Iceberg 1.12 for Spark 4.1, 1.11
the last for 4.0; none for 4.2 or the suite's own 4.3), with epochal's wheels installed
after it and Iceberg's runtime jar fetched from Maven Central into the harness cache. CI's
lane runs the newest; the full lane 4.0 too.

Cost: the environment (pyspark's wheel from pip's cache after the first download), five
driver starts under the supervisor, one session that reads and runs the plain session's query
twice: about three minutes here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.harness.cache import (
    ICEBERG_PYSPARK,
    ICEBERG_SPARK,
    ICEBERG_VERSION,
    iceberg_jars,
)
from integration.lakehouse import arriving_job
from tests.releases.environments import check_arriving_cases, run_lakehouse_cases

pytestmark = pytest.mark.spark

ICEBERG_RELEASES = {
    ICEBERG_PYSPARK: (ICEBERG_VERSION, ICEBERG_SPARK),
    "4.0.5": ("1.11.0", "4.0"),
}
"""pyspark release -> the Iceberg release and the Spark line its runtime is built for."""


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("pyspark_version", list(ICEBERG_RELEASES))
def test_iceberg_tables_as_sink_and_source_exactly_once_through_kills_and_suspends(
    pyspark_version: str, built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    iceberg, spark = ICEBERG_RELEASES[pyspark_version]
    (jar,) = iceberg_jars(iceberg, spark)
    assert jar.name == f"iceberg-spark-runtime-{spark}_2.13-{iceberg}.jar"
    wheels = list(built_wheels.values())
    found = run_lakehouse_cases(
        pyspark_version, wheels, arriving_job.MODULE, str(jar), tmp_path, "iceberg"
    )
    assert found["format"] == "iceberg", found
    check_arriving_cases(found)
