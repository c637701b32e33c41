"""pip keeps the pyspark a platform brings: epochal's built wheels installed with their
dependencies (a plain ``pip install``, as users type it) beside

- a pip-installed pyspark 3.5 (a Spark 3.5 cluster's): pip keeps it, the ``foreachBatch``
  writers import, and the data source formats refuse with an error that names the writers
  (``epochal.register`` and ``python -m epochal run``);
- a pyspark that is not a pip distribution (a Spark home's ``python/`` on ``PYTHONPATH``, as
  Databricks and EMR images have; here the suite's own pyspark 4.3): pip installs no second
  one, and the runtime takes the one on the path (its version read from ``pyspark.version``);
- no pyspark at all: ``python -m epochal run`` says how to get one.

Cost: two new virtual environments filled by pip from its cache (pyspark 3.5's wheel is
built once into the harness cache), and a few short Python processes: no Spark session starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark
import pytest

from tests.releases.environments import pyspark_requirement
from tests.wheels import SPARK_3_5_RELEASE

pytestmark = pytest.mark.timeout(1200)

VERSION = "import importlib.metadata as m; print(m.version('pyspark'))"
REFUSALS = """
import epochal
from epochal.spark import features
from epochal_sdk import EpochalError

print("version", features.pyspark_version())
print("refusal:", features.data_source_refusal() or "none")
if features.data_source_refusal():  # refused before the session is touched
    try:
        epochal.register(None)
    except EpochalError as exc:
        print("register refused:", exc)
"""
FOREACH_BATCH = "from epochal import foreach_batch; print(foreach_batch.__module__)"
NOT_A_DISTRIBUTION = """
import importlib.metadata as m
import pyspark
try:
    m.distribution("pyspark")
except m.PackageNotFoundError:
    print("no pyspark distribution; pyspark from", pyspark.__file__)
else:
    print("a pyspark distribution is installed")
"""
PIPELINE = "def copy(spark):\n    raise AssertionError('refused before the driver starts')\n"


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without what puts the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EPOCHAL_PLUGINS"}}
    return {**env, **extra}


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


def _venv(where: Path) -> tuple[str, list[str]]:
    """A new virtual environment: its python and its ``pip install`` command."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = str(where / "bin" / "python")
    return python, [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def _refused_run(python: str, cwd: Path, env: dict[str, str]) -> str:
    """``python -m epochal run`` of a job in ``cwd``: what it printed (it must fail)."""
    (cwd / "pipeline.py").write_text(PIPELINE)
    args = [python, "-m", "epochal", "run", "--name", "refused", "--available-now"]
    args += ["--snapshot-dir", str(cwd / "snapshots"), "pipeline:copy"]
    done = _run(args, cwd, env)
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_pip_keeps_a_pip_installed_pyspark_3_5_and_the_formats_refuse_there(
    built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    python, pip = _venv(tmp_path / "venv")
    env = _env()
    done = _run([*pip, *pyspark_requirement(SPARK_3_5_RELEASE)], tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _run([*pip, *map(str, built_wheels.values())], tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = _run([python, "-c", VERSION], tmp_path, env).stdout.strip()
    assert kept == SPARK_3_5_RELEASE, f"pip replaced pyspark {SPARK_3_5_RELEASE} with {kept}"

    writers = _run([python, "-c", FOREACH_BATCH], tmp_path, env)
    assert writers.returncode == 0, writers.stdout + writers.stderr
    refused = _run([python, "-c", REFUSALS], tmp_path, env)
    assert refused.returncode == 0, refused.stdout + refused.stderr
    assert f"version {SPARK_3_5_RELEASE}" in refused.stdout, refused.stdout
    assert "register refused:" in refused.stdout, refused.stdout
    for said in ("needs pyspark 4.0+", f"you have {SPARK_3_5_RELEASE}", "foreachBatch writers"):
        assert said in refused.stdout, refused.stdout
    run = _refused_run(python, tmp_path, env)
    assert "cannot run on this pyspark" in run and "foreachBatch writers" in run, run


def test_pip_adds_no_pyspark_beside_one_on_the_path_and_says_how_to_get_one_without(
    built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    # a Spark home's python/: the suite's own pyspark and py4j, without their distributions
    home = tmp_path / "spark-home" / "python"
    home.mkdir(parents=True)
    for package in ("pyspark", "py4j"):
        found = Path(sysconfig.get_paths()["purelib"]) / package
        assert found.is_dir(), f"no {package} in this interpreter's site-packages"
        (home / package).symlink_to(found)
    python, pip = _venv(tmp_path / "venv")
    on_the_path = _env(PYTHONPATH=str(home))
    done = _run([*pip, *map(str, built_wheels.values())], tmp_path, on_the_path)
    assert done.returncode == 0, done.stdout + done.stderr

    where = _run([python, "-c", NOT_A_DISTRIBUTION], tmp_path, on_the_path)
    assert where.returncode == 0, where.stdout + where.stderr
    assert where.stdout.startswith(f"no pyspark distribution; pyspark from {home}"), where.stdout
    taken = _run([python, "-c", REFUSALS], tmp_path, on_the_path)
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert f"version {pyspark.__version__}" in taken.stdout, taken.stdout
    assert "refusal: none" in taken.stdout, taken.stdout
    listing = _run([python, "-m", "epochal", "connectors"], tmp_path, on_the_path)
    assert listing.returncode == 0 and "format: epochal.map" in listing.stdout, listing.stdout

    without = _refused_run(python, tmp_path, _env())
    assert "none is importable" in without and "epochal[pyspark]" in without, without
