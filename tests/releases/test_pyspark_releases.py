"""epochal on the pyspark releases before the suite's own (4.3): each installed first into a
new virtual environment, then epochal's wheels, built from the tree; pip keeps that pyspark,
a job that needs what the release lacks is refused at submit, the kit's contract checks of
the map connector pass (in process, no Spark), and ``python -m epochal demo`` (two hard
driver kills) ends exactly-once.

Each release is a unit of work of its own for the suite's two workers (the root
conftest.py). pip's cache holds each release's wheel after the first download.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from shutil import copy

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
MAP_SUITE = ROOT / "tests" / "conformance" / "test_map_conformance.py"
RELEASES = ["4.0.5", "4.1.4", "4.2.1"]
"""The newest patch of each older minor release epochal supports."""
ADMISSION_CONTROL_SINCE = (4, 2)

VERSION = "import importlib.metadata as m; print(m.version('pyspark'))"
SUBMIT_AVAILABLE_NOW = """
import sys
from epochal import JobConfig
from epochal.control.job_requests import submit
from epochal.state.locks import JobError

try:
    submit("bounded", "epochal.pipelines:copy", JobConfig(snapshot_dir=sys.argv[1],
           available_now=True))
except JobError as exc:
    print(exc)
else:
    print("submitted")
"""


def _env() -> dict[str, str]:
    """This process's environment without what puts the checkout on the path."""
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EPOCHAL_PLUGINS"}}


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, env=_env(), cwd=cwd, timeout=timeout
    )


@pytest.fixture
def pyspark_release(request: pytest.FixtureRequest) -> str:
    """The release under test (this fixture's name makes each release a unit of work)."""
    return str(request.param)


@pytest.mark.parametrize("pyspark_release", RELEASES, indirect=True)
def test_the_demo_is_exactly_once_on_a_pyspark_installed_before_epochal(
    pyspark_release: str, built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = _run([*pip, f"pyspark=={pyspark_release}"], tmp_path, 900)
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = [str(w) for w in built_wheels.values()]
    done = _run([*pip, *wheels, f"pytest=={pytest.__version__}"], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    version = _run([python, "-c", VERSION], tmp_path, 60)
    assert version.stdout.strip() == pyspark_release, "pip replaced the pyspark installed first"

    submitted = _run(
        [python, "-c", SUBMIT_AVAILABLE_NOW, str(tmp_path / "snapshots")], tmp_path, 120
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    release = tuple(int(p) for p in pyspark_release.split(".")[:2])
    if release < ADMISSION_CONTROL_SINCE:
        assert "needs pyspark 4.2+" in submitted.stdout, submitted.stdout
        assert f"you have {pyspark_release}" in submitted.stdout, submitted.stdout
    else:
        assert submitted.stdout.strip() == "submitted", submitted.stdout

    suite = tmp_path / "kit"
    suite.mkdir()
    copy(MAP_SUITE, suite)
    kit = ["-p", "no:cacheprovider", "-q", "-k", "test_contract", "-m", "not spark"]
    checks = _run([python, "-m", "pytest", *kit, MAP_SUITE.name], suite, 300)
    assert checks.returncode == 0 and " passed" in checks.stdout, checks.stdout + checks.stderr

    demo = _run([python, "-m", "epochal", "demo"], tmp_path, 600)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "lost: 0\n" in demo.stdout and "duplicates: 0\n" in demo.stdout, out
    assert "result: exactly-once held" in demo.stdout, out
    assert _run([python, "-c", VERSION], tmp_path, 60).stdout.strip() == pyspark_release
