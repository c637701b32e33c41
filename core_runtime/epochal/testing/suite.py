"""The conformance kit's pytest suite: crash tests written once, run by every connector
package.

A connector package subclasses :class:`ConformanceSuite`, says which contracts it has, and
gives two fixtures: ``epochal_source`` (a :class:`SourceUnderTest`) and/or ``epochal_sink``
(a :class:`SinkUnderTest`). The kit then runs real Spark jobs that are killed hard (SIGKILL,
SIGSTOP) at every step of the protocols, restarted, and checked by record ID through an
independent reader: exactly-once means 0 lost, 0 duplicated, nothing left prepared or
unacknowledged; at-least-once means 0 lost.

Each test is a :class:`Scenario`: one job run that goes through a *sequence* of failures, one
after another (see :mod:`epochal.base.fault_plan`), so a handful of job runs cover every
crash point:

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
                    resumed (SIGCONT): it must decide, acknowledge and write nothing (for a
                    transactional sink the zombie is a write task paused after writing,
                    woken once its driver is gone: it must prepare nothing; see
                    ``zombie_write_task``); then
                    a kill of the whole driver and one of a Python worker, in random order
                    at random moments.
``zombie-upsert``   an idempotent sink's write task paused after its upserts (before its
                    flush), its driver replaced and the job finished by another, then its
                    driver lost and the task alone woken: in the running aggregation no
                    group's value may go back (an old value written over a newer one).
``session-failures`` the same failures where no supervisor runs: the query in a user's
                    plain SparkSession, its driver started again by an outside restarter
                    (as YARN or a restart policy does); the driver holds the job's lease
                    itself (:mod:`epochal.control.lease_keeper`).

Scenarios run on ``local[2,4]`` (failed tasks are retried); executor JVM kills on
``local-cluster[2,1,1024]``. On pyspark 4.2+ a job reads records that are all there before it
starts (available-now); on 4.0 and 4.1, which lack that trigger and read limits for Python
sources, at a processing-time trigger with records arriving a batch at a time, stopped
gracefully once it caught up (:mod:`epochal.testing.runner`); the restarter scenarios are
skipped there, saying why. At the end of the session the plugin prints a coverage table
(connector, point, guarantee, mode, kill → passed), so a crash point cannot drop out unseen.

Before the scenarios, each suite runs the *contract checks* of its contracts
(:mod:`epochal.testing.contract_checks`, ``test_contract[<check>]``): no Spark, the
connector's objects driven through the runtime's protocol classes with crashes played by
processes that die, milliseconds to seconds each. They catch most of the bugs of the kit's
catalogue (epochal's ``tests/conformance/catalogue.py``) before a Spark job starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from epochal.base.fault_plan import DRIVER_POINTS, EXECUTOR_POINTS, Fault
from epochal.control.launcher import DriverPool
from epochal.testing.contract_checks import (
    CheckNotApplicableError,
    ContractCheck,
    Subject,
    checks_of,
)
from epochal.testing.contract_checks.common import REQUEUE_WAIT, poll_until_settled
from epochal.testing.points import (
    CONTRACT_RESULTS,
    EXPECTED,
    JOB_POINT,
    SINK_POINTS,
    SOURCE_POINTS,
    ContractRow,
    coverage_rows,
    fault_results,
)
from epochal.testing.runner import not_runnable, run_case
from epochal.testing.scenarios import CLUSTER, FOREACH_BATCH, FORMAT, Outcome, Scenario
from epochal.testing.under_test import SinkUnderTest, SourceUnderTest
from epochal_sdk import Guarantee


@dataclass(frozen=True)
class ContractCase:
    """One contract check of a suite, in one sink mode (the first one for source checks)."""

    check: ContractCheck
    mode: str

    @property
    def side(self) -> str:
        """``source`` or ``sink``: the side the check drives."""
        return "source" if self.check.contract in ("replayable", "acknowledging") else "sink"

    @property
    def id(self) -> str:
        """The test id: the check's name (transactional and idempotent checks name their
        mode)."""
        return self.check.name


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
        session_failures: with ``real_failures``, also the plain-session half (default);
            off where another suite runs it for the same sink or source, or for the same
            contract (in a plain session the lease and the restarts are the runtime's).
        graceful_stop: end the real-failures and session-failures scenarios with a
            graceful stop (``jobs suspend``; a plain session's ``query.stop()``), checked for
            anything left in doubt, and a last start (default).
        contract_checks: also run the contract checks of the contracts under test (no
            Spark; see :mod:`epochal.testing.contract_checks`).
        sink_paths: how the pipelines write to the sink: ``format`` (its data source) and/or
            ``foreachBatch`` (its ``foreachBatch`` writer, :func:`epochal.foreach_batch`:
            the sink's crash points in each mode under ``epochal run`` and the plain-session
            real failures; on pyspark 3.5, with a source of Spark's own, the plain-session
            case only).
        zombie_write_task: for a transactional sink, the real-failures zombie is one of the
            driver's write tasks, woken after its driver was replaced and lost, as on an
            executor of another machine (default); an idempotent sink mode gets the
            ``zombie-upsert`` case. False for a sink whose data is a file of
            the driver's machine (the map): its tasks can only run on the machine that
            takes over, which ends them; its zombie is the paused driver.
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
    session_failures: ClassVar[bool] = True
    graceful_stop: ClassVar[bool] = True
    contract_checks: ClassVar[bool] = True
    zombie_write_task: ClassVar[bool] = True
    sink_paths: ClassVar[tuple[str, ...]] = (FORMAT,)
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
        """The scenarios of this suite (see the module doc): through the sink's data source
        (``format`` in :attr:`sink_paths`) and through its ``foreachBatch`` writer."""
        out = cls._format_cases() if FORMAT in cls.sink_paths else []
        if FOREACH_BATCH in cls.sink_paths:
            out += cls._foreach_batch_cases()
        return out

    @classmethod
    def _foreach_batch_cases(cls) -> list[Scenario]:
        """The sink through its ``foreachBatch`` writer, exactly-once: in each mode every
        crash point of the sink (an executor's point killing the task's Python worker, a
        driver's point the whole driver: the writer's steps run in the driver's own
        process) and the whole driver after a batch, under ``epochal run``; and the
        plain-session real failures in the first mode."""
        exactly_once = Guarantee.EXACTLY_ONCE
        if cls.scope not in ("all", "sink") or exactly_once not in cls.guarantees:
            return []
        out = []
        for mode in cls.modes():
            faults = (*(Fault(p) for p in SINK_POINTS[(mode, exactly_once)]), Fault(JOB_POINT))
            out.append(Scenario("points", exactly_once, mode, faults, sink_path=FOREACH_BATCH))
        if cls.real_failures and cls.session_failures:
            out.append(
                Scenario(
                    "session-failures",
                    exactly_once,
                    cls.modes()[0],
                    (
                        Fault("sink.after_commit", action="driver"),
                        Fault(cls.pause_point("session-failures"), action="pause"),
                    ),
                    graceful_stop=cls.graceful_stop,
                    sink_path=FOREACH_BATCH,
                )
            )
        return out

    @classmethod
    def _format_cases(cls) -> list[Scenario]:
        """The scenarios through the sink's data source (see the module doc)."""
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
                kills = (Fault(step, action="worker"), Fault(JOB_POINT))
                out.append(Scenario("aggregate", exactly_once, mode, kills, pipeline="aggregate"))
        if cls.real_failures:
            out.append(
                Scenario(
                    "real-failures",
                    exactly_once,
                    first,
                    (
                        Fault(JOB_POINT, action="supervisor"),
                        Fault(cls.pause_point("real-failures"), action="pause"),
                    ),
                    graceful_stop=cls.graceful_stop,
                )
            )
        if cls.real_failures and cls.session_failures:
            out.append(
                Scenario(
                    "session-failures",
                    exactly_once,
                    first,
                    (
                        Fault("sink.after_commit", action="driver"),
                        Fault(cls.pause_point("session-failures"), action="pause"),
                    ),
                    graceful_stop=cls.graceful_stop,
                )
            )
        upserts = cls.scope in ("all", "sink") and "idempotent" in cls.modes()
        if cls.real_failures and cls.zombie_write_task and upserts:
            out.append(
                Scenario(
                    "zombie-upsert",
                    exactly_once,
                    "idempotent",
                    (Fault("sink.after_write", action="pause"),),
                    pipeline="aggregate",
                )
            )
        return out

    @classmethod
    def contract_cases(cls) -> list[ContractCase]:
        """The contract checks of this suite: the source's contract, then each sink mode's."""
        if not cls.contract_checks:
            return []
        out: list[ContractCase] = []
        if cls.scope in ("all", "source"):
            out += [ContractCase(c, cls.modes()[0]) for c in checks_of(cls.source_contract)]
        if cls.scope in ("all", "sink"):
            for mode in cls.modes():
                out += [ContractCase(c, mode) for c in checks_of(mode)]
        return out

    @classmethod
    def contract_subject(
        cls, case: ContractCase, under: SourceUnderTest | SinkUnderTest, workdir: str
    ) -> Subject:
        """What ``case`` drives: the side under test, in a fresh directory."""
        source = under if case.side == "source" else None
        sink = under if case.side == "sink" else None
        return Subject(
            source=source,  # type: ignore[arg-type]
            sink=sink,  # type: ignore[arg-type]
            mode=case.mode,
            workdir=workdir,
            per_batch=max(4, min(cls.records_per_batch, 20)),
            exactly_once=Guarantee.EXACTLY_ONCE in cls.guarantees,
        )

    @classmethod
    def pause_point(cls, kind: str) -> str:
        """Where the zombie of scenario ``kind`` is paused: the most dangerous step of the
        contracts under test. A transactional sink's: in real-failures a write task that
        wrote its rows and has not prepared (the zombie is that task, woken after its driver
        was replaced; unless ``zombie_write_task`` is off), else the driver before its commit
        decision. Else
        before an acknowledgement, after a source's plan, or after a sink's commit."""
        if cls.scope in ("all", "sink") and cls.modes()[0] == "transactional":
            task = kind == "real-failures" and cls.zombie_write_task
            return "sink.after_write" if task else "sink.before_decision"
        if cls.scope in ("all", "source") and cls.source_contract == "acknowledging":
            return "ack_source.before_ack"
        if cls.scope in ("all", "source"):
            return "source.after_plan"
        return "sink.after_commit"

    def test_contract(self, contract_case: ContractCase, tmp_path: Any, request: Any) -> None:
        """Run one contract check against the side under test (its fixture): no Spark; a
        :class:`~epochal.testing.contract_checks.ContractViolationError` says what broke."""
        case = contract_case
        under = request.getfixturevalue(f"epochal_{case.side}")
        if getattr(under, "format", ""):
            pytest.skip(
                f"the source is read as format({under.format!r}), not an epochal connector: "
                "the contract checks drive an epochal connector's own objects"
            )
        row = ContractRow(
            under.connector, case.check.name, case.mode if case.side == "sink" else ""
        )
        CONTRACT_RESULTS[row] = "FAILED"
        started = time.perf_counter()
        try:
            case.check.run(type(self).contract_subject(case, under, str(tmp_path)))
        except CheckNotApplicableError as exc:
            CONTRACT_RESULTS[row] = f"skipped: {exc}"
            pytest.skip(str(exc))
        CONTRACT_RESULTS[row] = f"passed in {time.perf_counter() - started:.1f} s"

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
        reason = not_runnable(scenario, epochal_source)
        if reason:
            for row in rows:
                EXPECTED[row] = f"skipped: {reason}"
            pytest.skip(reason)
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
            replayable=self.source_contract == "replayable",
        )
        request.node.user_properties.append(("epochal", outcome.summary()))
        problem = scenario_problem(scenario, outcome, epochal_source, epochal_sink)
        states = fault_results(scenario, outcome, self.records_per_batch, problem is not None)
        for row, state in zip(rows, states, strict=True):
            EXPECTED[row] = state
        assert problem is None, problem


