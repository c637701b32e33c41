"""What a plain session's query writes of its own job, as a supervised driver does of its: after
each committed batch, the job record's progress (batch, rows, when), the checksums of Spark's
log entries of the batch (the checkpoint's manifest, :func:`~epochal.state.manifests.
record_manifest`), where the checkpoint is (so that ``jobs verify`` checks it), and the
job's metrics; at the end of an available-now run that finished its data, ``COMPLETED``.

Called from the session check's listener (``epochal.register``) in the driver's Python
process, for each query whose driver holds its job's lease (its session record, see
:mod:`epochal.state.lease.session`). Every write is fenced on the lease epoch of the record:
a driver that lost the job writes nothing of it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from epochal.state.jobs import JobDirectory, JobStatus
from epochal.state.lease.session import LOST, read_record
from epochal.state.manifests import record_manifest

log = logging.getLogger("epochal.session_progress")


@dataclass
class SessionQuery:
    """A query of a plain session that holds its job's lease: the job's directory, the
    driver's session record, Spark's checkpoint of the query, and whether it runs until its
    data is done (``Trigger.AvailableNow``)."""

    job_dir: str
    record: str
    checkpoint: str | None
    available_now: bool
    run: int | None = None
    """The job's run this query is, once it committed a batch (its transactions carry it)."""

    @classmethod
    def of(cls, query: Any, job_dir: str, record: str) -> SessionQuery:
        """The query ``query`` (PySpark's ``StreamingQuery``) as its job knows it."""
        checkpoint = None
        try:
            execution = query._jsq.streamingQuery()
            checkpoint = _local(str(execution.resolvedCheckpointRoot()))
        except Exception as exc:  # an older or other Spark: no checkpoint to verify
            log.warning("epochal: query %s: its checkpoint unread: %s", query.id, exc)
            execution = None
        return cls(job_dir, record, checkpoint, _available_now(execution))

    def _held(self) -> tuple[JobDirectory, Any] | None:
        found = read_record(self.record)
        if found is None or "epoch" not in found or found.get(LOST):
            return None
        snapshot_dir, _, name = self.job_dir.rstrip("/").rpartition("/")
        jobdir = JobDirectory(snapshot_dir, name)
        return jobdir, jobdir.fence(int(found["epoch"]))

    def batch_committed(self, progress: Any) -> None:
        """One batch of the query was committed (Spark's ``QueryProgressEvent.progress``)."""
        held = self._held()
        if held is None:
            return
        jobdir, fence = held
        batch, rows = int(progress.batchId), int(progress.numInputRows)
        if self.checkpoint:
            record_manifest(jobdir.state_dir(fence.epoch), batch, fence, self.checkpoint)
        with jobdir.update(fence) as current:
            self.run = current.run
            if rows == 0 and current.progress.get("batch") == batch:
                return
            current.progress = {
                "batch": batch,
                "rows": int(current.progress.get("rows", 0)) + rows,
                "last_rows": rows,
                "duration_ms": int(progress.batchDuration),
                "at": time.time(),
            }
            current.status = JobStatus.RUNNING
            if self.checkpoint:
                current.driver = {**current.driver, "checkpoint": self.checkpoint}
            created = current.created
        try:
            from epochal.metrics import exposition, recording

            recording.collect(jobdir.path, batch, json.loads(progress.json), created)
            exposition.write_textfile(jobdir)
        except Exception:  # metrics never fail a batch
            log.warning("metrics of batch %s not collected", batch, exc_info=True)

    def settle_stopped(self, report: Any) -> None:
        """The query stopped without a failure (a ``query.stop()``, or an available-now run
        that finished) and none of its tasks runs any more: settle what it left in doubt in
        the job's transactional sinks (a batch the stop interrupted may have prepared
        transactions its driver never decided), so the stopped job holds nothing open in
        them: those of this run and earlier ones only, never a later query's of the job.
        Each sink's outcome goes to ``report``; one that cannot be settled now is settled by
        the next start's recovery (so is a query that never committed a batch)."""
        held = self._held()
        if held is None or self.run is None:
            return
        from epochal.parts.settling import job_incarnation, settle_sinks

        jobdir, fence = held
        done, unsettled = settle_sinks(
            jobdir.store,
            jobdir.name,
            job_incarnation(jobdir),
            run=self.run + 1,
            fence=fence.check,
        )
        for line in [line for _, line in done] + [sink.describe() for sink in unsettled]:
            report(f"epochal: job {jobdir.name!r}, its query stopped: {line}")

    def ended(self, failure: str | None) -> None:
        """The query ended: an available-now run that ended without a failure finished its
        data, and its job is ``COMPLETED`` (a query ended because its driver lost the lease
        is not: it fails, and the record says LOST). Spark tells an available-now query that
        its application stopped before its data was done from one that finished by no sign
        a listener sees: such a query shows ``COMPLETED`` too, until its next start."""
        if failure is not None or not self.available_now:
            return
        held = self._held()
        if held is None:
            return
        jobdir, fence = held
        with jobdir.update(fence) as current:
            current.status = JobStatus.COMPLETED
            entry = current.run_entry(current.run)
            if entry is not None and "ended" not in entry:
                entry["ended"] = time.time()
                entry["outcome"] = "its available-now query finished its data"


def _local(location: str) -> str:
    """A checkpoint location as epochal reads it: ``file:`` URIs as plain paths."""
    if location.startswith("file:"):
        return "/" + location[len("file:") :].lstrip("/")
    return location


def _available_now(execution: Any) -> bool:
    """Whether Spark's query ``execution`` (its ``StreamExecution``) runs with
    ``Trigger.AvailableNow``: its trigger, or the executor Spark made of it (a
    ``MultiBatchExecutor``), read through py4j; False when neither can be read."""
    for read in ("trigger", "triggerExecutor"):
        try:
            name = str(getattr(execution, read)().getClass().getName())
        except Exception:
            continue
        return "AvailableNow" in name or "MultiBatchExecutor" in name
    return False
