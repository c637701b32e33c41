"""The manifests that make a lost or corrupt Spark checkpoint visible before a restart (the
missing-data detection).

After each committed batch the driver records the checksums of Spark's offset and commit log
entries of the batch in the run's snapshot store (:func:`record_manifest`, keys
``checkpoint/<batch>``). Before a restart, :func:`verify_job` refuses to go on unless every
snapshot entry matches its header (size, checksum), the checkpoint still holds the batches the
job record says were committed, and the log entries of the last recorded batches match their
manifests.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from epochal.state.checkpoint import Checkpoint
from epochal.state.store import SnapshotStore
from epochal_sdk import SnapshotError

if TYPE_CHECKING:
    from epochal.state.jobs import JobDirectory
    from epochal.state.lease.fence import Fence

MANIFESTS = "checkpoint"
"""The snapshot store's directory of checkpoint manifests (one entry per batch)."""
LOGS = ("offsets", "commits")
"""The logs of Spark's checkpoint that the manifests cover."""


def record_manifest(state: str, batch: int, fence: Fence, checkpoint_at: str | None = None) -> None:
    """Record the checksums of Spark's offset and commit log entries of ``batch`` in the
    snapshot store of the state directory ``state`` (anchored to it when the run is leased).
    The checkpoint is ``<state>/checkpoint``, or ``checkpoint_at`` (a plain session's query
    keeps it where its ``checkpointLocation`` says)."""
    entry = {}
    checkpoint = Checkpoint(checkpoint_at or f"{state}/checkpoint")
    for log_name in LOGS:
        try:
            data = checkpoint.read(f"{log_name}/{batch}")
        except OSError:
            continue
        if data is not None:
            entry[log_name] = hashlib.sha256(data).hexdigest()
    if entry:
        store = SnapshotStore(f"{state}/store", anchor=state if fence.active else None)
        store.write_json(f"{MANIFESTS}/{batch:012d}", entry, count=len(entry))


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
        # a plain session's query notes its own checkpoint (its checkpointLocation)
        location = str(record.driver.get("checkpoint") or jobdir.checkpoint)
        checkpoint = Checkpoint(location)
        if not checkpoint.batches("commits"):
            problems.append(
                f"Spark's checkpoint {location} has no commit log, but the job had "
                f"committed batch {batch}: the checkpoint was lost or moved"
            )
        else:
            problems += _check_checkpoint_logs(jobdir, checkpoint)
    return problems


def _check_checkpoint_logs(jobdir: JobDirectory, checkpoint: Checkpoint) -> list[str]:
    problems = []
    keys = jobdir.store.list(MANIFESTS)[-2:]
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
