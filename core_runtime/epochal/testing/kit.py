"""The conformance kit: crash tests written once, run by every connector package.

A connector package subclasses :class:`ConformanceSuite`, says which contracts it has, and
gives two fixtures: ``epochal_source`` (a :class:`SourceUnderTest`) and/or ``epochal_sink``
(a :class:`SinkUnderTest`). The kit then runs, for each crash point of the protocol and each
guarantee, a real Spark job that is killed hard at that point, restarted by the supervisor,
and checked by record ID: exactly-once means 0 lost and 0 duplicated, at-least-once 0 lost.

Driver crash points run on ``local[2]``; executor crash points on ``local-cluster[2,1,1024]``,
where the executor JVM itself is killed.
"""

from __future__ import annotations

import json
import os
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from epochal.api import Job
from epochal.config import JobConfig
from epochal.faults import EXECUTOR_POINTS, FaultPlan
from epochal.jobs import JobRecord, JobStatus
from epochal.testing.pipelines import SPEC_ENV
from epochal_sdk import Guarantee

_FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"
TEST_SPARK_CONF = {
    # Short-lived test drivers: C1 only and the serial GC start faster and use less CPU on a
    # small machine; production jobs keep the JVM defaults.
    "spark.driver.extraJavaOptions": _FAST_JVM,
    "spark.executor.extraJavaOptions": _FAST_JVM,
    "spark.sql.shuffle.partitions": "2",
}

LOCAL = "local[2]"
CLUSTER = "local-cluster[2,1,1024]"

_REPLAYABLE_POINTS = ("source.after_plan", "source.after_read", "source.after_commit")
SOURCE_POINTS = {
    ("replayable", Guarantee.EXACTLY_ONCE): _REPLAYABLE_POINTS,
    ("replayable", Guarantee.AT_LEAST_ONCE): _REPLAYABLE_POINTS,
    ("acknowledging", Guarantee.EXACTLY_ONCE): (
        "ack_source.after_store",
        "ack_source.before_ack",
        "ack_source.after_ack",
    ),
    ("acknowledging", Guarantee.AT_LEAST_ONCE): ("ack_source.before_ack", "ack_source.after_ack"),
}
SINK_POINTS = {
    ("transactional", Guarantee.EXACTLY_ONCE): (
        "sink.after_write",
        "sink.after_prepare",
        "sink.after_decision",
        "sink.mid_commit",
        "sink.after_commit",
    ),
    ("transactional", Guarantee.AT_LEAST_ONCE): (
        "sink.after_write",
        "sink.after_prepare",
        "sink.after_commit",
    ),
    ("idempotent", Guarantee.EXACTLY_ONCE): (
        "sink.after_write",
        "sink.after_flush",
        "sink.after_commit",
    ),
    ("idempotent", Guarantee.AT_LEAST_ONCE): (
        "sink.after_write",
        "sink.after_flush",
        "sink.after_commit",
    ),
}
BATCHLESS = {
    "source.after_plan",
    "source.after_commit",
    *SOURCE_POINTS[("acknowledging", Guarantee.EXACTLY_ONCE)],
}


class SourceUnderTest(ABC):
    """A source connector as the kit drives it."""

    connector: ClassVar[str]
    id_expr: ClassVar[str]
    """A SQL expression over the source's columns that gives each record's integer ID."""

    @abstractmethod
    def options(self) -> dict[str, str]:
        """Options for ``readStream.format("epochal.<connector>")``."""

    @abstractmethod
    def produce(self, ids: Sequence[int]) -> None:
        """Put records with these IDs into the source (before the job starts)."""

    def unsettled(self) -> list[str]:
        """What the source system still holds that the job should have settled (e.g.
        unacknowledged messages); must be empty at the end."""
        return []


class SinkUnderTest(ABC):
    """A sink connector as the kit drives it. The pipeline writes ``key`` and ``value``
    string columns (both the record ID in the copy pipeline)."""

    connector: ClassVar[str]

    @abstractmethod
    def options(self, mode: str) -> dict[str, str]:
        """Options for ``writeStream.format("epochal.<connector>")`` in ``mode``."""

    @abstractmethod
    def committed(self, mode: str) -> list[tuple[str, str]]:
        """What an independent reader sees, as (key, value) pairs, one per visible write
        (a transactional sink's committed records; an idempotent sink's entries)."""

    def in_doubt(self) -> list[str]:
        """Prepared, unsettled transactions left in the system (must be none at the end)."""
        return []


@dataclass(frozen=True)
class Case:
    """One crash test: a crash point (at a batch), a guarantee, a sink mode, a master."""

    point: str
    guarantee: Guarantee
    mode: str
    pipeline: str = "copy"
    batch: int | None = 1

    @property
    def master(self) -> str:
        return CLUSTER if self.point in EXECUTOR_POINTS else LOCAL

    @property
    def fault(self) -> str:
        return self.point if self.batch is None else f"{self.point}@{self.batch}"

    @property
    def id(self) -> str:
        where = "executor" if self.point in EXECUTOR_POINTS else "driver"
        return f"{self.pipeline}-{self.mode}-{self.guarantee.label}-{where}-{self.fault}"


