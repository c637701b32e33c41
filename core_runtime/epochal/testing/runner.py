"""Running one scenario of the kit: a job run through a sequence of failures, then counted by
record ID through the sink's independent reader (:func:`run_case`)."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter

from epochal.api import Job
from epochal.base.fault_plan import FaultPlan
from epochal.config import JobConfig
from epochal.control.launcher import DriverPool
from epochal.pipelines import SPEC_FILE
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.testing.points import RESTARTER_KINDS
from epochal.testing.real_failures import KeepProducing, RealFailures
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
) -> Outcome:
    """Run one scenario and count what the sink shows, by record ID. The processes it starts
    keep their temporary files in :func:`scenario_temp_dir` (see :func:`with_temp_dir`)."""
    batches = len(scenario.faults) + 3
    if scenario.kind in RESTARTER_KINDS:
        batches += 20  # room for the take-overs and the random kills (~5-10 batches)
    ids = list(range(max(records, per_batch * batches)))
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
    }
    config = JobConfig(
        guarantee=scenario.guarantee,
        available_now=True,
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
    if scenario.kind in ("real-failures", "session-failures"):
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
        record = job.join(timeout=600)
        if record.status != JobStatus.COMPLETED:
            record.failure = (
                f"{record.failure}\nsupervisor: {lines}\n{driver_log_tail(jobdir.logs)}"
            )
    plan = FaultPlan.parse(scenario.plan, jobdir.layout.faults)
    fired = plan.fired()
    fired_batches = {label: plan.marker_info(label).get("batch") for label in fired}
    committed = sink.committed(scenario.mode)
    if scenario.pipeline == "aggregate":
        return _count_groups(record, ids, committed, groups, fired)
    seen = [int(key) for key, _ in committed]
    counts = Counter(seen)
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
    )


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
