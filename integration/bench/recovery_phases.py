"""Where a recovery's time went, phase by phase: kill → the first batch committed after it.

    python -m integration.bench.recovery_phases JOB_DIR [--events DIR]

``JOB_DIR`` is a job's directory (``<snapshot_dir>/<name>``: ``python -m epochal demo --dir D``
leaves ``D/snapshots/demo``). Each recovery of the job's record (a run that began after a
failure) is taken apart into the steps it went through, each in seconds from the step before:

``failure seen``      the kill → the supervisor (driver killed) or the driver (query failed)
                      saw the run end: the run's ``ended``
``promotion``         → the new run began (the supervisor's backoff and new lease epoch, the
                      standby's warm-up stopped, its job bound): the run's ``started``
``restart``, ``bind``, ``quorum``, ``query start``
                      the run's own ``phases`` (the job record)
``first batch``       → the first batch committed, split with the driver's Spark event log
                      (``--events``) into: the query's start to its first trigger (the source
                      runner and the offset logs), the trigger's offsets and planning, the
                      write's planning (the sink's check and the decided batch's recovery, in a
                      planner worker), the batch's Spark job (its read stage, its stateful and
                      write stage; the state store's load from the checkpoint is noted), the
                      sink's commit on the driver, and Spark's and epochal's records of the
                      batch.

The kill's moment comes from the fault markers of the job (``<job>/faults``, what the demo's
crash points leave) or from the caller (the benchmark). For a standby, the state of the warm
standby at the kill is read from its own event log: when its JVM started, whether its warm-up
query had run (its batches done before the kill), i.e. whether it was ready. A steady batch of
the same query (the median of its later batches) is printed beside the first one.

The event logs come from ``spark.eventLog.enabled=true`` and ``spark.eventLog.dir`` (see
:func:`event_log_conf`; for ``python -m epochal demo``, which takes no Spark settings, give
them in ``PYSPARK_SUBMIT_ARGS``: ``--conf spark.eventLog.enabled=true --conf
spark.eventLog.dir=file:///DIR --conf spark.eventLog.compress=false pyspark-shell``).
Compressed logs (Spark's default, zstd) are read with the ``zstandard`` module or the
``zstd`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from epochal.base import files
from epochal.startup.warmup import BATCHES_PER_START, WARMUP_QUERY_PREFIX
from epochal.state.layout import FAULTS

QUERY_STARTED = "QueryStartedEvent"
QUERY_PROGRESS = "QueryProgressEvent"
QUERY_TERMINATED = "QueryTerminatedEvent"
SQL_START = "SparkListenerSQLExecutionStart"
SQL_END = "SparkListenerSQLExecutionEnd"
WARMUP_BATCHES = sum(BATCHES_PER_START)
"""Batches of a standby's warm-up (two on a new checkpoint, one after its restart)."""


_PHASE_ORDER = {
    name: index
    for index, name in enumerate(
        ("process", "session", "register", "restart", "bind", "quorum", "query start")
    )
}
"""The order in which a driver goes through the phases of a run (the record keeps them by
name)."""


def event_log_conf(directory: str) -> dict[str, str]:
    """Spark settings that make a driver write an uncompressed event log to ``directory``."""
    os.makedirs(directory, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{os.path.abspath(directory)}",
        "spark.eventLog.compress": "false",
    }


# -- the event logs ---------------------------------------------------------------------------
@dataclass
class Batch:
    """One micro-batch of a query, as Spark's progress and SQL events show it (seconds)."""

    batch: int
    trigger_start: float
    duration_ms: dict[str, int]
    state: dict[str, Any] = field(default_factory=dict)
    add_start: float | None = None
    add_end: float | None = None
    jobs: list[tuple[float, float]] = field(default_factory=list)
    stages: list[tuple[float, float, int]] = field(default_factory=list)
    """(submitted, completed, tasks) of each stage of the batch's Spark jobs, in order."""

    @property
    def trigger_end(self) -> float:
        return self.trigger_start + self.duration_ms.get("triggerExecution", 0) / 1000