def scenario_problem(
    scenario: Scenario, outcome: Outcome, source: SourceUnderTest, sink: SinkUnderTest
) -> str | None:
    """What went wrong in a scenario's run (None when nothing did): the job failed, a fault
    did not fire, records were lost (or duplicated under exactly-once) or show another value
    than the one written, transactions were left in doubt or the source unsettled (polled:
    see :meth:`SourceUnderTest.unsettled`)."""
    if not outcome.ended_as_meant:
        return (
            f"the job did not end {outcome.ending.value}: it is {outcome.record.status.value}: "
            f"{outcome.record.failure}"
        )
    if outcome.fired != [f.label for f in scenario.faults]:
        return f"not every fault fired: {outcome}"
    if outcome.lost:
        return f"lost records: {outcome}"
    if outcome.wrong:
        return f"records with another value than the one written: {outcome}"
    if outcome.wrong_typed:
        lines = "; ".join(outcome.wrong_typed[:5])
        return (
            f"{len(outcome.wrong_typed)} typed values read back differ from those written "
            f"(the kit's typed record, through Spark): {lines}; {outcome}"
        )
    if scenario.guarantee == Guarantee.EXACTLY_ONCE and outcome.duplicated:
        return f"duplicates under exactly-once: {outcome}"
    counted = _metric_problem(scenario, outcome)
    if counted:
        return counted
    leftovers = sink.in_doubt()
    if leftovers:
        return f"in-doubt transactions left behind: {leftovers}"
    unsettled = poll_until_settled(source.unsettled, REQUEUE_WAIT)
    if unsettled:
        return f"the source was left unsettled: {unsettled}"
    return None


def _metric_problem(scenario: Scenario, outcome: Outcome) -> str | None:
    """Under exactly-once, in the copy pipeline: the sink's committed-records counter, and an
    epochal source's, must equal the records the independent reader sees, once each whatever
    the replays."""
    if scenario.guarantee != Guarantee.EXACTLY_ONCE or scenario.pipeline != "copy":
        return None
    if outcome.metric_committed is None:
        return f"the sink reported no records_committed metric: {outcome}"
    counters = [("sink", outcome.metric_committed)]
    if outcome.source_metric_committed is not None:
        counters.append(("source", outcome.source_metric_committed))
    for side, counted in counters:
        if counted != outcome.seen:
            return (
                f"the {side}'s records_committed metric says {counted:.0f}, the "
                f"independent reader sees {outcome.seen} records: {outcome}"
            )
    return None


def _in_place(point: str) -> Fault:
    """The point's fault with only the process performing the step killed."""
    return Fault(point, action="worker")
