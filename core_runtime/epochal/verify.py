"""Snapshot verification before a restart (the seeds' missing-data detection).

A job restarts only if every snapshot entry matches its manifest (size, checksum), the Spark
checkpoint still holds the batches the job record says were committed, and Spark's offset and
commit log entries of the last recorded batches match the checksums taken when they were
written. Anything else refuses the restart with the list of problems.
"""

from __future__ import annotations

import hashlib
import os

from epochal.jobs import JobDirectory
from epochal_sdk import SnapshotError


def verify_job(jobdir: JobDirectory) -> list[str]:
    """Problems found in the job's snapshot data (empty when it is sound)."""
    problems: list[str] = []
    store = jobdir.store
    try:
        _, found = store.verify()
        problems += found
    except SnapshotError as exc:
        problems.append(str(exc))
    record = jobdir.load()
    batch = record.progress.get("batch")
    if batch is not None and jobdir.files.local:
        commits = f"{jobdir.checkpoint}/commits"
        if not os.path.isdir(commits) or not os.listdir(commits):
            problems.append(
                f"Spark's checkpoint {jobdir.checkpoint} has no commit log, but the job had "
                f"committed batch {batch}: the checkpoint was lost or moved"
            )
        else:
            problems += _check_checkpoint_logs(jobdir)
    return problems


def _check_checkpoint_logs(jobdir: JobDirectory) -> list[str]:
    problems = []
    keys = jobdir.store.list("checkpoint")[-2:]
    for key in keys:
        batch = int(key.rsplit("/", 1)[1])
        try:
            expected = jobdir.store.read_json(key)
        except SnapshotError as exc:
            problems.append(str(exc))
            continue
        for log_name, digest in expected.items():
            path = f"{jobdir.checkpoint}/{log_name}/{batch}"
            try:
                with open(path, "rb") as fh:
                    actual = hashlib.sha256(fh.read()).hexdigest()
            except FileNotFoundError:
                problems.append(f"Spark's {log_name} log entry for batch {batch} is missing")
                continue
            if actual != digest:
                problems.append(f"Spark's {log_name} log entry for batch {batch} is corrupt")
    return problems