@dataclass
class QueryRun:
    """One start of a streaming query in one driver application."""

    run_id: str
    name: str | None
    started: float
    batches: list[Batch] = field(default_factory=list)
    terminated: bool = False


@dataclass
class SparkApp:
    """What one driver application's event log says."""

    app_id: str
    submitted: float | None = None
    """When its JVM was launched (``spark.app.submitTime``)."""
    started: float | None = None
    """When its SparkContext started."""
    queries: list[QueryRun] = field(default_factory=list)

    def query(self, run_id: str) -> QueryRun | None:
        return next((q for q in self.queries if q.run_id == run_id), None)


def _lines(path: str) -> Iterator[str]:
    """The lines of one event log file, decompressed when it is (zstd)."""
    if path.endswith(".zstd") or path.endswith(".zst"):
        try:
            import zstandard

            with open(path, "rb") as fh:
                reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
                yield from io.TextIOWrapper(reader, encoding="utf-8", errors="replace")
            return
        except ImportError:
            text = subprocess.run(
                ["zstd", "-dcq", path], capture_output=True, text=True, check=False
            ).stdout
            yield from text.splitlines()
            return
    if path.endswith((".lz4", ".snappy", ".lzf")):
        raise ValueError(
            f"{path}: event log compressed with {path.rsplit('.', 1)[1]}, which this reader "
            "cannot read: set spark.eventLog.compress=false (or its codec to zstd)"
        )
    with open(path, encoding="utf-8", errors="replace") as fh:
        yield from fh


def _event_files(directory: str) -> list[list[str]]:
    """Each application's event log files (Spark's rolling ``eventlog_v2_*`` directories, or
    single files), in order."""
    apps = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and name.startswith("eventlog_v2_"):
            parts = [p for p in os.listdir(path) if p.startswith("events_")]
            parts.sort(key=lambda p: int(p.split("_")[1]))
            apps.append([os.path.join(path, p) for p in parts])
        elif os.path.isfile(path) and not name.startswith("."):
            apps.append([path])
    return apps


def _iso(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_app(paths: list[str]) -> SparkApp:
    """Read one application's event log (its files in order)."""
    app = SparkApp(app_id=os.path.basename(paths[0]))
    executions: dict[int, dict[str, Any]] = {}
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, tuple[float, float, int]] = {}
    progress: list[tuple[str, Batch]] = []
    for path in paths:
        for line in _lines(path):
            if not line.strip():
                continue
            with contextlib.suppress(ValueError):
                _fold(json.loads(line), app, executions, jobs, stages, progress)
    for run_id, batch in progress:
        root = next(
            (
                e
                for e in executions.values()
                if e["root"] == e["id"]
                and f"runId = {run_id}" in e["description"]
                and e["description"].rstrip().endswith(f"batch = {batch.batch}")
                and batch.trigger_start - 0.5 <= e["start"] <= batch.trigger_end + 0.5
            ),
            None,
        )
        if root is not None:
            batch.add_start, batch.add_end = root["start"], root.get("end")
            for job in sorted(jobs.values(), key=lambda j: j["submitted"]):
                if job["root"] == root["id"] and job.get("completed"):
                    batch.jobs.append((job["submitted"], job["completed"]))
                    batch.stages += [stages[s] for s in sorted(job["stages"]) if s in stages]
        query = app.query(run_id)
        if query is not None:
            query.batches.append(batch)
    return app


