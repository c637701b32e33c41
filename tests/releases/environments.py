"""New virtual environments with a given pyspark installed first, for the tests of epochal
on other pyspark releases and with the parts that need one (Delta Lake)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


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


def venv_with_pyspark(release: str, tmp_path: Path) -> tuple[Path, str, list[str]]:
    """A new virtual environment with ``pyspark==release`` installed first: its directory,
    its python and its ``pip install`` command."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # pip compiles what it installs (0.5 s for pyspark): every process of the environment
    # then reads the bytecode, whether or not the shell lets Python write it
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = run([*pip, f"pyspark=={release}"], tmp_path, 900)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv, python, pip


ROOT = Path(__file__).resolve().parents[2]


def run_lakehouse_cases(
    release: str, wheels: list[Path], module: str, jars: str, tmp_path: Path
) -> dict:
    """A new environment of pyspark ``release`` with ``wheels`` installed after it, in which
    ``python -m module <workdir> <jars>`` runs from the checkout's root (the job modules of
    ``integration.lakehouse``; epochal itself from the wheels): what it found (its ``FOUND``
    line), with ``epochal_from`` checked to be the environment's."""
    venv, python, pip = venv_with_pyspark(release, tmp_path)
    done = run([*pip, *(str(w) for w in wheels)], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp_path / "work"
    work.mkdir()
    cases = run([python, "-m", module, str(work), jars], ROOT, 1500)
    out = cases.stdout + cases.stderr
    assert cases.returncode == 0, out[-6000:]
    (line,) = [x for x in cases.stdout.splitlines() if x.startswith("FOUND ")]
    found = dict(json.loads(line.removeprefix("FOUND ")))
    assert found["epochal_from"].startswith(str(venv)), "epochal came from the checkout"
    return found
