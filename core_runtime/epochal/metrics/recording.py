"""Metrics of a job, per batch and per part: what flowed, how long the protocol steps took,
what recovery found; shown by ``epochal jobs status``, ``epochal jobs metrics`` (Prometheus
text), a textfile beside the job and the supervisor's endpoint (``--metrics-port``).
This module records and folds them; :mod:`epochal.metrics.exposition` shows them and
:mod:`epochal.metrics.endpoint` serves them.

Where they come from:

* every protocol step of a part reports what it measured as a small *pending* file under
  ``<job>/metrics/pending/`` (:func:`report`): a sink's per-batch commit (records and bytes
  written by its tasks, as the tasks' commit messages carry them; the decision and phase-2
  latencies; stray transactions rolled back; the connector's own metrics), an acknowledging
  source's driver side (records and bytes stored, duplicates dropped, acknowledgement
  latency), a replayable source's read tasks (records and bytes read, when the executors
  see the job's directory: local mode and shared file systems), a sink's recovery (in-doubt
  transactions found, committed, rolled back);
* after each batch the driver folds them into ``<job>/metrics/state.json`` with Spark's
  progress of the batch (:func:`collect`) and rewrites the textfile ``epochal.prom``;
* restarts, runs and recovery times come from the job record at the moment of reading.

Metrics are best effort: a failure to write or read them is logged and never fails a job.
Spark's own query progress carries what Spark measures (input rows, durations); Spark 4.3
has no way for a Python data source to add metrics of its own to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from epochal.base import files
from epochal.state import retention

log = logging.getLogger("epochal.metrics")

PENDING = "pending"
STATE = "state.json"
TEXTFILE = "epochal.prom"

COUNTERS = {
    "records_in": "records read (a replayed batch's records count again)",
    "bytes_in": "bytes read (Arrow, in memory)",
    "records_out": "records written by the part's tasks (replays and retries count again)",
    "records_committed": (
        "records of the batches the sink committed, once per batch whatever its replays and "
        "retries (a transactional sink's from its commit decision); a source's: the records "
        "its tasks handed over, once per batch and task whatever the replays"
    ),
    "bytes_out": "bytes written (Arrow, in memory)",
    "dedupe_dropped": "redelivered messages dropped by the dedupe window",
    "redeliveries_outside_window": "redelivered messages older than the dedupe window",
    "acked": "messages acknowledged",
    "in_doubt": "in-doubt transactions found (recovery, and failed attempts after a batch)",
    "committed": "transactions committed by the driver (phase 2 and recovery)",
    "rolled_back": "transactions rolled back (undecided at recovery, failed attempts)",
    "replays_skipped": "tasks of an already decided batch that wrote nothing",
    "batches": "batches this part took part in",
}
"""The runtime's counters of a part, by the key a step reports them under."""
ONCE_PER_BATCH = ("records_committed",)
"""Counters a step reports whole for its batch, as often as it touches the batch (a replay,
a recovery): a batch counts once, by its largest report, never by the sum of its reports
(a task reports its share, with its Spark partition: each task's largest, summed).
Reports are folded in the order they were made; a report of a batch no longer among the
part's last :data:`~epochal.state.retention.METRIC_BATCHES` batches (a recovery's comes at
the next run's start, a batch or two later) would count again."""

PHASES = {
    "plan": "planning a batch (latest offsets, receiving and storing messages)",
    "read": "a read task",
    "store": "storing an acknowledging source's batch",
    "ack": "acknowledging a batch",
    "write": "a write task (writing, then prepare or flush)",
    "prepare": "phase 1 in a task (prepare)",
    "flush": "an idempotent task's flush",
    "decide": "recording the commit decision",
    "commit": "phase 2 (committing the decided transactions)",
    "recover": "recovery at the start of a run",
}
"""Timed protocol phases: a step reports ``<phase>_seconds`` and ``<phase>_seconds_count``."""

CONNECTOR_PREFIX = "connector."
"""Values a connector recorded through its context's metrics handle carry this prefix."""