def _fold(
    event: dict[str, Any],
    app: SparkApp,
    executions: dict[int, dict[str, Any]],
    jobs: dict[int, dict[str, Any]],
    stages: dict[int, tuple[float, float, int]],
    progress: list[tuple[str, Batch]],
) -> None:
    kind = str(event.get("Event", "")).rsplit(".", 1)[-1].rsplit("$", 1)[-1]
    if kind == "SparkListenerApplicationStart":
        app.app_id, app.started = str(event.get("App ID")), event["Timestamp"] / 1000
    elif kind == "SparkListenerEnvironmentUpdate":
        submitted = (event.get("Spark Properties") or {}).get("spark.app.submitTime")
        if submitted:
            app.submitted = int(submitted) / 1000
    elif kind == QUERY_STARTED:
        app.queries.append(QueryRun(event["runId"], event.get("name"), _iso(event["timestamp"])))
    elif kind == QUERY_TERMINATED:
        query = app.query(event["runId"])
        if query is not None:
            query.terminated = True
    elif kind == QUERY_PROGRESS:
        found = event["progress"]
        operators = found.get("stateOperators") or [{}]
        progress.append(
            (
                found["runId"],
                Batch(
                    int(found["batchId"]),
                    _iso(found["timestamp"]),
                    {k: int(v) for k, v in (found.get("durationMs") or {}).items()},
                    operators[0] if operators else {},
                ),
            )
        )
    elif kind == SQL_START:
        executions[event["executionId"]] = {
            "id": event["executionId"],
            "root": event.get("rootExecutionId", event["executionId"]),
            "description": str(event.get("description") or ""),
            "start": event["time"] / 1000,
        }
    elif kind == SQL_END and event["executionId"] in executions:
        executions[event["executionId"]]["end"] = event["time"] / 1000
    elif kind == "SparkListenerJobStart":
        properties = event.get("Properties") or {}
        root = properties.get("spark.sql.execution.root.id")
        jobs[event["Job ID"]] = {
            "submitted": event["Submission Time"] / 1000,
            "root": int(root) if root is not None else None,
            "stages": list(event.get("Stage IDs") or []),
        }
    elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
        jobs[event["Job ID"]]["completed"] = event["Completion Time"] / 1000
    elif kind == "SparkListenerStageCompleted":
        info = event["Stage Info"]
        if info.get("Submission Time") and info.get("Completion Time"):
            stages[info["Stage ID"]] = (
                info["Submission Time"] / 1000,
                info["Completion Time"] / 1000,
                int(info.get("Number of Tasks") or 0),
            )


def read_event_logs(directory: str) -> list[SparkApp]:
    """Every application's event log in ``directory``."""
    return [read_app(paths) for paths in _event_files(directory) if paths]


# -- the recoveries -------------------------------------------------------------------------
@dataclass
class Recovery:
    """One recovery: its run, how it recovered, and its steps (name, seconds) from the kill
    (or, without a known kill, from the failure seen) to the first committed batch."""

    run: int
    kind: str
    killed_at: float | None
    steps: list[tuple[str, float]]
    notes: list[str] = field(default_factory=list)
    steady: str = ""

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.steps)


def load_record(job_dir: str) -> Any:
    """The job's record (``epochal.api.Job``'s status)."""
    from epochal.api import Job

    snapshot_dir, _, name = os.path.abspath(job_dir).rstrip("/").rpartition("/")
    return Job(name, snapshot_dir).status()


def fault_kills(job_dir: str) -> list[float]:
    """When the job's fired crash points killed something (their markers' ``at``)."""
    directory = f"{job_dir}/{FAULTS}"
    kills = []
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for name in (n for n in names if files.TMP_MARKER not in n):
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError), open(path) as fh:
            kills.append(float(json.load(fh)["at"]))
    return sorted(kills)


def recoveries(
    runs: list[dict[str, Any]], apps: list[SparkApp], kills: list[float], name: str
) -> list[Recovery]:
    """Each recovery among ``runs`` (a job record's run entries) taken apart."""
    found = []
    for index, run in enumerate(runs):
        if not run.get("failed_at") or not run.get("first_batch_at"):
            continue
        seen = float(run["failed_at"])
        before = [k for k in kills if k <= seen + 0.01]
        previous_start = float(runs[index - 1].get("started", 0.0)) if index else 0.0
        killed = before[-1] if before and before[-1] >= previous_start else None
        found.append(_recovery(run, runs[:index], apps, killed, name))
    return found


