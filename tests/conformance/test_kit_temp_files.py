"""The kit's Spark processes keep their temporary files in the test's own directory: a kit run
leaves no ``blockmgr-*``, ``artifacts-*``, ``liblz4-java-*.so`` (nor any other JVM or Spark
temporary file) in the system's temporary directory, even where it kills drivers hard.

A small suite (the map connector's plain-session scenario: applications that a restarter starts
and kills whole, a driver paused past its lease, random kills) runs in a pytest of its own whose
system temporary directory (``TMPDIR``) is a fresh one, apart from its base temporary
directory (``--basetemp``), where the tests' own directories are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.conformance, pytest.mark.spark]

SUITE = """
import pytest

from epochal.testing import ConformanceSuite
from epochal_sdk import Guarantee


class TestTempFiles(ConformanceSuite):
    scope = "sink"
    sink_modes = ("idempotent",)
    guarantees = (Guarantee.EXACTLY_ONCE,)
    records = 200
    aggregate = False
    contract_checks = False
    source_connector = "map"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, epochal_map_source):
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink):
        return epochal_map_sink
"""
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


def _left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(JVM_AND_SPARK))


def test_a_kit_run_leaves_no_spark_or_jvm_files_in_the_system_temp_dir(tmp_path: Path) -> None:
    system_tmp, base, suite = tmp_path / "system-tmp", tmp_path / "base", tmp_path / "suite"
    system_tmp.mkdir()
    suite.mkdir()
    (suite / "test_temp_files_suite.py").write_text(SUITE)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(suite),
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(base),
            "-k",
            "session-failures",
        ],
        env={**os.environ, "TMPDIR": str(system_tmp)},
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=suite,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout, run.stdout[-3000:]
    assert _left(system_tmp) == []
    # the killed applications' JVM files are in the tests' own directories instead
    in_tests = {p.name.split("-")[0] for p in base.glob("*/tmp/*")}
    assert "blockmgr" in in_tests, sorted(p.name for p in base.glob("*/tmp/*"))
