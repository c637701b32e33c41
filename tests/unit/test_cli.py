"""The ``epochal`` command, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from epochal import JobConfig
from epochal.jobs import JobDirectory, JobRecord, JobStatus


def _epochal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from epochal.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_connectors_lists_the_map_with_contracts_and_guarantees() -> None:
    result = _epochal("connectors")
    assert result.returncode == 0, result.stderr
    assert "map  (epochal_map.connector)" in result.stdout
    assert "format: epochal.map" in result.stdout
    assert "sink: TransactionalSink, IdempotentSink — up to exactly-once" in result.stdout


def test_connectors_as_json() -> None:
    result = _epochal("connectors", "--json")
    found = json.loads(result.stdout)
    assert found["map"]["contracts"]["source"] == ["ReplayableSource"]
    assert found["map"]["guarantees"] == {"source": "exactly-once", "sink": "exactly-once"}


def test_jobs_list_status_and_unknown_job(tmp_path: Path) -> None:
    snapshots = str(tmp_path / "snapshots")
    assert "no jobs in" in _epochal("jobs", "list", "--snapshot-dir", snapshots).stdout
    jobdir = JobDirectory(snapshots, "orders")
    jobdir.save(JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict()))
    listed = _epochal("jobs", "list", "--snapshot-dir", snapshots)
    assert "orders" in listed.stdout and "SUBMITTED" in listed.stdout
    status = json.loads(_epochal("jobs", "status", "orders", "--snapshot-dir", snapshots).stdout)
    assert status["status"] == "SUBMITTED" and status["target"] == "m:f"
    missing = _epochal("jobs", "status", "nope", "--snapshot-dir", snapshots)
    assert missing.returncode == 2
    assert "no job named 'nope'" in missing.stderr


def test_cancel_without_a_supervisor_deletes_the_snapshots(tmp_path: Path) -> None:
    snapshots = str(tmp_path / "snapshots")
    jobdir = JobDirectory(snapshots, "orders")
    jobdir.save(JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict()))
    jobdir.store.write_json("sinks/s/decisions/000000000001", {"batch": 1})
    result = _epochal("jobs", "cancel", "orders", "--snapshot-dir", snapshots)
    assert result.returncode == 0, result.stderr
    assert jobdir.load().status == JobStatus.CANCELLED
    assert not Path(jobdir.store.base).exists()


def test_verify_reports_corruption(tmp_path: Path) -> None:
    snapshots = str(tmp_path / "snapshots")
    jobdir = JobDirectory(snapshots, "orders")
    jobdir.save(JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict()))
    jobdir.store.write_json("sinks/s/decisions/000000000001", {"batch": 1})
    ok = _epochal("jobs", "verify", "orders", "--snapshot-dir", snapshots)
    assert ok.returncode == 0 and "snapshot sound (1 entries verified)" in ok.stdout
    entry = Path(jobdir.store.base) / "sinks/s/decisions/000000000001"
    entry.write_text('{"batch": 2}')
    bad = _epochal("jobs", "verify", "orders", "--snapshot-dir", snapshots)
    assert bad.returncode == 1 and "is corrupt" in bad.stdout


def test_run_rejects_a_bad_guarantee_before_starting(tmp_path: Path) -> None:
    result = _epochal(
        "run", "m:f", "--name", "x", "--guarantee", "twice", "--snapshot-dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert "option 'guarantee'" in result.stderr and "exactly-once" in result.stderr
    assert not (tmp_path / "x").exists()