def _recovery(
    run: dict[str, Any],
    earlier: list[dict[str, Any]],
    apps: list[SparkApp],
    killed: float | None,
    name: str,
) -> Recovery:
    seen, started = float(run["failed_at"]), float(run["started"])
    steps: list[tuple[str, float]] = []
    if killed is not None:
        steps.append(("failure seen", seen - killed))
    if started - seen >= 0.0005:
        steps.append(
            ("promotion" if run.get("kind") == "standby" else "to the new run", started - seen)
        )
    phases = dict(run.get("phases") or {})
    first_phase = phases.pop("first batch", None)
    steps += sorted(phases.items(), key=lambda item: _PHASE_ORDER.get(item[0], len(_PHASE_ORDER)))
    recovery = Recovery(int(run["run"]), str(run.get("kind")), killed, steps)
    app, query = _query_of(apps, run, name)
    if first_phase is None:
        first_phase = float(run["first_batch_at"]) - started - sum(phases.values())
    if query is None or not query.batches:
        recovery.steps.append(("first batch", float(first_phase)))
        if apps:
            recovery.notes.append("no event log of this run's query")
    else:
        recovery.steps += _first_batch_steps(query, float(run["first_batch_at"]), first_phase)
        recovery.notes += _state_notes(query.batches[0])
        recovery.steady = _steady(query.batches[1:] or [])
    if run.get("kind") == "standby" and app is not None and killed is not None:
        recovery.notes.insert(0, _standby_at_kill(app, killed, earlier))
    return recovery


def _query_of(
    apps: list[SparkApp], run: dict[str, Any], name: str
) -> tuple[SparkApp | None, QueryRun | None]:
    """The application and query start of a run: the job's query started in its window."""
    started, first = float(run["started"]), float(run["first_batch_at"])
    for app in apps:
        for query in app.queries:
            if query.name == name and started - 0.5 <= query.started <= first:
                return app, query
    return None, None


def _first_batch_steps(
    query: QueryRun, committed_at: float, first_phase: float
) -> list[tuple[str, float]]:
    """The first batch's phase split at the moments the event log gives."""
    batch = query.batches[0]
    begun = committed_at - first_phase  # the query's start returned
    marks = [("to the first trigger", batch.trigger_start)]
    if batch.add_start is not None:
        marks.append(("offsets, planning", batch.add_start))
    if batch.jobs:
        marks.append(("write planned (sink check, 2PC recovery)", batch.jobs[0][0]))
        labels = ["read stage", "stateful + write stage"]
        for position, (_, completed, tasks) in enumerate(batch.stages):
            label = labels[position] if position < len(labels) else f"stage {position + 1}"
            marks.append((f"{label} ({tasks} tasks)", completed))
        marks.append(("to the job's end", batch.jobs[-1][1]))
    if batch.add_end is not None:
        marks.append(("sink commit (driver)", batch.add_end))
    marks.append(("batch end", batch.trigger_end))
    marks.append(("recorded", committed_at))
    steps, last = [], begun
    for label, moment in marks:
        steps.append((f"first batch: {label}", moment - last))
        last = moment
    return steps


def _state_notes(batch: Batch) -> list[str]:
    """What the state store did in a batch (summed over its partitions, as Spark reports)."""
    state = batch.state or {}
    custom = state.get("customMetrics") or {}
    if not state:
        return []
    return [
        "state store (sums over {} partitions): load {} ms ({} loaded from the checkpoint), "
        "updates {} ms, commit {} ms (of which snapshot upload {} ms)".format(
            state.get("numStateStoreInstances", "?"),
            custom.get("rocksdbLoadLatencyMs", "?"),
            custom.get("rocksdbNumLoadedFromDfs", "?"),
            state.get("allUpdatesTimeMs", "?"),
            state.get("commitTimeMs", "?"),
            custom.get("rocksdbCommitFileSyncLatencyMs", "?"),
        )
    ]