@dataclass
class Outcome:
    """What a case found, counted by record ID."""

    record: JobRecord
    expected: int
    seen: int
    lost: list[int] = field(default_factory=list)
    duplicated: dict[int, int] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"expected {self.expected} records, saw {self.seen}: lost {len(self.lost)} "
            f"{self.lost[:10]}, duplicated {len(self.duplicated)} {list(self.duplicated)[:10]}; "
            f"restarts {self.record.restarts}, crash points fired {self.fired}"
        )


class ConformanceSuite:
    """Subclass in a connector's tests; set the class attributes and provide the fixtures
    ``epochal_source`` and/or ``epochal_sink``. Use the map connector for the side you do not
    test (the kit's own fixtures ``epochal_map_source``/``epochal_map_sink``)."""

    source_contract: ClassVar[str] = "replayable"
    sink_modes: ClassVar[tuple[str, ...]] = ("transactional", "idempotent")
    guarantees: ClassVar[tuple[Guarantee, ...]] = (Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE)
    records: ClassVar[int] = 300
    records_per_batch: ClassVar[int] = 100
    aggregate: ClassVar[bool] = True
    """Also run the keyed running aggregation (Spark state) across a kill, per sink mode."""
    scope: ClassVar[str] = "all"
    """Which crash points to run: ``all``, ``source`` (the source's and the job's) or ``sink``
    (the sink's and the job's); a connector with only a source or a sink narrows it."""

    @classmethod
    def cases(cls) -> list[Case]:
        """Every crash point of the contracts under test, for each guarantee and mode."""
        out = []
        for guarantee in cls.guarantees:
            for mode in cls.sink_modes:
                points = []
                if cls.scope in ("all", "source"):
                    points += SOURCE_POINTS[(cls.source_contract, guarantee)]
                if cls.scope in ("all", "sink"):
                    points += SINK_POINTS[(mode, guarantee)]
                points.append("job.after_batch")
                for point in points:
                    batch = None if point in BATCHLESS else 1
                    out.append(Case(point, guarantee, mode, batch=batch))
        exactly_once = Guarantee.EXACTLY_ONCE
        if cls.aggregate and exactly_once in cls.guarantees:
            for mode in cls.sink_modes:
                decision = "sink.after_decision" if mode == "transactional" else "sink.after_flush"
                out.append(Case(decision, exactly_once, mode, pipeline="aggregate", batch=2))
        return out

    def test_crash_and_recover(
        self,
        conformance_case: Case,
        epochal_source: SourceUnderTest,
        epochal_sink: SinkUnderTest,
        tmp_path: Any,
    ) -> None:
        """Kill at the crash point, restart, count lost and duplicated records by ID."""
        outcome = run_case(
            conformance_case,
            epochal_source,
            epochal_sink,
            str(tmp_path / "snapshots"),
            records=self.records,
            per_batch=self.records_per_batch,
        )
        assert outcome.record.status == JobStatus.COMPLETED, outcome.record.failure
        assert outcome.fired == [conformance_case.fault], f"crash point did not fire: {outcome}"
        assert not outcome.lost, f"lost records: {outcome}"
        if conformance_case.guarantee == Guarantee.EXACTLY_ONCE:
            assert not outcome.duplicated, f"duplicates under exactly-once: {outcome}"
        leftovers = epochal_sink.in_doubt()
        assert not leftovers, f"in-doubt transactions left behind: {leftovers}"
        unsettled = epochal_source.unsettled()
        assert not unsettled, f"the source was left unsettled: {unsettled}"


def run_case(
    case: Case,
    source: SourceUnderTest,
    sink: SinkUnderTest,
    snapshot_dir: str,
    *,
    records: int = 400,
    per_batch: int = 100,
    groups: int = 10,
) -> Outcome:
    """Run one crash test and count what the sink shows, by record ID."""
    ids = list(range(records))
    source.produce(ids)
    source_options = {**source.options(), "maxRecordsPerBatch": str(per_batch)}
    spec = {
        "source": source.connector,
        "source_options": source_options,
        "sink": sink.connector,
        "sink_options": sink.options(case.mode),
        "id_expr": source.id_expr,
        "groups": groups,
    }
    os.environ[SPEC_ENV] = json.dumps(spec)
    config = JobConfig(
        guarantee=case.guarantee,
        available_now=True,
        master=case.master,
        snapshot_dir=snapshot_dir,
        faults=case.fault,
        restart_backoff=0.2,
        max_restarts=5,
        spark_conf=dict(TEST_SPARK_CONF),
    )
    name = f"conformance-{uuid.uuid4().hex[:8]}"
    lines: list[str] = []
    job = Job.submit(
        name, f"epochal.testing.pipelines:{case.pipeline}", config, report=lines.append
    )
    record = job.join(timeout=540)
    fired = FaultPlan.parse(case.fault, f"{job.jobdir.path}/faults").fired()
    if record.status != JobStatus.COMPLETED:
        logs = _driver_log_tail(job.jobdir.logs)
        record.failure = f"{record.failure}\nsupervisor: {lines}\n{logs}"
    committed = sink.committed(case.mode)
    if case.pipeline == "aggregate":
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
    )


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


def _driver_log_tail(log_dir: str, lines: int = 40) -> str:
    if not os.path.isdir(log_dir):
        return ""
    out = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name), errors="replace") as fh:
            tail = fh.read().splitlines()[-lines:]
        out.append(f"--- {name}\n" + "\n".join(tail))
    return "\n".join(out)
