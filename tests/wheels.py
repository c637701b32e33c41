"""The wheels users install, built from the tree: every distribution's, in one pip run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = sorted(
    p.parent.relative_to(ROOT).as_posix()
    for p in [
        ROOT / "sdk" / "pyproject.toml",
        ROOT / "core_runtime" / "pyproject.toml",
        *(ROOT / "connectors").glob("*/pyproject.toml"),
    ]
)
"""Every distribution's directory, relative to the checkout."""
SPARK_3_5_RELEASE = "3.5.9"
"""The newest patch of Spark 3.5 (no Python data source API: the ``foreachBatch`` writers
only), the pyspark a platform of that release brings."""
_NOT_SOURCE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc")


def build(work: Path) -> dict[str, Path]:
    """Each distribution's wheel (by its directory), built in ``work`` from a copy of the
    distribution's directory, so the build leaves nothing in the tree."""
    sources = []
    for dist in DISTRIBUTIONS:
        copy = work / "src" / dist
        shutil.copytree(ROOT / dist, copy, ignore=_NOT_SOURCE)
        sources.append(str(copy))
    out = work / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("--disable-pip-version-check", "-w", str(out), *sources),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = {}
    for dist in DISTRIBUTIONS:
        with open(ROOT / dist / "pyproject.toml", "rb") as fh:
            name = tomllib.load(fh)["project"]["name"].replace("-", "_")
        (found[dist],) = out.glob(f"{name}-*.whl")
    return found
