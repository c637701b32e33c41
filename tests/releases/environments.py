"""New virtual environments with a given pyspark installed first, for the tests of epochal
on other pyspark releases and with the parts that need one (Delta Lake)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from integration.harness.cache import pyspark_wheelhouse
from integration.lakehouse.delta_job import RECORDS


def clean_env() -> dict[str, str]:
    """This process's environment without what puts the checkout on the path."""
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EPOCHAL_PLUGINS"}}


def run(
    args: list[str], cwd: Path, timeout: float, servers: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``args`` in ``cwd`` with :func:`clean_env` (and ``servers``' variables), its output
    captured."""
    env = {**clean_env(), **(servers or {})}
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def pyspark_requirement(release: str) -> list[str]:
    """The ``pip install`` arguments of ``pyspark==release`` as a user types them, with the
    harness's wheel of it to find (:func:`~integration.harness.cache.pyspark_wheelhouse`:
    built once, not by every environment)."""
    return ["--find-links", str(pyspark_wheelhouse(release)), f"pyspark=={release}"]


def venv_with_pyspark(release: str, tmp_path: Path) -> tuple[Path, str, list[str]]:
    """A new virtual environment with ``pyspark==release`` installed first: its directory,
    its python and its ``pip install`` command."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # pip compiles what it installs (0.5 s for pyspark): every process of the environment
    # then reads the bytecode, whether or not the shell lets Python write it
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = run([*pip, *pyspark_requirement(release)], tmp_path, 900)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv, python, pip


ROOT = Path(__file__).resolve().parents[2]


def run_lakehouse_cases(
    release: str, wheels: list[Path], module: str, jars: str, tmp_path: Path, *args: str
) -> dict:
    """A new environment of pyspark ``release`` with ``wheels`` installed after it, in which
    ``python -m module <workdir> <jars> [args]`` runs from the checkout's root (the job
    modules of ``integration.lakehouse``; epochal itself from the wheels): what it found (its
    ``FOUND`` line), with ``epochal_from`` checked to be the environment's."""
    venv, python, pip = venv_with_pyspark(release, tmp_path)
    done = run([*pip, *(str(w) for w in wheels)], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp_path / "work"
    work.mkdir()
    cases = run([python, "-m", module, str(work), jars, *args], ROOT, 1500)
    out = cases.stdout + cases.stderr
    assert cases.returncode == 0, out[-6000:]
    (line,) = [x for x in cases.stdout.splitlines() if x.startswith("FOUND ")]
    found = dict(json.loads(line.removeprefix("FOUND ")))
    assert found["epochal_from"].startswith(str(venv)), "epochal came from the checkout"
    return found


def check_counts(counts: dict) -> None:
    """Every record once, by key and by value (``delta_job.wrong_records``)."""
    assert counts["records"] == RECORDS, counts
    assert (counts["lost"], counts["duplicated"]) == (0, 0), counts
    assert counts["wrong_count"] == 0, counts


def check_window(window: dict) -> None:
    """What ``delta_job.plain_session_window`` must have found: several batches, every record
    once by value, and the batch whose commit-log entry was gone run again and committed by
    Spark while the table format kept the one version of it it had."""
    check_counts(window)
    assert window["batches"] >= 2, window
    assert window["replay_committed"], window
    assert (window["versions_before"], window["versions_after"]) == (1, 1), window


def check_arriving_cases(found: dict) -> None:
    """What ``integration.lakehouse.arriving_job`` must have found, whatever the format:
    both jobs stopped gracefully (suspended) with every fault fired, every record in the
    table and in the map once, by value, nothing in doubt, and the plain session's commit
    window (:func:`check_window`)."""
    for status in ("suspended", "to_table_status", "from_table_status"):
        assert found[status] == "SUSPENDED", (status, found)
    assert len(found["to_table_faults"]) == 2, found["to_table_faults"]
    assert len(found["from_table_faults"]) == 1, found["from_table_faults"]
    check_counts(found["to_table"])
    check_counts(found["from_table"])
    assert found["from_table_in_doubt"] == [], found["from_table_in_doubt"]
    check_window(found["window"])
