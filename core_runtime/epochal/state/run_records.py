"""The records of driver runs: what each run of a supervised driver is (its job, job
directory, guarantee, faults, lease epoch and run), keyed by the run's token, in the run
directory named by :data:`RUN_DIR_ENV` (inherited by the driver's JVM and every Python worker).

A data source reads its run's record when it is created, because a driver that was started
warm (a standby, a driver of a pool) learns its job after its JVM started, and a query
restarted in place is a new run.
"""

from __future__ import annotations

from typing import Any

from epochal.state.store import SnapshotStore, get_record, put_record

RUN_DIR_ENV = "EPOCHAL_RUN_DIR"
"""The directory of run records of a driver process (inherited by its JVM and workers)."""


def read_run_record(run_dir: str, token: str) -> dict[str, Any] | None:
    """What the driver run ``token`` is: its job, job directory, guarantee, faults, lease
    epoch and run. Its data sources read it when they are created, because a driver that was
    started warm (a standby, a driver of a pool) learns its job after its JVM started."""
    return get_record(SnapshotStore(run_dir), f"{token}.json")


def write_run_record(run_dir: str, token: str, record: dict[str, Any]) -> None:
    """Record what the driver run ``token`` is (see :func:`read_run_record`)."""
    put_record(SnapshotStore(run_dir), f"{token}.json", record)


def forget_run_record(run_dir: str, token: str) -> None:
    """Delete the record of a driver run that ended."""
    SnapshotStore(run_dir).delete(f"{token}.json")
