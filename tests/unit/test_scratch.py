"""The scratch directories of driver runs (:func:`epochal.base.processes.scratch_dir`): what a
killed driver leaves in its temporary directory goes with the run.

The end-to-end half (a SIGKILLed driver's JVM wrote there, and its supervisor removed it) is
in ``tests/spark/test_jobs.py``, the standby test; here is the sweep a new supervisor does for
the drivers of one that was killed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from epochal.base import processes


@pytest.fixture
def temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary directory, for the test alone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _scratch(token: str, age: float) -> Path:
    path = Path(processes.scratch_dir(token))
    (path / "spark-0").mkdir(parents=True)
    (path / "spark-0" / "librocksdbjni.so").write_bytes(b"\0" * 1024)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_a_run_scratch_directory_is_named_after_its_token(temporary_directory: Path) -> None:
    token = processes.new_run_token()
    path = Path(processes.scratch_dir(token))
    assert path.parent == temporary_directory
    assert path.name == processes.SCRATCH_PREFIX + token


def test_the_sweep_removes_only_old_scratch_of_runs_with_no_process_left(
    temporary_directory: Path,
) -> None:
    dead, young, live = (processes.new_run_token() for _ in range(3))
    dead_dir, young_dir, live_dir = _scratch(dead, 600), _scratch(young, 1), _scratch(live, 600)
    other = temporary_directory / "not-a-run"
    other.mkdir()
    runner = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        env={**os.environ, processes.RUN_TOKEN_ENV: live},
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not processes.processes_of(live) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes.processes_of(live), "the live run's process did not start"

        swept = processes.sweep_scratch(older_than=300)
    finally:
        runner.communicate(b"")

    assert swept == [dead]
    assert not dead_dir.exists()
    assert young_dir.exists(), "a run whose driver may be starting was swept"
    assert live_dir.exists(), "a live run's scratch was swept"
    assert other.exists()


def test_an_ended_run_scratch_directory_is_removed(temporary_directory: Path) -> None:
    token = processes.new_run_token()
    path = _scratch(token, 0)
    processes.remove_scratch(token)
    assert not path.exists()
    processes.remove_scratch(token)  # twice: nothing left to do


def test_a_closed_driver_pool_removes_the_directory_it_made(temporary_directory: Path) -> None:
    from epochal.control.launcher import DriverPool

    made = DriverPool()
    Path(made.directory, "driver-1.log").write_text("a waiting driver's log")
    given = DriverPool(directory=str(temporary_directory / "given"))
    os.makedirs(given.directory)
    made.close()
    given.close()
    assert not os.path.exists(made.directory), "the pool left its own directory behind"
    assert os.path.isdir(given.directory), "the pool removed a directory it was given"


def test_a_run_process_is_found_by_its_token_entry_alone() -> None:
    """Only the ``EPOCHAL_RUN_TOKEN=`` entry of a process's environment names its run: not
    a value that contains it, nor a longer variable name that ends with it."""
    token, decoy = processes.new_run_token(), processes.new_run_token()
    runner = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "A_VALUE": f"{processes.RUN_TOKEN_ENV}={decoy}",
            f"X{processes.RUN_TOKEN_ENV}": decoy,
            processes.RUN_TOKEN_ENV: token,
        },
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not processes.processes_of(token) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes.processes_of(token) == [runner.pid]
        assert processes.processes_of(decoy) == []
    finally:
        runner.communicate(b"")