def _steady(batches: list[Batch]) -> str:
    """The median of the later batches (of the same query start) by the same split."""
    usable = [b for b in batches if b.jobs and b.add_start is not None and b.add_end is not None]
    if not usable:
        return ""

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    parts = [
        ("trigger", median([b.duration_ms.get("triggerExecution", 0) / 1000 for b in usable])),
        ("to its job", median([b.jobs[0][0] - b.add_start for b in usable])),  # type: ignore[operator]
        ("job", median([b.jobs[-1][1] - b.jobs[0][0] for b in usable])),
        ("sink commit", median([b.add_end - b.jobs[-1][1] for b in usable])),  # type: ignore[operator]
    ]
    loads = [
        float((b.state.get("customMetrics") or {}).get("rocksdbCommitFileSyncLatencyMs", 0))
        for b in usable
    ]
    return (
        f"steady batch (median of {len(usable)} later): "
        + ", ".join(f"{label} {value:.2f}" for label, value in parts)
        + f"; state commit upload {median(loads):.0f} ms"
    )


def _standby_at_kill(app: SparkApp, killed: float, earlier: list[dict[str, Any]]) -> str:
    """Where the promoted standby was at the kill: its JVM's start, its warm-up's batches."""
    launched = next(
        (
            float(r["first_batch_at"])
            for r in reversed(earlier)
            if r.get("kind") != "in-place" and r.get("first_batch_at")
        ),
        None,
    )
    warmups = [q for q in app.queries if (q.name or "").startswith(WARMUP_QUERY_PREFIX)]
    done = sum(1 for q in warmups for b in q.batches if b.trigger_end <= killed)
    text = "standby at the kill: "
    if launched is not None:
        text += f"started {killed - launched:.1f} s before it (at the active run's first batch), "
    if app.submitted is not None:
        text += f"its JVM launched {killed - app.submitted:.1f} s before, "
    if app.started is not None and app.started <= killed:
        text += f"SparkContext up {killed - app.started:.1f} s before; "
    else:
        text += "SparkContext not up yet; "
    if warmups and warmups[0].started <= killed:
        text += f"warm-up started {killed - warmups[0].started:.1f} s before, "
    else:
        text += "warm-up not started, "
    text += f"{min(done, WARMUP_BATCHES)} of {WARMUP_BATCHES} warm-up batches done: "
    if done < WARMUP_BATCHES:
        return text + "NOT ready (promoted while warming)"
    ends = sorted(b.trigger_end for q in warmups for b in q.batches)  # then keep-warm rounds
    ready = ends[WARMUP_BATCHES - 1]
    took = f" (warm-up {ready - warmups[0].started:.1f} s" + (
        f", {ready - launched:.1f} s after its start)" if launched is not None else ")"
    )
    return text + f"ready {killed - ready:.1f} s before the kill" + took


def render(recovery: Recovery) -> str:
    """A recovery as text: one line per step, then its notes."""
    start = "kill" if recovery.killed_at is not None else "failure seen"
    lines = [
        f"run {recovery.run} ({recovery.kind}): {start} → first committed batch "
        f"{recovery.total:.2f} s"
    ]
    lines += [f"    {label:<52} {seconds:6.2f} s" for label, seconds in recovery.steps]
    lines += [f"    {note}" for note in recovery.notes]
    if recovery.steady:
        lines.append(f"    {recovery.steady}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.bench.recovery_phases")
    parser.add_argument("job_dir", help="the job's directory (<snapshot_dir>/<name>)")
    parser.add_argument("--events", help="the drivers' Spark event log directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.job_dir):
        parser.error(f"{args.job_dir} is not a directory: give <snapshot_dir>/<job name>")
    record = load_record(args.job_dir)
    apps = read_event_logs(args.events) if args.events else []
    found = recoveries(record.runs, apps, fault_kills(args.job_dir), record.name)
    if args.json:
        print(json.dumps([r.__dict__ for r in found], indent=2))
    else:
        print("\n".join(render(r) for r in found) or "no recovery in the job's record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
