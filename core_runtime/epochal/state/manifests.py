"""The manifests that make a lost or corrupt Spark checkpoint visible before a restart (the
missing-data detection).

After each committed batch the driver records the checksums of Spark's offset and commit log
entries of the batch in the run's snapshot store (:func:`record_manifest`, keys
``checkpoint/<batch>``), and keeps the newest :data:`~epochal.state.retention.MANIFEST_BATCHES`
of them (:func:`trim_manifests`). Before a restart, :func:`verify_job` refuses to go on unless
the snapshot entries the restart uses match their headers (size, checksum), the checkpoint
still holds the batches the job record says were committed, and the log entries of the last
recorded batches match their manifests. It reads what the restart needs, found by name, so its
cost does not grow with the job's age; ``jobs verify`` can read every entry (``full``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from epochal.state import retention
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
COMPARED = 2
"""How many of the newest manifests a restart compares with Spark's log entries."""

_trimmed: set[str] = set()
"""The stores whose manifests this process has trimmed once (at its first batch)."""


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
        store.write_json(manifest_key(batch), entry, count=len(entry))
        if retention.due(batch, first=store.root not in _trimmed):
            trim_manifests(store, batch)
            _trimmed.add(store.root)


def manifest_key(batch: int) -> str:
    """The store key of the manifest of ``batch``."""
    return f"{MANIFESTS}/{batch:012d}"


def trim_manifests(store: SnapshotStore, batch: int) -> int:
    """Delete the manifests older than the newest :data:`~epochal.state.retention.
    MANIFEST_BATCHES` at ``batch``; returns how many were deleted. A store written by an
    older epochal, which kept every manifest, is trimmed the first time (one listing)."""
    oldest = retention.oldest_kept(batch, retention.MANIFEST_BATCHES)
    deleted = 0
    for key in store.list(MANIFESTS):
        if int(key.rsplit("/", 1)[1]) >= oldest:
            break  # sorted: the rest are kept
        store.delete(key)
        deleted += 1
    return deleted


def verify_job(jobdir: JobDirectory, *, full: bool = False) -> list[str]:
    """Problems found in the job's snapshot data (empty when it is sound).

    What a restart uses is read: every entry of the store but the manifests (the connectors'
    records, each kind bounded by its retention), and the manifests of the last
    :data:`COMPARED` committed batches, by name. ``full`` reads every manifest too."""
    problems: list[str] = []
    store = jobdir.store
    try:
        _, found = store.verify(skip=() if full else (MANIFESTS,))
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
            problems += _check_checkpoint_logs(store, checkpoint, int(batch))
    return problems


def newest_manifests(store: SnapshotStore, batch: int) -> list[int]:
    """The batches of the newest :data:`COMPARED` manifests up to ``batch + 1`` (``batch``:
    the job record's last committed batch; the next one's manifest exists when its driver
    stopped between writing it and the record), oldest first. Looked up by name, newest
    first, at most the retention back: a batch whose log entries were not there to record has
    none. The store's size does not change what this reads."""
    found: list[int] = []
    for candidate in range(batch + 1, max(batch - retention.MANIFEST_BATCHES, -1), -1):
        if store.exists(manifest_key(candidate)):
            found.append(candidate)
            if len(found) == COMPARED:
                break
    return found[::-1]


def _check_checkpoint_logs(store: SnapshotStore, checkpoint: Checkpoint, last: int) -> list[str]:
    problems = []
    for batch in newest_manifests(store, last):
        try:
            expected = store.read_json(manifest_key(batch))
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
