"""The processes a kit scenario starts keep their temporary files in the test's own directory:
the environment the kit gives them points ``TMPDIR`` there, and a driver started with it sets
its JVM's temporary directory (where Spark puts ``blockmgr-*``, ``artifacts-*`` and the native
libraries it unpacks) to it. The Spark run itself: the map
conformance suite's session-failures cases (tests/conformance/test_map_conformance.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from epochal.testing.scenarios import scenario_temp_dir, with_temp_dir


def test_a_scenario_s_temp_dir_is_beside_its_snapshots(tmp_path: Path) -> None:
    path = scenario_temp_dir(str(tmp_path / "snapshots"))
    assert path == str(tmp_path / "tmp") and Path(path).is_dir()


def test_a_driver_started_with_the_kit_s_environment_points_its_jvm_there(tmp_path: Path) -> None:
    temp_dir = scenario_temp_dir(str(tmp_path / "snapshots"))
    probe = (
        "import tempfile; from epochal.startup.session import follow_tmpdir; "
        "print(tempfile.gettempdir()); print(follow_tmpdir('-Xss4m'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=with_temp_dir(temp_dir),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [temp_dir, f"-Xss4m -Djava.io.tmpdir={temp_dir}"]
