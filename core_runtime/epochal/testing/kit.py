"""The conformance kit: crash tests written once, run by every connector package.

A connector package subclasses :class:`ConformanceSuite`, says which contracts it has, and
gives two fixtures: ``epochal_source`` (a :class:`SourceUnderTest`) and/or ``epochal_sink``
(a :class:`SinkUnderTest`). The kit then runs real Spark jobs that are killed hard (SIGKILL,
SIGSTOP) at every step of the protocols, restarted, and checked by record ID through an
independent reader: exactly-once means 0 lost, 0 duplicated, nothing left prepared or
unacknowledged; at-least-once means 0 lost.

Each test is a :class:`Scenario`: one job run that goes through a *sequence* of failures, one
after another (see :mod:`epochal.faults`), so a handful of job runs cover every crash point:

``points``          every crash point of the contracts under test, for each guarantee and
                    sink mode: the process that performs the step is killed there (a
                    driver-side Python worker: the query restarts in place; an executor's
                    worker: the task is retried), and, exactly-once, the whole driver at the
                    end of a batch.
``driver-kills``    every driver-side crash point with the *whole driver* killed (its JVM,
                    PySpark daemons and workers); the supervisor restarts it.
``executor-kills``  every executor crash point with the executor JVM killed
                    (``local-cluster``): tasks are rescheduled on the other executor.
``aggregate``       a keyed running aggregation (Spark state) killed in place and whole
                    (the first sink mode).
``real-failures``   what deployments see: the supervisor killed and the job resumed from
                    another process; the driver and its supervisor paused (SIGSTOP) past the
                    lease, another supervisor taking over and committing, then the zombie
                    resumed (SIGCONT): it must decide, acknowledge and write nothing; then
                    a kill of the whole driver and one of a Python worker, in random order
                    at random moments.
``session-failures`` the same failures where no supervisor runs: the query in a user's
                    plain SparkSession, its driver started again by an outside restarter
                    (as YARN or a restart policy does); the driver holds the job's lease
                    itself (:mod:`epochal.session_lease`).

Scenarios run on ``local[2,4]`` (failed tasks are retried); executor JVM kills on
``local-cluster[2,1,1024]``. At the end
of the session the plugin prints a coverage table (connector, point, guarantee, mode, kill →
passed), so a crash point cannot drop out unseen.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from epochal import processes
from epochal.api import Job
from epochal.config import JobConfig
from epochal.drivers import DriverPool
from epochal.faults import DRIVER_POINTS, EXECUTOR_POINTS, Fault, FaultPlan
from epochal.jobs import JobDirectory, JobRecord, JobStatus
from epochal.supervisor import submit
from epochal.testing.pipelines import SPEC_ENV, SPEC_FILE
from epochal_sdk import Guarantee

_FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"
TEST_SPARK_CONF = {
    # Short-lived test drivers: C1 only and the serial GC start faster and use less CPU on a
    # small machine; production jobs keep the JVM defaults.
    "spark.driver.extraJavaOptions": _FAST_JVM,
    "spark.executor.extraJavaOptions": _FAST_JVM,
    "spark.sql.shuffle.partitions": "2",
}

LOCAL = "local[2,4]"
"""Two cores, and a failed task is retried up to 4 times (as on a cluster): a task whose
Python worker is killed runs again as a new attempt, with a new transaction id."""
CLUSTER = "local-cluster[2,1,1024]"
KIT_LEASE_TTL = 8.0
"""The lease time-to-live of the kit's jobs: short, so a zombie scenario waits little; long
enough that a loaded 2-core machine renews it in time."""

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
        "sink.before_decision",
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
JOB_POINT = "job.after_batch"


# -- what a connector gives the kit ---------------------------------------------------------
class SourceUnderTest(ABC):
    """A source connector as the kit drives it.

    Class attributes:
        connector: the connector's name (``format("epochal.<connector>")``).
        id_expr: a SQL expression over the source's columns that gives each record's
            integer ID, e.g. ``"CAST(key AS BIGINT)"``; the kit counts lost and duplicated
            records by it.
    """

    connector: ClassVar[str]
    id_expr: ClassVar[str]

    @abstractmethod
    def options(self) -> dict[str, str]:
        """Options for ``readStream.format("epochal.<connector>")``."""

    @abstractmethod
    def produce(self, ids: Sequence[int]) -> None:
        """Put records with these IDs into the source (before the job starts). Each record
        must carry its ID so that ``id_expr`` finds it; any other columns are up to you."""

    def unsettled(self) -> list[str]:
        """What the source system still holds that the job should have settled (e.g.
        unacknowledged messages); must be empty at the end."""
        return []


class SinkUnderTest(ABC):
    """A sink connector as the kit drives it. The pipeline writes ``key`` and ``value``
    string columns (both the record ID in the copy pipeline).

    Class attributes:
        connector: the connector's name (``writeStream.format("epochal.<connector>")``).
    """

    connector: ClassVar[str]

    @abstractmethod
    def options(self, mode: str) -> dict[str, str]:
        """Options for ``writeStream.format("epochal.<connector>")`` in ``mode``
        (``transactional`` or ``idempotent``)."""

    @abstractmethod
    def committed(self, mode: str) -> list[tuple[str, str]]:
        """What an independent reader sees, as (key, value) pairs, one per visible write
        (a transactional sink's committed records; an idempotent sink's entries)."""

    def in_doubt(self) -> list[str]:
        """Prepared, unsettled transactions left in the system (must be none at the end)."""
        return []


# -- scenarios ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """One crash test: a job run through a sequence of failures.

    Attributes:
        kind: ``points``, ``driver-kills``, ``executor-kills``, ``aggregate`` or
            ``real-failures`` (see the module doc).
        guarantee: the job's guarantee.
        mode: the sink mode (``transactional`` or ``idempotent``).
        faults: the failures, in the order they must happen.
        master: the Spark master (``local[2]`` or ``local-cluster[...]``).
        pipeline: ``copy`` (record ID → key and value) or ``aggregate`` (running count and
            sum per group, in Spark state).
    """

    kind: str
    guarantee: Guarantee
    mode: str
    faults: tuple[Fault, ...]
    master: str = LOCAL
    pipeline: str = "copy"

    @property
    def plan(self) -> str:
        """The fault plan (a sequence when there is more than one fault)."""
        return " > ".join(f.label for f in self.faults)

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.mode}-{self.guarantee.label}"

    @property
    def fault(self) -> str:
        """The plan (the name of earlier versions' single crash point)."""
        return self.plan


@dataclass(frozen=True)
class Case:
    """One crash point at one batch (earlier versions' test case; still accepted by
    :func:`run_case`). Deprecated: use :class:`Scenario`."""

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

    def scenario(self) -> Scenario:
        return Scenario(
            "case",
            self.guarantee,
            self.mode,
            (Fault(self.point, self.batch),),
            self.master,
            self.pipeline,
        )


@dataclass
class Outcome:
    """What a scenario found, counted by record ID."""

    record: JobRecord
    expected: int
    seen: int
    lost: list[int] = field(default_factory=list)
    duplicated: dict[int, int] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"expected {self.expected} records, saw {self.seen}: lost {len(self.lost)} "
            f"{self.lost[:10]}, duplicated {len(self.duplicated)} {list(self.duplicated)[:10]}; "
            f"restarts {self.record.restarts}, faults fired {self.fired}"
            + (f"; {'; '.join(self.notes)}" if self.notes else "")
        )

    def summary(self) -> str:
        """One line for ``-v`` output: points fired, restarts, lost, duplicated."""
        kinds = Counter(str(r.get("kind")) for r in self.record.runs)
        return (
            f"fired {len(self.fired)} fault(s); runs {self.record.run} "
            f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); restarts "
            f"{self.record.restarts}; lost {len(self.lost)}; duplicated {len(self.duplicated)}"
            + "".join(f"\n      {note}" for note in self.notes)
        )