# -- where -----------------------------------------------------------------------------------
def metrics_dir(job_dir: str | None) -> str | None:
    """This machine's metrics directory of a job: ``<job>/metrics`` when the job's directory
    is local, else the job's local directory (see :func:`epochal.state.layout.local_dir`)."""
    if not job_dir:
        return None
    if "://" not in job_dir:
        return f"{job_dir}/metrics"
    from epochal.state.layout import local_dir

    snapshot_dir, _, name = job_dir.rstrip("/").rpartition("/")
    return os.path.join(local_dir(snapshot_dir, name), "metrics")


# -- reporting (any process of a job) ----------------------------------------------------------
def report(
    job_dir: str | None,
    kind: str,
    part_id: str,
    connector: str,
    batch: int | None,
    values: dict[str, float],
    *,
    task_side: bool = False,
    task: int | None = None,
) -> None:
    """Leave what one step of a part measured for the driver to collect. ``batch`` None:
    the batch the driver completes next. A task only reports when the job's directory is
    on a file system it sees (``task_side``); ``task``: its Spark partition, when its
    :data:`ONCE_PER_BATCH` values are its share of the batch's. Never raises."""
    directory = metrics_dir(job_dir)
    if directory is None or not values:
        return
    if task_side and not os.path.isdir(directory.rsplit("/", 1)[0]):
        return  # an executor that does not see the job's directory: nothing to leave
    entry = {
        "kind": kind,
        "part": part_id,
        "connector": connector,
        "batch": batch,
        "values": {k: float(v) for k, v in values.items()},
    }
    if task is not None:
        entry["task"] = task
    try:
        pending = f"{directory}/{PENDING}"
        files.makedirs(pending)
        # named by when: the driver folds them in the order they were made, so a batch's
        # second report (a replay's, a recovery's) meets its first (ONCE_PER_BATCH)
        name = f"{pending}/{time.time_ns():020d}-{kind}-{part_id}-{uuid.uuid4().hex}"
        with files.open_private(f"{name}.tmp") as fh:
            json.dump(entry, fh)
        os.replace(f"{name}.tmp", f"{name}.json")
        global _driver_reports
        _driver_reports += not task_side
        due = batch is not None and retention.due(batch)
        if not task_side and (due or _driver_reports % 50 == 1):
            trim_pending(pending)
    except OSError as exc:
        log.debug("metrics of %s %s not reported: %s", kind, part_id, exc)


_driver_reports = 0
"""Reports this process made on the driver's side (planners, commit workers)."""


def trim_pending(pending: str, keep: int = retention.PENDING_METRICS) -> int:
    """Delete the oldest reports beyond ``keep`` in the pending directory ``pending``: a job
    whose driver collects nothing (a plain session's query whose listener is not there)
    must not fill its directory. Returns how many were deleted."""
    names = [n for n in os.listdir(pending) if n.endswith(".json")]
    if len(names) <= keep:
        return 0
    dated = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            dated.append((os.stat(f"{pending}/{name}").st_mtime, name))
    dated.sort()
    for _, name in dated[: len(dated) - keep]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{pending}/{name}")
    log.warning(
        "metrics: %s held %s reports nobody collected (no progress listener on the driver: "
        "call epochal.register(spark)); kept the newest %s",
        pending,
        len(names),
        keep,
    )
    return max(0, len(dated) - keep)


@contextlib.contextmanager
def timed(values: dict[str, float], phase: str) -> Iterator[None]:
    """Add the block's duration to ``values`` as one timing of ``phase``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add(
            values, {f"{phase}_seconds": time.perf_counter() - started, f"{phase}_seconds_count": 1}
        )


def add(values: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Sum ``more`` into ``values`` (returns ``values``)."""
    for key, value in more.items():
        values[key] = values.get(key, 0.0) + float(value)
    return values


def connector_values(drained: dict[str, float]) -> dict[str, float]:
    """A connector's metrics (its context's handle, drained) under :data:`CONNECTOR_PREFIX`."""
    return {f"{CONNECTOR_PREFIX}{k}": v for k, v in drained.items()}


