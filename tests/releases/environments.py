"""New virtual environments with a given pyspark installed first, for the tests of epochal
on other pyspark releases and with the parts that need one (Delta Lake)."""

from __future__ import annotations

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