# -- coverage -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoverageRow:
    """One crash point of one connector at one guarantee and sink mode, killed one way."""

    connector: str
    point: str
    guarantee: str
    mode: str
    kill: str


EXPECTED: dict[CoverageRow, str] = {}
"""Every row the collected scenarios should cover, with its state: ``not run``, ``passed``
or ``FAILED`` (filled in by the kit; printed by the plugin at the end of the session)."""


def coverage_rows(suite: type[ConformanceSuite], scenario: Scenario) -> list[CoverageRow]:
    """The rows a scenario of ``suite`` covers."""
    rows = []
    for fault in scenario.faults:
        if scenario.kind == "real-failures":
            kill = fault.kind if fault.kind in ("supervisor", "pause") else "random"
        elif scenario.kind == "session-failures":
            kill = f"session {fault.kind}"
        else:
            kill = fault.kind
        rows.append(
            CoverageRow(
                suite.connector_label(fault.point),
                fault.point if scenario.pipeline == "copy" else f"{fault.point} (aggregate)",
                scenario.guarantee.label,
                scenario.mode,
                kill,
            )
        )
    if scenario.kind in RESTARTER_KINDS:
        session = scenario.kind == "session-failures"
        rows.append(
            CoverageRow(
                suite.connector_label(JOB_POINT),
                "random kills (driver, Python worker)",
                scenario.guarantee.label,
                scenario.mode,
                "session random" if session else "random",
            )
        )
    return rows