# -- collecting (the driver, after each batch) --------------------------------------------------
def collect(
    job_dir: str, batch: int, progress: dict[str, Any] | None, job_created: float
) -> dict[str, Any]:
    """Fold the pending reports into the job's metrics state, attribute those without a
    batch to ``batch``, note Spark's ``progress`` of it, rewrite the state; returns it."""
    directory = metrics_dir(job_dir)
    assert directory is not None
    state = load_state(job_dir)
    if state.get("job_created") != job_created:  # a job started over (replaced, cancelled)
        state = {"job_created": job_created, "parts": {}, "spark": {}}
    pending = f"{directory}/{PENDING}"
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(pending)):
            if not name.endswith(".json"):
                continue
            path = f"{pending}/{name}"
            try:
                with open(path) as fh:
                    entry = json.load(fh)
                os.unlink(path)
            except (OSError, ValueError) as exc:
                log.debug("metrics: skipping %s: %s", name, exc)
                continue
            _fold(state, entry, batch)
    if progress is not None:
        spark = state.setdefault("spark", {})
        spark["batch"] = batch
        spark["input_rows_total"] = int(spark.get("input_rows_total", 0)) + int(
            progress.get("numInputRows") or 0
        )
        spark["output_rows_total"] = int(spark.get("output_rows_total", 0)) + max(
            0, int((progress.get("sink") or {}).get("numOutputRows") or 0)
        )
        spark["duration_ms"] = {k: int(v) for k, v in (progress.get("durationMs") or {}).items()}
    _write_json(f"{directory}/{STATE}", state)
    return state


def _fold(state: dict[str, Any], entry: dict[str, Any], batch: int | None) -> None:
    key = f"{entry['kind']}-{entry['part']}"
    part = state["parts"].setdefault(
        key,
        {
            "kind": entry["kind"],
            "part": entry["part"],
            "connector": entry.get("connector", ""),
            "totals": {},
            "batches": [],
        },
    )
    values = {k: float(v) for k, v in entry["values"].items()}
    at = entry["batch"] if entry.get("batch") is not None else batch
    batches = part["batches"]
    current = next((b for b in batches if b["batch"] == at), None)
    if current is None:
        current = {"batch": at, "values": {}}
        batches.append(current)
        batches.sort(key=lambda b: -1 if b["batch"] is None else b["batch"])
        del batches[: -retention.METRIC_BATCHES]
        if "batches" not in values and at is not None:
            values["batches"] = 1.0
    task = entry.get("task")
    for name in ONCE_PER_BATCH:
        if name in values:
            reported = values.pop(name)
            if task is not None:  # a task's share: each task once, the batch their sum
                shares = current.setdefault("shares", {}).setdefault(name, {})
                shares[str(task)] = max(float(shares.get(str(task), 0.0)), reported)
                reported = sum(shares.values())
            before = float(current["values"].get(name, 0.0))
            value = max(before, reported)
            current["values"][name] = value
            part["totals"][name] = float(part["totals"].get(name, 0.0)) + value - before
    add(current["values"], values)
    add(part["totals"], values)


def load_state(job_dir: str | None) -> dict[str, Any]:
    """The job's metrics state (empty when there is none yet)."""
    directory = metrics_dir(job_dir)
    if directory is None:
        return {}
    try:
        with open(f"{directory}/{STATE}") as fh:
            return dict(json.load(fh))
    except (OSError, ValueError):
        return {}


def _write_json(path: str, value: Any) -> None:
    files.makedirs(os.path.dirname(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    with files.open_private(tmp) as fh:
        json.dump(value, fh, sort_keys=True)
    os.replace(tmp, path)


def current_state(job_dir: str) -> dict[str, Any]:
    """The metrics state with the reports not collected yet folded in (read only): what a
    step reported after the driver's last batch (e.g. a job's last batch) shows too."""
    state = load_state(job_dir) or {"parts": {}, "spark": {}}
    state.setdefault("parts", {})
    directory = metrics_dir(job_dir)
    last = (state.get("spark") or {}).get("batch")
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(f"{directory}/{PENDING}")):
            if name.endswith(".json"):
                try:
                    with open(f"{directory}/{PENDING}/{name}") as fh:
                        _fold(state, json.load(fh), last)
                except (OSError, ValueError):
                    continue
    return state
