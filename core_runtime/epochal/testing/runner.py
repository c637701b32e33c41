"""Running one scenario of the kit: a job run through a sequence of failures, then counted by
record ID through the sink's independent reader (:func:`run_case`).

Jobs run at one of two triggers (:func:`kit_trigger`):

``available-now``    every record is there before the job starts; the source's read limit
                     (``maxRecordsPerBatch``) cuts them into batches and the job finishes
                     when it has read them all (``COMPLETED``). Needs read limits and the
                     available-now trigger for Python sources: pyspark 4.2+.
``processing-time``  where those are missing (pyspark 4.0 and 4.1), as the runtime tells a
                     user to run there: a trigger every :data:`PROCESSING_TIME_INTERVAL`
                     seconds, records arriving a batch's worth at a time, each chunk once
                     the sink shows everything before it (so each batch holds about one
                     chunk and the sequence of faults fires one batch after another), more
                     chunks until every fault fired, then a graceful stop (``jobs
                     suspend``): the job ends ``SUSPENDED``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from epochal.api import Job
from epochal.base.fault_plan import FaultPlan
from epochal.base.switches import env_switch
from epochal.config import JobConfig
from epochal.control.launcher import DriverPool
from epochal.metrics import recording
from epochal.pipelines import SPEC_FILE
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.testing.contract_checks import typed
from epochal.testing.points import RESTARTER_KINDS
from epochal.testing.real_failures import KeepProducing, RealFailures, ZombieUpsert
from epochal.testing.scenarios import (
    KIT_LEASE_TTL,
    LOCAL,
    TEST_SPARK_CONF,
    Outcome,
    Scenario,
    driver_log_tail,
    scenario_temp_dir,
)
from epochal.testing.session_failures import SessionFailures
from epochal.testing.under_test import SinkUnderTest, SourceUnderTest

KIT_REGISTER_ENV = "EPOCHAL_KIT_REGISTER"
"""``0``: the plain-session application of ``session-failures`` does not call
``epochal.register`` (Spark finds the formats; the session check attaches itself from
epochal's installed wheel: :mod:`epochal.spark.attach`)."""
KIT_TRIGGER_ENV = "EPOCHAL_KIT_TRIGGER"
"""Forces the kit's trigger (``available-now`` or ``processing-time``) whatever the installed
pyspark has: a suite run on pyspark 4.2+ can take the path of the older releases."""
AVAILABLE_NOW = "available-now"
PROCESSING_TIME = "processing-time"
PROCESSING_TIME_INTERVAL = 0.5
"""Seconds between the triggers of a processing-time run."""
CHUNKED_DEADLINE = 600.0
"""Seconds a processing-time run may take to show every record it was given."""
FINISHING_KINDS = (*RESTARTER_KINDS, "zombie-upsert")
"""Scenarios that end with a run that finishes its input (available-now)."""
SETTLE_DEADLINE = 120.0
"""Seconds a processing-time run of an acknowledging source, resumed after its graceful stop,
may take to acknowledge its last batch (see :func:`_in_chunks`)."""
MORE_CHUNKS = 3
"""A processing-time run gets at most this many times its planned records while it waits
for its faults to fire (then the check says which did not)."""


def kit_trigger(source: SourceUnderTest) -> str:
    """The trigger of the kit's jobs reading ``source``: ``available-now`` for Spark's own
    sources (``source.format``: they have it on every supported release) and where the
    installed pyspark gives Python sources read limits and the available-now trigger (4.2+),
    else ``processing-time``; :data:`KIT_TRIGGER_ENV` forces one."""
    forced = os.environ.get(KIT_TRIGGER_ENV, "").strip().lower()
    if forced:
        if forced not in (AVAILABLE_NOW, PROCESSING_TIME):
            raise ValueError(
                f"{KIT_TRIGGER_ENV}={forced!r}: give {AVAILABLE_NOW} or {PROCESSING_TIME}"
            )
        return forced
    from epochal.spark.features import ADMISSION_CONTROL

    return AVAILABLE_NOW if source.format or ADMISSION_CONTROL.available else PROCESSING_TIME


def not_runnable(scenario: Scenario, source: SourceUnderTest) -> str | None:
    """Why ``scenario`` cannot run on the installed pyspark (None: it can). A supervised
    scenario runs under ``epochal run``, which needs the Python data source API (pyspark
    4.0+); the restarter scenarios end with a run that finishes its input, which needs the
    available-now trigger (for an epochal source, pyspark 4.2+)."""
    from epochal.spark.features import DATA_SOURCE_API, pyspark_version

    if scenario.kind != "session-failures" and not DATA_SOURCE_API.available:
        return (
            f"{scenario.kind} runs under epochal run, which needs pyspark 4.0+ (this is "
            f"{pyspark_version()}); the plain-session cases (session-failures) run here"
        )
    if scenario.kind in FINISHING_KINDS and kit_trigger(source) == PROCESSING_TIME:
        return (
            f"{scenario.kind} ends with a run that finishes its input (available-now), which "
            f"Python sources have from pyspark 4.2 on (this is {pyspark_version()}); the "
            "crash points, whole-driver and executor kills and the aggregate run here at a "
            "processing-time trigger"
        )
    return None


def run_case(
    scenario: Scenario,
    source: SourceUnderTest,
    sink: SinkUnderTest,
    snapshot_dir: str,
    *,
    records: int = 400,
    per_batch: int = 100,
    groups: int = 10,
    pool: DriverPool | None = None,
    replayable: bool = True,
    writer: str = "",
) -> Outcome:
    """Run one scenario and count what the sink shows, by record ID. The processes it starts
    keep their temporary files in :func:`scenario_temp_dir` (see :func:`with_temp_dir`).
    ``writer``: for a scenario through the sink's ``foreachBatch`` writer, the factory to
    build it with (``module:attribute``, the signature of :func:`epochal.foreach_batch`)
    instead of epochal's: a broken writer the kit is measured with."""
    batches = len(scenario.faults) + 3
    if scenario.kind in RESTARTER_KINDS:
        batches += 20  # room for the take-overs and the random kills (~5-10 batches)
    ids = list(range(max(records, per_batch * batches)))
    chunked = kit_trigger(source) == PROCESSING_TIME and scenario.kind not in FINISHING_KINDS
    planned = len(ids)
    if chunked:
        del ids[per_batch:]  # the rest arrives while the job runs
    source.produce(ids)
    limits = {"maxRecordsPerBatch": str(per_batch)}
    if replayable and not source.format:  # an epochal replayable source: a batch's splits in
        # two tasks (several a task)
        limits["minRecordsPerTask"] = str(max(1, per_batch // 2))
    spec = {
        "source": source.connector,
        "source_format": source.format,
        "source_options": {**source.options(), **limits},
        "sink": sink.connector,
        "sink_options": sink.options(scenario.mode),
        "id_expr": source.id_expr,
        "groups": groups,
        "route_by_key": source.route_by_key,
        "sink_path": scenario.sink_path,
        "writer": writer,
        "register": env_switch(KIT_REGISTER_ENV, True),
    }
    typed_types = _typed(scenario, sink)
    if typed_types:
        spec["transform"] = {
            "function": f"{typed.__name__}:{typed.with_typed_columns.__name__}",
            "args": [[t.name for t in typed_types]],
        }
    read = _reader(sink, scenario.mode, typed_types)
    config = JobConfig(
        guarantee=scenario.guarantee,
        available_now=not chunked,
        snapshot_interval=PROCESSING_TIME_INTERVAL,
        master=scenario.master,
        snapshot_dir=snapshot_dir,
        faults=scenario.plan,
        restart_backoff=0.2,
        max_restart_backoff=0.4,  # the faults are planned: no server to wait for
        max_restarts=len(scenario.faults) + 5,
        spark_conf=dict(TEST_SPARK_CONF),
        lease_ttl=KIT_LEASE_TTL,
    )
    name = f"conformance-{uuid.uuid4().hex[:8]}"
    jobdir = JobDirectory(snapshot_dir, name)
    os.makedirs(jobdir.path, exist_ok=True)
    with open(f"{jobdir.path}/{SPEC_FILE}", "w") as fh:
        json.dump(spec, fh)
    notes: list[str] = []
    if scenario.kind == "zombie-upsert":
        record = ZombieUpsert(
            jobdir,
            scenario,
            config,
            seed=name,
            temp_dir=scenario_temp_dir(snapshot_dir),
            committed=lambda: [kv for kv, _ in read()],
        ).run(notes)
    elif scenario.kind in ("real-failures", "session-failures"):
        producer = KeepProducing(source.produce, first=len(ids))
        restarted = RealFailures if scenario.kind == "real-failures" else SessionFailures
        record = restarted(
            jobdir,
            scenario,
            config if scenario.kind == "real-failures" else spec,  # type: ignore[arg-type]
            seed=name,
            temp_dir=scenario_temp_dir(snapshot_dir),
            producer=producer,
            in_doubt=sink.in_doubt,
        ).run(notes)
        ids += producer.ids  # every produced record is counted
    else:
        lines: list[str] = []
        use_pool = pool if scenario.master == LOCAL else None
        job = Job.submit(
            name,
            f"epochal.pipelines:{scenario.pipeline}",
            config,
            report=lines.append,
            pool=use_pool,
        )
        if chunked:
            record = _in_chunks(
                job,
                scenario,
                ids,
                source.produce,
                _shown(scenario, ids, jobdir, read, groups),
                per_batch,
                MORE_CHUNKS * planned,
                settled=None if replayable else lambda: not source.unsettled(),
            )
        else:
            record = job.join(timeout=600)
        if record.status != _ending(chunked):
            record.failure = (
                f"{record.failure}\nsupervisor: {lines}\n{driver_log_tail(jobdir.logs)}"
            )
    plan = FaultPlan.parse(scenario.plan, jobdir.layout.faults)
    fired = plan.fired()
    fired_batches = {label: plan.marker_info(label).get("batch") for label in fired}
    seen_rows = read()
    committed = [kv for kv, _ in seen_rows]
    ending = _ending(chunked)
    if scenario.pipeline == "aggregate":
        outcome = _count_groups(record, ids, committed, groups, fired)
        outcome.ending = ending
        return outcome
    seen = [int(key) for key, _ in committed]
    counts = Counter(seen)
    wrong_typed = _typed_differences([row for _, row in seen_rows], typed_types)
    metric = committed_metric(jobdir)
    return Outcome(
        record=record,
        expected=len(ids),
        seen=len(seen),
        lost=sorted(set(ids) - set(counts)),
        duplicated={i: n for i, n in counts.items() if n > 1},
        fired=fired,
        notes=notes,
        fired_batches=fired_batches,
        wrong=wrong_values(committed),
        wrong_typed=wrong_typed,
        ending=ending,
        metric_committed=metric,
        source_metric_committed=committed_metric(jobdir, "source"),
    )


def committed_metric(jobdir: JobDirectory, kind: str = "sink") -> float | None:
    """The job's ``kind`` parts' (``sink`` or ``source``) ``records_committed`` counters,
    summed (None when no such part reported one): what ``jobs metrics`` shows as
    ``epochal_records_committed_total``."""
    found = _committed_counters(jobdir, kind)
    return sum(found) if found else None


def _committed_counters(jobdir: JobDirectory, kind: str) -> list[float]:
    state = recording.current_state(jobdir.path)
    return [
        float(part["totals"]["records_committed"])
        for part in state.get("parts", {}).values()
        if part.get("kind") == kind and "records_committed" in part.get("totals", {})
    ]


def _typed(scenario: Scenario, sink: SinkUnderTest) -> list[typed.KitType]:
    """The kit types the copy pipeline of ``scenario`` carries beside ``key`` and ``value``:
    every type the sink says it maps (``SinkUnderTest.types``), in the crash points'
    scenarios (``points``); none elsewhere."""
    if scenario.kind != "points" or scenario.pipeline != "copy" or not sink.types:
        return []
    return typed.kit_types(sink.types)


def _reader(
    sink: SinkUnderTest, mode: str, types: list[typed.KitType]
) -> Callable[[], list[tuple[tuple[str, str], dict[str, Any] | None]]]:
    """How the kit reads what the sink shows: each visible write as ``(key, value)`` with,
    when the pipeline carries the typed record, its typed row (``committed_typed``; the
    ``value`` is then the key again: the typed columns hold the values)."""
    if not types:
        return lambda: [(kv, None) for kv in sink.committed(mode)]
    schema = typed.typed_schema(types)

    def typed_rows() -> list[tuple[tuple[str, str], dict[str, Any] | None]]:
        rows = sink.committed_typed(mode, schema)
        return [((str(r.get("key")), str(r.get("key"))), r) for r in rows]

    return typed_rows


def _typed_differences(rows: list[dict[str, Any] | None], types: list[typed.KitType]) -> list[str]:
    """Where the typed rows read back (the first of each record ID) differ from the kit's
    typed record of that ID; loss and repetition are counted by key already."""
    first: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row is not None:
            first.setdefault(str(row.get("key")), row)
    if not types or not first:
        return []
    ids = sorted(int(key) for key in first)
    return typed.differences(typed.typed_records(ids, types), [first[str(i)] for i in ids], types)


def _ending(chunked: bool) -> JobStatus:
    """How the kit's job ends: ``COMPLETED`` (available-now), ``SUSPENDED`` (processing time,
    stopped once it caught up)."""
    return JobStatus.SUSPENDED if chunked else JobStatus.COMPLETED


def _shown(
    scenario: Scenario,
    ids: list[int],
    jobdir: JobDirectory,
    read: Callable[[], list[tuple[tuple[str, str], dict[str, Any] | None]]],
    groups: int,
) -> Callable[[], bool]:
    """Whether the sink shows every record of ``ids`` so far, asked as often as a
    processing-time run polls it: the copy pipeline by the sink's committed-records counter
    (the check at the end reads the sink itself; reading it at every poll would cost a
    broker's browse each time, and a queue redelivers a browsed message only so often), the
    aggregate pipeline by reading the sink (:func:`caught_up`)."""
    if scenario.pipeline == "copy":
        return lambda: (committed_metric(jobdir) or 0) >= len(ids)
    return lambda: caught_up(scenario, ids, [kv for kv, _ in read()], groups)


def caught_up(
    scenario: Scenario, ids: list[int], committed: list[tuple[str, str]], groups: int
) -> bool:
    """Whether the sink shows every record of ``ids`` (the aggregate pipeline: every group's
    count and sum at least theirs)."""
    if scenario.pipeline == "aggregate":
        final = dict(committed)
        for group in range(groups):
            members = [i for i in ids if i % groups == group]
            count, _, total = final.get(str(group), "0:0").partition(":")
            if int(count) < len(members) or int(total or 0) < sum(members):
                return False
        return True
    return set(ids) <= {int(key) for key, _ in committed}


def _in_chunks(
    job: Job,
    scenario: Scenario,
    ids: list[int],
    produce: Callable[[list[int]], None],
    shown: Callable[[], bool],
    per_batch: int,
    most: int,
    settled: Callable[[], bool] | None = None,
) -> JobRecord:
    """Run a processing-time job to its end (see the module doc): after the first chunk
    (produced before the start), give the source ``per_batch`` more records (appended to
    ``ids``) each time ``shown()`` says the sink holds every one so far, until every fault
    of ``scenario`` fired and the planned records arrived (``len(ids)`` at the start is one
    chunk; ``most`` records at most); then suspend it and return its record. A job that
    ends by itself (it failed) returns at once; one that does not catch up within
    :data:`CHUNKED_DEADLINE` is suspended with that said in its failure.

    ``settled`` (an acknowledging source: nothing left unacknowledged): Spark commits a
    source's last batch only when it plans the next one or the query starts again, so a job
    stopped after its last batch holds that batch's messages unacknowledged (stored in its
    snapshot). Once suspended, the job is resumed until ``settled()`` (the restarted query
    commits its last batch to the source), then suspended again."""
    plan = FaultPlan.parse(scenario.plan, job.jobdir.layout.faults)
    planned = most // MORE_CHUNKS
    deadline = time.monotonic() + CHUNKED_DEADLINE
    while True:
        while not shown():
            if not job.supervising():
                return job.join(0)
            if time.monotonic() > deadline:
                job.suspend()
                record = job.join(120)
                record.failure = (
                    f"{record.failure or ''}\nthe sink did not show the {len(ids)} records "
                    f"given within {CHUNKED_DEADLINE:.0f} s (faults fired: {plan.fired()})"
                ).strip()
                return record
            time.sleep(0.2)
        every_fault = len(plan.fired()) == len(scenario.faults)
        if (every_fault and len(ids) >= planned) or len(ids) >= most:
            break
        chunk = list(range(len(ids), len(ids) + per_batch))
        produce(chunk)
        ids += chunk
    job.suspend()
    record = job.join(120)
    if settled is None or record.status != JobStatus.SUSPENDED or settled():
        return record
    job.resume()
    deadline = time.monotonic() + SETTLE_DEADLINE
    while not settled() and job.supervising() and time.monotonic() < deadline:
        time.sleep(1.0)  # a broker's look at its queue is a browse: not too often
    if job.supervising():
        job.suspend()
    return job.join(120)


def wrong_values(committed: list[tuple[str, str]]) -> dict[int, str]:
    """The records of the copy pipeline whose value is not what the pipeline wrote (the
    record ID, as text, in ``value`` as in ``key``): a sink that writes another value, loses
    it, or turns it into something else. The record ID, and the value seen (the first of
    each ID)."""
    wrong: dict[int, str] = {}
    for key, value in committed:
        if value != key and int(key) not in wrong:
            wrong[int(key)] = value
    return wrong


def _count_groups(
    record: JobRecord,
    ids: list[int],
    committed: list[tuple[str, str]],
    groups: int,
    fired: list[str],
) -> Outcome:
    """For the aggregate pipeline: the last value of each group is ``count:sum``."""
    final: dict[str, str] = {}
    for key, value in committed:
        final[key] = value
    lost: list[int] = []
    duplicated: dict[int, int] = {}
    for group in range(groups):
        members = [i for i in ids if i % groups == group]
        count, _, total = final.get(str(group), "0:0").partition(":")
        extra = int(count) - len(members)
        if extra < 0 or int(total) < sum(members):
            lost.append(group)
        elif extra > 0 or int(total) > sum(members):
            duplicated[group] = extra
    return Outcome(record, len(ids), len(ids), lost, duplicated, fired)