RESTARTER_KINDS = ("real-failures", "session-failures")
"""Scenarios whose failures come from outside (a restarter), with random kills."""


# -- the suite ------------------------------------------------------------------------------
class ConformanceSuite:
    """Subclass in a connector's tests; set the class attributes and provide the fixtures
    ``epochal_source`` and/or ``epochal_sink``. Use the map connector for the side you do not
    test (the kit's own fixtures ``epochal_map_source``/``epochal_map_sink``).

    Class attributes (all optional):
        scope: which side is under test: ``source``, ``sink`` or ``all`` (both; the map
            connector's own suite).
        source_contract: ``replayable`` or ``acknowledging`` (the source's contract).
        sink_modes: the sink modes to test (``transactional``, ``idempotent``). When only
            the source is under test, the first mode is used for the other side.
        guarantees: the guarantees to test.
        records: records per scenario at least (more when a scenario has many faults).
        records_per_batch: the source's read limit (``maxRecordsPerBatch``).
        aggregate: also run the keyed running aggregation (Spark state) across kills.
        whole_driver_kills: also kill the whole driver at every driver-side point, exactly-once
            (the runtime's own suites do; a connector's steps run in the same worker either
            way, and every suite kills the whole driver after a batch and at random times).
        executor_kills: also kill executor JVMs at every executor point (``local-cluster``);
            every suite kills the executors' Python workers there (tasks are retried).
        real_failures: also run the real-failures scenarios, exactly-once: supervised
            (supervisor killed, zombie driver, random kills) and in a plain session under an
            outside restarter (driver killed, zombie driver, random kills).
    """

    source_contract: ClassVar[str] = "replayable"
    sink_modes: ClassVar[tuple[str, ...]] = ("transactional", "idempotent")
    guarantees: ClassVar[tuple[Guarantee, ...]] = (Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE)
    records: ClassVar[int] = 300
    records_per_batch: ClassVar[int] = 100
    aggregate: ClassVar[bool] = True
    scope: ClassVar[str] = "all"
    whole_driver_kills: ClassVar[bool] = False
    executor_kills: ClassVar[bool] = False
    real_failures: ClassVar[bool] = True
    source_connector: ClassVar[str] = ""
    sink_connector: ClassVar[str] = ""
    """Names for the coverage table (default: from the fixtures when the test runs; set
    them so that the table is complete even for scenarios that did not run)."""

    @classmethod
    def modes(cls) -> tuple[str, ...]:
        """The sink modes that matter: all of them when the sink is under test, else the
        first (the other side's mode does not change the source's protocol)."""
        return cls.sink_modes if cls.scope in ("all", "sink") else cls.sink_modes[:1]

    @classmethod
    def points(cls, guarantee: Guarantee, mode: str) -> list[str]:
        """The crash points of the contracts under test (source first, then sink)."""
        out: list[str] = []
        if cls.scope in ("all", "source"):
            out += SOURCE_POINTS[(cls.source_contract, guarantee)]
        if cls.scope in ("all", "sink"):
            out += SINK_POINTS[(mode, guarantee)]
        return out

    @classmethod
    def connector_label(cls, point: str) -> str:
        """The connector a crash point belongs to, for the coverage table."""
        source = cls.source_connector or "source"
        sink = cls.sink_connector or "sink"
        if point.startswith(("source.", "ack_source.")):
            return source
        if point.startswith("sink."):
            return sink
        return f"{source}→{sink}"

    @classmethod
    def cases(cls) -> list[Scenario]:
        """The scenarios of this suite (see the module doc)."""
        out: list[Scenario] = []
        exactly_once = Guarantee.EXACTLY_ONCE
        for guarantee in cls.guarantees:
            for mode in cls.modes():
                faults = [_in_place(p) for p in cls.points(guarantee, mode)]
                if guarantee == exactly_once:  # and the whole driver once, after a batch
                    faults.append(Fault(JOB_POINT))
                out.append(Scenario("points", guarantee, mode, tuple(faults)))
        first = cls.modes()[0]
        if exactly_once not in cls.guarantees:
            return out
        if cls.whole_driver_kills:  # the strongest guarantee: every recovery path runs there
            for mode in cls.modes():
                driver = [Fault(p) for p in cls.points(exactly_once, mode) if p in DRIVER_POINTS]
                out.append(Scenario("driver-kills", exactly_once, mode, tuple(driver)))
        if cls.executor_kills:
            executor = [Fault(p) for p in cls.points(exactly_once, first) if p in EXECUTOR_POINTS]
            if executor:
                out.append(
                    Scenario("executor-kills", exactly_once, first, tuple(executor), CLUSTER)
                )
        if cls.aggregate:
            for mode in cls.modes()[:1]:
                step = "sink.after_decision" if mode == "transactional" else "sink.after_flush"
                faults = (Fault(step, action="worker"), Fault(JOB_POINT))
                out.append(Scenario("aggregate", exactly_once, mode, faults, pipeline="aggregate"))
        if cls.real_failures:
            out.append(
                Scenario(
                    "real-failures",
                    exactly_once,
                    first,
                    (
                        Fault(JOB_POINT, action="supervisor"),
                        Fault(cls.pause_point(), action="pause"),
                    ),
                )
            )
            out.append(
                Scenario(
                    "session-failures",
                    exactly_once,
                    first,
                    (
                        Fault("sink.after_commit", action="driver"),
                        Fault(cls.pause_point(), action="pause"),
                    ),
                )
            )
        return out

    @classmethod
    def pause_point(cls) -> str:
        """Where the zombie of the real-failures scenario is paused: the most dangerous step
        of the contracts under test (before a commit decision, before an acknowledgement)."""
        if cls.scope in ("all", "sink") and cls.modes()[0] == "transactional":
            return "sink.before_decision"
        if cls.scope in ("all", "source") and cls.source_contract == "acknowledging":
            return "ack_source.before_ack"
        if cls.scope in ("all", "source"):
            return "source.after_plan"
        return "sink.after_commit"

    def test_crash_and_recover(
        self,
        conformance_case: Scenario,
        epochal_source: SourceUnderTest,
        epochal_sink: SinkUnderTest,
        epochal_driver_pool: DriverPool | None,
        tmp_path: Any,
        request: Any,
    ) -> None:
        """Run the scenario; count lost and duplicated records by ID; check that nothing is
        left prepared or unsettled and that every fault fired."""
        scenario = conformance_case
        rows = coverage_rows(type(self), scenario)
        for row in rows:
            EXPECTED[row] = "FAILED"
        outcome = run_case(
            scenario,
            epochal_source,
            epochal_sink,
            str(tmp_path / "snapshots"),
            records=self.records,
            per_batch=self.records_per_batch,
            pool=epochal_driver_pool,
        )
        request.node.user_properties.append(("epochal", outcome.summary()))
        assert outcome.record.status == JobStatus.COMPLETED, outcome.record.failure
        assert outcome.fired == [f.label for f in scenario.faults], (
            f"not every fault fired: {outcome}"
        )
        assert not outcome.lost, f"lost records: {outcome}"
        if scenario.guarantee == Guarantee.EXACTLY_ONCE:
            assert not outcome.duplicated, f"duplicates under exactly-once: {outcome}"
        leftovers = epochal_sink.in_doubt()
        assert not leftovers, f"in-doubt transactions left behind: {leftovers}"
        unsettled = epochal_source.unsettled()
        assert not unsettled, f"the source was left unsettled: {unsettled}"
        for row in rows:
            EXPECTED[row] = "passed"


