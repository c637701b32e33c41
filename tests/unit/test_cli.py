"""The ``epochal`` command, run as a user runs it (a subprocess)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from epochal import JobConfig
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.lease.record import new_owner
from epochal.state.store import put_record


def _epochal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from epochal.ops.cli import main; main()", *args],
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
    status = json.loads(
        _epochal("jobs", "status", "orders", "--snapshot-dir", snapshots, "--json").stdout
    )
    assert status["status"] == "SUBMITTED" and status["target"] == "m:f"
    text = _epochal("jobs", "status", "orders", "--snapshot-dir", snapshots).stdout
    assert text.startswith("job orders: SUBMITTED")
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
    entry.write_bytes(entry.read_bytes().replace(b'{"batch": 1}', b'{"batch": 2}'))
    bad = _epochal("jobs", "verify", "orders", "--snapshot-dir", snapshots)
    assert bad.returncode == 1 and "is corrupt" in bad.stdout


def test_run_rejects_a_bad_guarantee_before_starting(tmp_path: Path) -> None:
    result = _epochal(
        "run", "m:f", "--name", "x", "--guarantee", "twice", "--snapshot-dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert "option 'guarantee'" in result.stderr and "exactly-once" in result.stderr
    assert not (tmp_path / "x").exists()


def _python_m_epochal(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m epochal ...``: the way the README and the Makefile run the command."""
    return subprocess.run(
        [sys.executable, "-m", "epochal", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_python_m_epochal_and_version() -> None:
    result = _python_m_epochal("--version")
    assert result.returncode == 0, result.stderr
    import pyspark

    assert result.stdout.startswith("epochal 0.1.0 (epochal-sdk 0.1.0, ")
    assert f"pyspark {pyspark.__version__}, Python " in result.stdout
    assert sys.executable in result.stdout
    assert "usage: epochal [-h] [--version] COMMAND" in _python_m_epochal("--help").stdout


def test_every_option_has_help_with_its_default() -> None:
    from epochal.ops.cli import parser

    top = parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, command in commands.choices.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"epochal {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{where} has no help text"
            if action.option_strings:
                checked += 1
                assert "default" in action.help or action.required, f"{where}: no default"
                if action.default not in (None, False):
                    shown = action.help % {"default": action.default}
                    assert str(action.default) in shown, f"{where}: default not shown"
    assert checked >= 20
    run_help = _python_m_epochal("run", "--help").stdout
    for option in ("--name", "--master", "--snapshot-dir", "--conf"):
        assert option in run_help
    assert "(default: local[2])" in run_help
    assert "(default: ./epochal-snapshots;" in run_help.replace("\n", " ").replace("  ", " ")


def test_run_refuses_spark_connect_and_says_what_to_do(tmp_path: Path) -> None:
    snapshots = str(tmp_path / "snapshots")
    remote = _python_m_epochal(
        "run", "m:f", "--name", "orders", "--master", "sc://localhost:15002",
        "--snapshot-dir", snapshots,
    )  # fmt: skip
    assert remote.returncode == 2
    assert remote.stderr.startswith("epochal run (job 'orders'): --master 'sc://localhost:15002'")
    assert "docs/how-to/spark-connect.md" in remote.stderr and "local[2]" in remote.stderr
    env = _python_m_epochal(
        "run", "m:f", "--name", "orders", "--snapshot-dir", snapshots,
        SPARK_REMOTE="sc://localhost:15002",
    )  # fmt: skip
    assert env.returncode == 2
    assert "SPARK_REMOTE=sc://localhost:15002 is set" in env.stderr
    assert "env -u SPARK_REMOTE" in env.stderr
    assert not Path(snapshots, "orders").exists()  # refused before anything was submitted

    jobdir = JobDirectory(snapshots, "orders")
    jobdir.save(JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict()))
    resumed = _python_m_epochal(
        "jobs", "resume", "orders", "--snapshot-dir", snapshots, SPARK_REMOTE="sc://h:1"
    )
    assert resumed.returncode == 2
    assert resumed.stderr.startswith("epochal jobs resume (job 'orders'): SPARK_REMOTE=")


def test_command_line_mistakes_name_the_job_and_the_fix(tmp_path: Path) -> None:
    snapshots = str(tmp_path / "snapshots")
    conf = _python_m_epochal(
        "run", "m:f", "--name", "orders", "--conf", "spark.executor.memory",
        "--snapshot-dir", snapshots,
    )  # fmt: skip
    assert conf.returncode == 2
    assert conf.stderr.strip() == (
        "epochal run (job 'orders'): --conf 'spark.executor.memory' is not KEY=VALUE. "
        "Write e.g. --conf spark.executor.memory=2g"
    )
    nameless = _python_m_epochal("jobs", "status", "--snapshot-dir", snapshots)
    assert nameless.returncode == 2
    assert f"`python -m epochal jobs list --snapshot-dir {snapshots}`" in nameless.stderr
    missing = _python_m_epochal("jobs", "resume", "nope", "--snapshot-dir", snapshots)
    assert missing.returncode == 2
    assert missing.stderr.startswith("epochal jobs resume (job 'nope'): no job named 'nope'")


def test_a_job_whose_supervisor_died_shows_as_orphaned(tmp_path: Path) -> None:
    """The record says RUNNING, but no supervisor holds the lease (it died without a word):
    status says so, and how to resume it, instead of RUNNING forever."""
    snapshots = str(tmp_path / "snapshots")
    jobdir = JobDirectory(snapshots, "orders")
    record = JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict())
    record.status = JobStatus.RUNNING
    jobdir.save(record)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    jobdir.lease.acquire(new_owner())
    lease = dataclasses.replace(jobdir.lease.read(), pid=dead.pid)  # its supervisor is gone
    put_record(jobdir.files, "lease.json", lease.to_record())
    status = json.loads(
        _epochal("jobs", "status", "orders", "--snapshot-dir", snapshots, "--json").stdout
    )
    assert status["status"] == "ORPHANED"
    assert status["phase"] == "running"
    assert "jobs resume orders" in status["hint"]
    assert status["lease"]["epoch"] == 1 and status["lease"]["live"] is False
    listed = _epochal("jobs", "list", "--snapshot-dir", snapshots).stdout
    assert "ORPHANED" in listed
