"""Delta Lake as an epochal job's sink and source, exactly-once, with the driver killed
(``integration/lakehouse/delta_job.py`` says what each case does): in a new virtual
environment whose pyspark is the newest release Delta publishes for (Delta 4.4 is built for
Spark 4.2; nothing of Delta exists for the suite's own 4.3), with epochal's wheels installed
after it and Delta's jars fetched from Maven Central into the harness cache. The full lane
also runs Delta on the older Spark lines it publishes for (4.0 and 4.1), where Python
sources have no available-now trigger: the cases of input that keeps arriving
(``integration/lakehouse/arriving_job.py``), as Iceberg runs them.

Cost: the environment (pyspark's wheel from pip's cache after the first download), four
driver starts under the supervisor, one plain session: about three minutes here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.harness.cache import DELTA_PYSPARK, DELTA_SPARK, DELTA_VERSION, delta_jars
from integration.lakehouse import arriving_job, delta_job
from tests.releases.environments import (
    check_arriving_cases,
    check_counts,
    check_window,
    run_lakehouse_cases,
)

pytestmark = pytest.mark.spark


@pytest.mark.timeout(1800)
def test_delta_tables_as_sink_and_source_exactly_once_through_driver_kills(
    built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    jars = ",".join(str(p) for p in delta_jars())
    wheels = list(built_wheels.values())
    found = run_lakehouse_cases(DELTA_PYSPARK, wheels, delta_job.MODULE, jars, tmp_path)

    for job in ("to_delta_job", "from_delta_job"):
        assert found[job]["completed"], (job, found[job])
    assert len(found["to_delta_job"]["faults_fired"]) == 2, found["to_delta_job"]
    assert len(found["from_delta_job"]["faults_fired"]) == 1, found["from_delta_job"]
    check_counts(found["to_delta"])
    check_counts(found["from_delta"])
    check_window(found["window"])
    assert found["from_delta_in_doubt"] == [], found["from_delta_in_doubt"]
    assert f"delta-spark_{DELTA_SPARK}_2.13-{DELTA_VERSION}.jar" in jars


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("pyspark_version", ["4.0.5", "4.1.4"])
def test_delta_tables_on_older_sparks_with_input_that_keeps_arriving(
    pyspark_version: str, built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    spark = pyspark_version.rsplit(".", 1)[0]
    jars = ",".join(str(p) for p in delta_jars(DELTA_VERSION, spark))
    assert f"delta-spark_{spark}_2.13-{DELTA_VERSION}.jar" in jars
    wheels = list(built_wheels.values())
    found = run_lakehouse_cases(
        pyspark_version, wheels, arriving_job.MODULE, jars, tmp_path, "delta"
    )
    assert found["format"] == "delta", found
    check_arriving_cases(found)