def _in_place(point: str) -> Fault:
    """The point's fault with only the process performing the step killed."""
    return Fault(point, action="worker")


# -- running a scenario ---------------------------------------------------------------------
def run_case(
    case: Scenario | Case,
    source: SourceUnderTest,
    sink: SinkUnderTest,
    snapshot_dir: str,
    *,
    records: int = 400,
    per_batch: int = 100,
    groups: int = 10,
    pool: DriverPool | None = None,
) -> Outcome:
    """Run one scenario and count what the sink shows, by record ID."""
    scenario = case.scenario() if isinstance(case, Case) else case
    batches = len(scenario.faults) + 3
    if scenario.kind in RESTARTER_KINDS:
        batches += 20  # room for the take-overs and the random kills (~5-10 batches)
    ids = list(range(max(records, per_batch * batches)))
    source.produce(ids)
    spec = {
        "source": source.connector,
        "source_options": {**source.options(), "maxRecordsPerBatch": str(per_batch)},
        "sink": sink.connector,
        "sink_options": sink.options(scenario.mode),
        "id_expr": source.id_expr,
        "groups": groups,
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
    os.environ[SPEC_ENV] = json.dumps(spec)  # for pipelines of earlier kit versions
    notes: list[str] = []
    if scenario.kind == "real-failures":
        record = RealFailures(jobdir, scenario, config, seed=name).run(notes)
    elif scenario.kind == "session-failures":
        from epochal.testing.session_failures import SessionFailures

        record = SessionFailures(jobdir, scenario, spec, seed=name).run(notes)
    else:
        lines: list[str] = []
        use_pool = pool if scenario.master == LOCAL else None
        job = Job.submit(
            name,
            f"epochal.testing.pipelines:{scenario.pipeline}",
            config,
            report=lines.append,
            pool=use_pool,
        )
        record = job.join(timeout=600)
        if record.status != JobStatus.COMPLETED:
            record.failure = (
                f"{record.failure}\nsupervisor: {lines}\n{_driver_log_tail(jobdir.logs)}"
            )
    fired = FaultPlan.parse(scenario.plan, f"{jobdir.path}/faults").fired()
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
    )


