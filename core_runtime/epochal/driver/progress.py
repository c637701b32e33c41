"""The progress of a driver's runs: where each run's start went (:class:`Phases`), the run the
driver is on (:class:`RunState`), and what every committed batch updates
(:class:`ProgressReporter`: the checkpoint manifest, the job record, the job's metrics, an
event for the supervisor), called by a Spark query listener (:func:`make_listener`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from epochal.base.fault_plan import FaultPlan
from epochal.control.messages import emit
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.lease.fence import Fence
from epochal.state.manifests import record_manifest
from epochal_sdk.errors import FencedError

log = logging.getLogger("epochal.driver")


class Phases:
    """Where a run's start went: seconds spent in each step up to its first batch (the
    process and its session, connector registration, binding to the job, the quorum, the
    query's start, the first batch), kept in the run's history entry."""

    def __init__(self, started: float) -> None:
        self._last = started
        self._spent: dict[str, float] = {}

    def mark(self, step: str, since: float | None = None, at: float | None = None) -> None:
        """``step`` ended now (or ``at``), after the last mark (or ``since``)."""
        now = time.time() if at is None else at
        self._spent[step] = round(now - (self._last if since is None else since), 3)
        self._last = now

    def as_dict(self) -> dict[str, float]:
        return dict(self._spent)


@dataclass
class RunState:
    """The run the driver is on now (shared with the listener's thread), and where its start
    went."""

    run: int = 0
    kind: str = "cold"
    started: float = 0.0
    query_run_id: str | None = None
    first_batch_seen: bool = False
    phases: Phases = field(default_factory=lambda: Phases(time.time()))
    lock: threading.Lock = field(default_factory=threading.Lock)


def batch_ended(progress: Any) -> float:
    """When a batch of Spark's progress report ended (its trigger's start plus its
    ``triggerExecution`` time), not when the report reached the driver's listener, which is
    a quarter to half a second later on a busy machine; now if the report does not say."""
    try:
        started = datetime.fromisoformat(str(progress.timestamp).replace("Z", "+00:00"))
        took = float(dict(progress.durationMs or {})["triggerExecution"]) / 1000
    except (KeyError, TypeError, ValueError):
        return time.time()
    return min(started.timestamp() + took, time.time())


class ProgressReporter:
    """What each committed batch of the job's query updates: the checksums of Spark's log
    entries (:func:`~epochal.state.manifests.record_manifest`), the job record's progress and
    run history (the first batch of a run marks it RUNNING and records its phases), the job's
    metrics, and a ``progress`` event for the supervisor."""

    def __init__(
        self, jobdir: JobDirectory, record: JobRecord, state: str, fence: Fence, current: RunState
    ) -> None:
        self.jobdir, self.record, self.state, self.fence = jobdir, record, state, fence
        self.current = current

    def on_progress(self, progress: Any) -> None:
        """One batch of the query was committed (Spark's ``QueryProgressEvent.progress``)."""
        with self.current.lock:
            if str(progress.runId) != self.current.query_run_id:
                return  # a late event of a query that was restarted
            run, started = self.current.run, self.current.started
            first = not self.current.first_batch_seen
            self.current.first_batch_seen = True
            phases = self.current.phases
        batch = int(progress.batchId)
        rows = int(progress.numInputRows)
        if rows == 0 and batch == self.record.progress.get("batch") and not first:
            return
        record_manifest(self.state, batch, self.fence)
        with self.jobdir.update(self.fence) as current:
            total = int(current.progress.get("rows", 0)) + rows
            current.progress = {
                "batch": batch,
                "rows": total,
                "last_rows": rows,
                "duration_ms": int(progress.batchDuration),
                "at": time.time(),
            }
            current.restarts_in_a_row = 0
            if first:
                current.status = JobStatus.RUNNING
                entry = current.run_entry(run)
                if entry is not None:
                    ended = batch_ended(progress)
                    entry["first_batch"] = batch
                    entry["first_batch_at"] = ended
                    entry["first_batch_s"] = round(ended - started, 3)
                    entry["first_batch_rows"] = rows
                    entry["first_batch_spark_ms"] = {
                        str(k): int(v) for k, v in dict(progress.durationMs or {}).items()
                    }
                    phases.mark("first batch", at=ended)
                    entry["phases"] = phases.as_dict()
                    if entry.get("failed_at"):
                        entry["recovery_s"] = round(ended - float(entry["failed_at"]), 3)
            self.record.progress = current.progress
        self._collect_metrics(batch, progress)
        emit(
            {
                "type": "progress",
                "job": self.record.name,
                "run": run,
                "batch": batch,
                "rows": rows,
            }
        )

    def _collect_metrics(self, batch: int, progress: Any) -> None:
        """Fold the parts' metrics of this batch and Spark's progress into the job's metrics;
        rewrite the Prometheus textfile (best effort: metrics never fail a batch)."""
        try:
            from epochal.metrics import exposition, recording

            recording.collect(
                self.jobdir.path, batch, json.loads(progress.json), self.record.created
            )
            exposition.write_textfile(self.jobdir)
        except Exception:
            log.warning("metrics of batch %s not collected", batch, exc_info=True)


def make_listener(reporter: ProgressReporter, faults: FaultPlan, on_fenced: Any) -> Any:
    """A listener that reports each committed batch (:class:`ProgressReporter`), then fires the
    fault plan's ``job.after_batch`` crash point; ``on_fenced(reason)`` stops the run when the
    report finds it fenced."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            try:
                reporter.on_progress(event.progress)
            except FencedError as exc:
                on_fenced(f"fenced while reporting progress: {exc}")
            except Exception:  # progress must never break the query
                log.exception("progress report failed")
            faults.reach("job.after_batch", int(event.progress.batchId))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return ProgressListener()
