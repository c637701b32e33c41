"""The conformance kit on the map connector: every crash point, driver and executor, both
guarantees, the sink in transactional and in idempotent mode; each point killed in place
(the process performing the step) and with the whole driver, executor JVMs killed, the
running aggregation, and the real failures (supervisor killed, zombie driver, random kills).
The map suite proves the runtime's own protocols, so it kills the whole driver everywhere.

Its plain-session cases (applications that a restarter starts and kills whole, a driver paused
past its lease, random kills) also check that the kit's Spark processes keep their temporary
files in the test's own directory: such a case runs with a fresh system temporary directory
(``TMPDIR`` and Python's own), and must leave no ``blockmgr-*``, ``artifacts-*``,
``liblz4-java-*.so`` (nor any other JVM, Spark or runtime temporary file) there."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.testing import ConformanceSuite
from epochal.testing.runner import not_runnable
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest

JVM_AND_SPARK = (
    "blockmgr-",
    "artifacts-",
    "liblz4-java",
    "librocksdbjni",
    "spark-",
    "epochal-run-",
    "epochal-pool-",
)
"""What a Spark driver, its JVM and the runtime's supervisors put in a temporary directory."""


class TestMapConformance(ConformanceSuite):
    """Map journal → Spark → map sink."""

    whole_driver_kills = True
    executor_kills = True
    zombie_write_task = False  # a local file: the JDBC and Kafka sink suites run the zombie task
    source_connector = "map"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, epochal_map_source: MapSourceUnderTest) -> MapSourceUnderTest:
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink

    @pytest.fixture(autouse=True)
    def system_temp_dir_left_clean(
        self,
        request: pytest.FixtureRequest,
        tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch,
    ) -> Iterator[None]:
        """A plain-session case runs with a fresh system temporary directory and leaves no
        JVM or Spark file in it: its killed applications' files are in the test's directory."""
        callspec = getattr(request.node, "callspec", None)
        case = callspec.params.get("conformance_case") if callspec is not None else None
        if case is None or case.kind != "session-failures":
            yield
            return
        if not_runnable(case, request.getfixturevalue("epochal_source")):
            yield  # the case is skipped on this pyspark: it starts nothing
            return
        system_tmp = tmp_path_factory.mktemp("system-tmp")
        monkeypatch.setenv("TMPDIR", str(system_tmp))
        monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
        yield
        left = sorted(p.name for p in system_tmp.iterdir() if p.name.startswith(JVM_AND_SPARK))
        assert left == [], f"the case left these in the system temporary directory: {left}"
        in_test = sorted({p.name.split("-")[0] for p in tmp_path.glob("**/blockmgr-*")})
        assert in_test == ["blockmgr"], (
            "the killed applications' Spark files are not in the test's directory"
        )