class RealFailures:
    """The real-failures scenario: supervisors run as their own processes, as an operator
    runs them (``python -m epochal jobs resume``), and are killed and paused from outside.

    1. Supervisor A runs the job until the first fault kills A (SIGKILL) after a batch: its
       driver must die with it (all of the run's processes gone within the lease TTL).
    2. Supervisor B resumes the job from another process at once (A is known dead).
       (A supervisor that must wait for a lease starts its driver warm meanwhile.)
    3. The second fault pauses B and its whole driver run (SIGSTOP) at the most dangerous
       step. Supervisor C resumes the job: it must wait for the lease to expire, then take
       over at a new epoch. Once C committed a batch, the zombie is resumed (SIGCONT): it
       must stop without deciding, acknowledging or writing anything.
    4. While C runs, its whole driver run and one of its Python workers are killed, in
       random order, at random moments.
    """

    def __init__(self, jobdir: JobDirectory, scenario: Scenario, config: JobConfig, seed: str):
        self.jobdir, self.scenario, self.config = jobdir, scenario, config
        self.random = random.Random(seed)
        self.plan = FaultPlan.parse(scenario.plan, f"{jobdir.path}/faults")
        self.supervisors: list[subprocess.Popen[str]] = []

    def run(self, notes: list[str]) -> JobRecord:
        try:
            return self._run(notes)
        finally:
            for supervisor in self.supervisors:
                with contextlib.suppress(ProcessLookupError):
                    supervisor.send_signal(signal.SIGCONT)
                    supervisor.kill()
                supervisor.wait()

    def _run(self, notes: list[str]) -> JobRecord:
        ttl = self.config.lease_ttl
        submit(self.jobdir.name, "epochal.testing.pipelines:copy", self.config)
        kill_supervisor, pause = self.scenario.faults
        first = self._supervise("a")
        _wait_for(lambda: first.poll() is not None, "supervisor A to be killed by its fault", 300)
        assert first.returncode == -signal.SIGKILL, f"supervisor A ended with {first.returncode}"
        orphan = self.plan.marker_info(kill_supervisor.label)
        started = time.monotonic()
        _wait_for(
            lambda: not processes.processes_of(str(orphan["token"])),
            "the driver run of the killed supervisor to die with it",
            ttl,
        )
        notes.append(f"orphaned driver run gone {time.monotonic() - started:.1f}s after A died")

        second = self._supervise("b")
        _wait_for(lambda: self.plan.fired()[-1:] == [pause.label], "the zombie's pause", 300)
        zombie = self.plan.marker_info(pause.label)
        assert zombie["token"] != orphan["token"], "the pause fired in A's orphaned run"
        lease = self.jobdir.lease()
        assert lease is not None
        # B is stopped: its last renewal is in the lease (or one made in the instant between
        # the pause's marker and B's SIGSTOP, which only makes C wait longer)
        zombie_epoch, last_renewal = lease.epoch, lease.renewed
        paused_at = float(zombie["at"])
        third = self._supervise("c")
        _wait_for(
            lambda: self._first_batch_of_epoch_after(zombie_epoch) is not None,
            "supervisor C to take over and commit a batch",
            300,
        )
        taken = self._first_batch_of_epoch_after(zombie_epoch)
        assert taken is not None
        waited = float(taken["started"]) - last_renewal
        assert waited >= ttl - 0.05, (
            f"supervisor C took the job over {waited:.2f}s after the zombie's last lease "
            f"renewal; it must wait for the lease ({ttl}s) to expire"
        )
        notes.append(
            f"take-over {waited:.1f}s after the zombie's last renewal, "
            f"{float(taken['started']) - paused_at:.1f}s after its pause (lease ttl {ttl}s)"
        )
        for pid in [int(zombie["supervisor"]), *processes.processes_of(str(zombie["token"]))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        _wait_for(
            lambda: second.poll() is not None and not processes.processes_of(str(zombie["token"])),
            "the zombie (supervisor B and its driver run) to stop",
            60,
        )
        notes.append(
            f"zombie stopped {time.monotonic() - resumed:.1f}s after SIGCONT (supervisor B "
            f"exit {second.returncode})"
        )
        check_zombie_wrote_nothing(self.jobdir, zombie, zombie_epoch, notes)
        done = self._random_kills(third, notes, kills=2)
        assert done == 2, f"only {done} of 2 random kills happened before the job ended: {notes}"
        _wait_for(lambda: third.poll() is not None, "supervisor C to finish the job", 600)
        record = self.jobdir.load()
        if third.returncode != 0:
            record.failure = f"{record.failure}\n{_driver_log_tail(self.jobdir.logs)}"
        return record

    def _supervise(self, tag: str) -> subprocess.Popen[str]:
        log = open(f"{self.jobdir.path}/supervisor-{tag}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "epochal",
                "jobs",
                "resume",
                self.jobdir.name,
                "--snapshot-dir",
                self.jobdir.snapshot_dir,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.supervisors.append(proc)
        return proc

    def _first_batch_of_epoch_after(self, epoch: int) -> dict | None:
        for run in self.jobdir.load().runs:
            if int(run.get("epoch", 0)) > epoch and run.get("first_batch_at"):
                return run
        return None

    def _random_kills(self, supervisor: subprocess.Popen[str], notes: list[str], kills: int) -> int:
        """Kill, at random moments, the active driver run and one of its Python workers
        (each kind at least once when ``kills`` >= 2, in random order); returns how many
        kills happened."""
        kinds = ["driver", "worker"] * (kills // 2) + [self.random.choice(["driver", "worker"])]
        kinds = kinds[:kills]
        self.random.shuffle(kinds)
        done = 0
        for kind in kinds:
            batch = self.jobdir.load().progress.get("batch", -1)
            with contextlib.suppress(AssertionError):
                _wait_for(
                    lambda b=batch: (
                        supervisor.poll() is not None
                        or self.jobdir.load().progress.get("batch", -1) > b
                    ),
                    "another committed batch",
                    120,
                )
            if supervisor.poll() is not None:
                break
            time.sleep(self.random.uniform(0.0, 1.5))  # a random moment, by design
            token = str(self.jobdir.load().driver.get("token") or "")
            victims = processes.processes_of(token)
            workers = processes.python_workers(token)
            at = self.jobdir.load().progress.get("batch")
            if kind == "worker" and workers:
                victim = self.random.choice(workers)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                notes.append(f"random kill after batch {at}: Python worker {victim}")
                done += 1
            elif victims:
                with contextlib.suppress(TimeoutError):
                    processes.kill_run(token)
                notes.append(f"random kill after batch {at}: the whole driver run")
                done += 1
        return done


def check_zombie_wrote_nothing(
    jobdir: JobDirectory, zombie: dict, zombie_epoch: int, notes: list[str]
) -> None:
    """Nothing written through the zombie's (moved) state directory, and no commit decision
    of the zombie's epoch for the batch it was paused in or a later one."""
    epochs = sorted(os.listdir(f"{jobdir.path}/epochs"))
    lease = jobdir.lease()
    assert lease is not None and epochs == [str(lease.state)], (
        f"the zombie wrote through its old state directory: epochs/ holds {epochs}"
    )
    paused_batch = zombie.get("batch")
    store = jobdir.store
    late = []
    for sink_id in _dirs(store.base, "sinks"):
        for key in store.list(f"sinks/{sink_id}/decisions"):
            decision = store.read_json(key)
            if (
                paused_batch is not None
                and int(decision["batch"]) >= int(paused_batch)
                and int(decision.get("lease_epoch", 0)) <= zombie_epoch
            ):
                late.append((key, decision.get("lease_epoch")))
    assert not late, f"the zombie recorded commit decisions after its pause: {late}"
    notes.append(f"zombie (epoch {zombie_epoch}, paused at batch {paused_batch}) wrote nothing")


def _dirs(base: str, sub: str) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir(f"{base}/{sub}"))
    return []


def _wait_for(condition: Any, what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")
        time.sleep(0.05)


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
