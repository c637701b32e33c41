"""``epochal demo``: an exactly-once pipeline on the embedded default, killed hard twice.

A journal of events (the map connector, SQLite) is filled while the job runs; the job keeps a
running count and sum per user in Spark state and writes them to the map sink with two-phase
commit, snapshotting about once a second. The job's driver is killed (SIGKILL) at two
different protocol steps; the supervisor restarts it from the last snapshot each time. At the
end the demo compares every user's total with what it produced and prints what it found.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epochal.api import Job
from epochal.base.fault_plan import FaultPlan
from epochal.config import JobConfig
from epochal.ops.recovery import recoveries
from epochal.startup.classdata import SHORT_LIVED_JVM_OPTIONS
from epochal.state.jobs import JobStatus
from epochal_sdk import EpochalError, Guarantee

MAP_ENV = "EPOCHAL_DEMO_MAP"
MAP_DISTRIBUTION = "epochal-map"
"""The demo's journal and its totals are the map connector's: installed with
``pip install 'epochal[demo]'`` (or ``epochal-map`` itself)."""
USERS = 25
DEFAULT_EVENTS = 4000
"""Events the demo writes by default: its producer goes on anyway until both crash points
fired (batches 8 and 12, about 3 000 events), so more would only lengthen the run."""
DEFAULT_FAULTS = "sink.after_decision@8,sink.mid_commit@12:worker"
"""The whole driver killed after a commit decision (the warm standby takes over), then the
commit worker killed in the middle of phase 2 (the driver restarts the query in place)."""


def pipeline(spark: Any) -> Any:
    """events (journal) → running totals per user (Spark state) → totals (map, 2PC)."""
    from epochal.pipelines import running_totals

    path = os.environ[MAP_ENV]
    events = (
        spark.readStream.format("epochal.map")
        .option("path", path)
        .option("map", "events")
        .option("maxRecordsPerBatch", "500")
        .load()
        .selectExpr("value AS user", "CAST(key AS BIGINT) AS id")
    )
    totals = running_totals(events, "user")
    return (
        totals.writeStream.format("epochal.map")
        .option("path", path)
        .option("map", "totals")
        .option("mode", "transactional")
        .outputMode("append")
    )


@dataclass
class Tally:
    """What the demo checks."""

    events: int
    counted: int
    lost: int
    duplicates: int


def map_store() -> Any:
    """The map connector's ``MapStore`` class, which the demo writes its events to and reads
    its totals from. Raises ``EpochalError`` naming what to install when the map connector
    (:data:`MAP_DISTRIBUTION`) is not installed."""
    try:
        from epochal_map import MapStore
    except ImportError as exc:
        raise EpochalError(
            f"`epochal demo` runs on the map connector, which is not installed here ({exc}). "
            f"Install it: pip install 'epochal[demo]' (or {MAP_DISTRIBUTION})"
        ) from None
    return MapStore


def _produce(
    path: str,
    total: int,
    chunk: int,
    pause: float,
    stop: threading.Event,
    pending: Callable[[], bool],
    produced: list[int],
) -> None:
    """Append ``total`` events after the first 200, ``chunk`` every ``pause`` seconds, and go
    on while ``pending()`` (a crash point has not fired yet: a Spark whose Python sources have
    no read limit reads more per batch, so the same events make fewer batches);
    ``produced[0]`` is the number of events in the journal."""
    with map_store()(path) as store:
        start = 200
        while not stop.is_set() and (start < 200 + total or pending()):
            end = start + chunk if start >= 200 + total else min(200 + total, start + chunk)
            store.append_events(
                "events", [(str(i), f"user-{i % USERS:02d}") for i in range(start, end)]
            )
            produced[0] = start = end
            time.sleep(pause)


def _tally(path: str, total: int) -> Tally:
    with map_store()(path) as store:
        found = store.entries("totals")
    lost = duplicates = counted = 0
    if sum(int(v.partition(":")[0]) for v in found.values()) < total:
        # not everything processed yet: only a finished run can say what was lost
        counted = sum(int(v.partition(":")[0]) for v in found.values())
        return Tally(total, counted, -1, -1)
    for user in range(USERS):
        ids = [i for i in range(total) if i % USERS == user]
        count, _, id_sum = found.get(f"user-{user:02d}", "0:0").partition(":")
        count_i, sum_i = int(count), int(id_sum)
        counted += count_i
        if count_i < len(ids) or sum_i < sum(ids):
            lost += max(len(ids) - count_i, 1)
        elif count_i > len(ids) or sum_i > sum(ids):
            duplicates += max(count_i - len(ids), 1)
    return Tally(total, counted, lost, duplicates)


def run(
    events: int = DEFAULT_EVENTS,
    faults: str = DEFAULT_FAULTS,
    directory: str | None = None,
    keep: bool = False,
    deadline: float = 170.0,
) -> int:
    """Run the demo; print progress and the summary; 0 when nothing was lost or duplicated."""
    began = time.monotonic()
    work = directory or tempfile.mkdtemp(prefix="epochal-demo-")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "demo.sqlite")
    os.environ[MAP_ENV] = path
    say = _printer(began)
    say(f"working in {work}")
    say(
        f"pipeline: journal 'events' → running totals per user (Spark state) → map 'totals' "
        f"(two-phase commit), exactly-once, snapshot every 1s, a warm standby driver; "
        f"crash points: {faults}"
    )
    stop = threading.Event()
    produced = [200]
    with map_store()(path) as store:  # the journal exists, with a first few events, at start
        store.append_events("events", [(str(i), f"user-{i % USERS:02d}") for i in range(200)])
    config = JobConfig(
        guarantee=Guarantee.EXACTLY_ONCE,
        snapshot_interval=1.0,
        snapshot_dir=os.path.join(work, "snapshots"),
        faults=faults,
        restart_backoff=0.5,
        standby=True,
        # a demo's drivers live for a minute: the short-lived JVM settings save a third of
        # their CPU (a production job keeps the JVM's defaults)
        spark_conf={"spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS},
    )
    seen = {"rows": 0, "run": 1}

    def progress(line: dict[str, Any]) -> None:
        seen["rows"] += int(line["rows"])
        note = ""
        if int(line["run"]) != seen["run"]:  # the first batch since a restart
            seen["run"] = int(line["run"])
            note = (
                "; restarted from the last snapshot: a batch the crash interrupted is read "
                "again, its commit decision is not made twice"
            )
        say(
            f"run {line['run']} batch {line['batch']:>3}: {line['rows']:>5} events "
            f"({seen['rows']} read so far{note})"
        )

    job = Job.submit(
        "demo", "epochal.ops.demo:pipeline", config, replace=True, report=say, on_progress=progress
    )
    while job.status().status.value in ("SUBMITTED", "STARTING"):
        time.sleep(0.2)  # produce while the job runs, not before it started
    _wait_for_the_standby(job, say, STANDBY_WAIT_SECONDS)
    plan = FaultPlan.parse(faults, job.jobdir.layout.faults)

    def pending() -> bool:
        return len(plan.fired()) < len(plan.faults)

    producer = threading.Thread(
        target=_produce,
        args=(path, events - 200, 100, 0.4, stop, pending, produced),
        daemon=True,
    )
    say(f"producing {events - 200} more events, 100 every 0.4s")
    producer.start()
    producing = time.monotonic()
    tally = _tally(path, produced[0])
    durations: dict[int, int] = {}
    while time.monotonic() - producing < deadline:
        record = job.status()
        if record.status.finished:
            break
        if record.progress.get("batch") is not None and record.progress.get("last_rows"):
            durations[int(record.progress["batch"])] = int(record.progress["duration_ms"])
        tally = _tally(path, produced[0])
        if not producer.is_alive() and tally.lost >= 0:
            break
        time.sleep(0.5)
    stop.set()
    job.suspend()
    record = job.join(timeout=120)
    tally = _tally(path, produced[0])
    fired = plan.fired()
    print("", flush=True)
    print("== epochal demo summary ==")
    print(f"job: {record.name} ({record.status.value.lower()}), runs: {record.run}")
    print(f"crash points fired: {', '.join(fired) or 'none'}")
    print(f"events: {tally.events}")
    print(f"counted: {tally.counted}")
    print(f"restarts: {record.restarts}")
    if durations:
        print(f"batch time: median {statistics.median(durations.values()) / 1000:.2f}s")
    kills = [float(plan.marker_info(label)["at"]) for label in fired]
    print("recoveries (kill → first committed batch, by phase, seconds):")
    for recovery in recoveries(record.runs, kills):
        print(f"  {recovery.describe()}")
    if tally.lost < 0:
        print(
            f"incomplete: only {tally.counted} of {tally.events} events were processed before "
            f"the {deadline:.0f}s deadline after the producer started (a slow or busy machine?); "
            "lost and duplicates "
            "cannot be judged on an unfinished run"
        )
    else:
        print(f"lost: {tally.lost}")
        print(f"duplicates: {tally.duplicates}")
    print(f"time: {time.monotonic() - began:.0f}s")
    ok = (
        tally.lost == 0
        and tally.duplicates == 0
        and record.status == JobStatus.SUSPENDED
        and len(fired) == len(plan.faults)
    )
    if record.status == JobStatus.FAILED:
        print(f"job failed: {record.failure}")
    print("result: " + ("exactly-once held" if ok else "FAILED"), flush=True)
    if not keep and directory is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


STANDBY_WAIT_SECONDS = 120.0
"""How long the demo waits for its standby's warm-up before it starts producing (and so
before its first crash point can fire)."""


def _wait_for_the_standby(job: Job, say: Any, seconds: float) -> None:
    """Wait (with a deadline) until the warm standby has finished its warm-up: it is launched
    once the job's first batch is committed and needs 20-45 s on two cores (its JVM, its
    session, a warm-up query through every Python worker a batch uses). Killed before that,
    a job recovers through a standby still warming up, barely faster than a new driver; the
    recovery benchmark measures that case (``--workloads demo``)."""
    started = time.monotonic()
    say("waiting for the warm standby driver to finish its warm-up")
    while time.monotonic() - started < seconds:
        supervisor = job.status().supervisor
        if supervisor.get("standby_ready"):
            say(
                f"standby ready: pid {supervisor.get('standby_pid')}, warm-up "
                f"{supervisor.get('standby_warmup_s')}s, "
                f"{time.time() - float(supervisor.get('standby_launched') or time.time()):.0f}s "
                "after its launch"
            )
            return
        time.sleep(0.5)
    say(f"the standby is not ready after {seconds:.0f}s (a busy machine?); going on without it")


def _printer(began: float) -> Any:
    def say(message: str) -> None:
        print(f"[{time.monotonic() - began:6.1f}s] {message}", flush=True)
        sys.stdout.flush()

    return say
