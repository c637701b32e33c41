"""Snapshot verification before a restart (the seeds' missing-data detection).

A job restarts only if every snapshot entry matches its manifest (size, checksum), the Spark
checkpoint still holds the batches the job record says were committed, and Spark's offset and
commit log entries of the last recorded batches match the checksums taken when they were
written. Anything else refuses the restart with the list of problems. The checkpoint is read
where it is: on local disk, on an object store (``s3://``, read through the same client as
the snapshot store), or through ``pyarrow.fs``.
"""

from __future__ import annotations

import hashlib

from epochal.jobs import JobDirectory
from epochal.store import Checkpoint
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
    if batch is not None:
        checkpoint = Checkpoint(jobdir.checkpoint)
        if not checkpoint.batches("commits"):
            problems.append(
                f"Spark's checkpoint {jobdir.checkpoint} has no commit log, but the job had "
                f"committed batch {batch}: the checkpoint was lost or moved"
            )
        else:
            problems += _check_checkpoint_logs(jobdir, checkpoint)
    return problems


def _check_checkpoint_logs(jobdir: JobDirectory, checkpoint: Checkpoint) -> list[str]:
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
            data = checkpoint.read(f"{log_name}/{batch}")
            if data is None:
                problems.append(f"Spark's {log_name} log entry for batch {batch} is missing")
                continue
            if hashlib.sha256(data).hexdigest() != digest:
                problems.append(f"Spark's {log_name} log entry for batch {batch} is corrupt")
    return problems
