"""Apache Iceberg as an epochal job's sink and source, exactly-once, with the driver killed,
input that keeps arriving and graceful stops (``integration/lakehouse/iceberg_job.py`` says
what each case does): in a new virtual environment whose pyspark is the newest release
Iceberg publishes a runtime for (Iceberg 1.12 for Spark 4.1; none for 4.2 or the suite's own
4.3), with epochal's wheels installed after it and Iceberg's runtime jar fetched from Maven
Central into the harness cache.

Cost: the environment (pyspark's wheel from pip's cache after the first download), five
driver starts under the supervisor, one reading session: about two and a half minutes here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.harness.cache import ICEBERG_SPARK, ICEBERG_VERSION, iceberg_jars
from integration.lakehouse import delta_job, iceberg_job
from tests.releases.environments import run_lakehouse_cases

pytestmark = pytest.mark.spark

ICEBERG_PYSPARK = f"{ICEBERG_SPARK}.4"
"""The newest patch of the Spark release Iceberg :data:`ICEBERG_VERSION` is built for."""


@pytest.mark.timeout(1800)
def test_iceberg_tables_as_sink_and_source_exactly_once_through_kills_and_suspends(
    built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    (jar,) = iceberg_jars()
    assert jar.name == f"iceberg-spark-runtime-{ICEBERG_SPARK}_2.13-{ICEBERG_VERSION}.jar"
    wheels = list(built_wheels.values())
    found = run_lakehouse_cases(ICEBERG_PYSPARK, wheels, iceberg_job.MODULE, str(jar), tmp_path)

    for status in ("suspended", "to_iceberg_status", "from_iceberg_status"):
        assert found[status] == "SUSPENDED", (status, found)
    assert len(found["to_iceberg_faults"]) == 2, found["to_iceberg_faults"]
    assert len(found["from_iceberg_faults"]) == 1, found["from_iceberg_faults"]
    for case in ("to_iceberg", "from_iceberg"):
        counts = found[case]
        assert counts["records"] == delta_job.RECORDS, (case, counts)
        assert (counts["lost"], counts["duplicated"]) == (0, 0), (case, counts)
        assert counts["wrong_count"] == 0, (case, counts)
    assert found["from_iceberg_in_doubt"] == [], found["from_iceberg_in_doubt"]
