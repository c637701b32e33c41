"""The kit's coverage table: a failed scenario marks FAILED the crash point it can blame (the
one after which records went missing, the one after which the job broke, the one that did
not fire), the faults before it passed and the ones after it not reached."""

from __future__ import annotations

from epochal.base.fault_plan import Fault
from epochal.state.jobs import JobRecord, JobStatus
from epochal.testing.points import FAILED, NOT_REACHED, PASSED, fault_results
from epochal.testing.scenarios import Outcome, Scenario
from epochal_sdk import Guarantee

PER_BATCH = 100
POINTS = Scenario(
    "points",
    Guarantee.EXACTLY_ONCE,
    "transactional",
    (
        Fault("source.after_plan", action="worker"),
        Fault("sink.after_write", action="worker"),
        Fault("sink.before_decision", action="worker"),
        Fault("job.after_batch"),
    ),
)
LABELS = [f.label for f in POINTS.faults]
BATCHES = {LABELS[0]: None, LABELS[1]: 1, LABELS[2]: 3, LABELS[3]: 5}


def outcome(
    fired: int = 4,
    lost: list[int] | None = None,
    duplicated: dict[int, int] | None = None,
    status: JobStatus = JobStatus.COMPLETED,
) -> Outcome:
    labels = LABELS[:fired]
    return Outcome(
        record=JobRecord("job", "epochal.pipelines:copy", {}, status=status),
        expected=800,
        seen=800 - len(lost or []),
        lost=lost or [],
        duplicated=duplicated or {},
        fired=labels,
        fired_batches={label: BATCHES[label] for label in labels},
    )


def test_a_scenario_that_passed_passes_every_row() -> None:
    assert fault_results(POINTS, outcome(), PER_BATCH, failed=False) == [PASSED] * 4


def test_records_lost_after_one_crash_point_fail_that_point_only() -> None:
    # records 300-349 were in batch 3: the last fault at or before it fired at 3
    results = fault_results(POINTS, outcome(lost=list(range(300, 350))), PER_BATCH, True)
    assert results == [PASSED, PASSED, FAILED, PASSED]


def test_a_fault_with_no_batch_counts_at_the_batch_of_the_one_before() -> None:
    # record 5 is in batch 0: before sink.after_write@1, after source.after_plan (at 0)
    assert fault_results(POINTS, outcome(lost=[5]), PER_BATCH, True) == [
        FAILED,
        PASSED,
        PASSED,
        PASSED,
    ]
    first_only = Scenario("points", Guarantee.EXACTLY_ONCE, "transactional", POINTS.faults[:1])
    assert fault_results(first_only, outcome(fired=1, lost=[5]), PER_BATCH, True) == [FAILED]


def test_faults_that_fired_at_the_same_batch_share_the_blame() -> None:
    same_batch = Outcome(
        record=JobRecord("job", "epochal.pipelines:copy", {}, status=JobStatus.COMPLETED),
        expected=800,
        seen=750,
        lost=list(range(150, 200)),
        fired=LABELS,
        fired_batches={LABELS[0]: None, LABELS[1]: 0, LABELS[2]: 1, LABELS[3]: 1},
    )
    assert fault_results(POINTS, same_batch, PER_BATCH, True) == [PASSED, PASSED, FAILED, FAILED]


def test_duplicates_under_exactly_once_are_placed_like_losses() -> None:
    results = fault_results(POINTS, outcome(duplicated={620: 2}), PER_BATCH, True)
    assert results == [PASSED, PASSED, PASSED, FAILED]


def test_an_acknowledging_source_s_stored_batch_n_is_spark_s_batch_n_minus_one() -> None:
    ack = Scenario(
        "points",
        Guarantee.EXACTLY_ONCE,
        "transactional",
        (Fault("ack_source.after_receive", action="worker"), Fault("job.after_batch")),
    )
    labels = [f.label for f in ack.faults]
    lost_in_batch_1 = Outcome(
        record=JobRecord("job", "epochal.pipelines:copy", {}, status=JobStatus.COMPLETED),
        expected=800,
        seen=790,
        lost=list(range(100, 110)),
        fired=labels,
        fired_batches={labels[0]: 2, labels[1]: 4},
    )
    assert fault_results(ack, lost_in_batch_1, PER_BATCH, True) == [FAILED, PASSED]


def test_a_job_that_broke_fails_the_last_fault_that_fired_and_the_rest_were_not_reached() -> None:
    results = fault_results(POINTS, outcome(fired=2, status=JobStatus.FAILED), PER_BATCH, True)
    assert results == [PASSED, FAILED, NOT_REACHED, NOT_REACHED]
    none_fired = fault_results(POINTS, outcome(fired=0, status=JobStatus.FAILED), PER_BATCH, True)
    assert none_fired == [FAILED, NOT_REACHED, NOT_REACHED, NOT_REACHED]


def test_a_fault_that_did_not_fire_in_a_completed_job_is_the_one_failed() -> None:
    results = fault_results(POINTS, outcome(fired=3), PER_BATCH, True)
    assert results == [PASSED, PASSED, PASSED, FAILED]


def test_what_no_marker_places_fails_the_whole_sequence() -> None:
    # nothing lost or duplicated: the failure was something left in doubt or unsettled
    assert fault_results(POINTS, outcome(), PER_BATCH, True) == [FAILED] * 4
    restarter = Scenario(
        "real-failures",
        Guarantee.EXACTLY_ONCE,
        "transactional",
        (Fault("job.after_batch", action="supervisor"),),
    )
    # a loss where random kills also happened: the fault row and the random-kills row
    assert fault_results(restarter, outcome(fired=1, lost=[5]), PER_BATCH, True) == [
        FAILED,
        FAILED,
    ]


def test_the_coverage_of_two_workers_is_one_table_where_a_failure_wins() -> None:
    """Under pytest-xdist each worker collects every scenario and runs some; the controller
    merges their rows: a row one worker ran is ``not run`` on the other, and a FAILED row or
    contract check is never hidden by another worker's state."""
    from types import SimpleNamespace

    from epochal.testing import plugin
    from epochal.testing.points import (
        CONTRACT_RESULTS,
        EXPECTED,
        FAILED,
        NOT_RUN,
        PASSED,
        ContractRow,
        CoverageRow,
    )

    ran = CoverageRow("map", "sink.a", "exactly-once", "transactional", "worker")
    broke = CoverageRow("map", "sink.b", "exactly-once", "transactional", "worker")
    check = ContractRow("map", "replay-once", "")
    workers = [  # what each worker's session holds at its end
        ({ran: PASSED, broke: NOT_RUN}, {check: FAILED}),
        ({ran: NOT_RUN, broke: FAILED}, {check: "passed in 0.1 s"}),
        ({ran: NOT_RUN, broke: NOT_RUN}, {}),
    ]
    saved = dict(EXPECTED), dict(CONTRACT_RESULTS)
    try:
        outputs = []
        for expected, contracts in workers:
            EXPECTED.clear()
            EXPECTED.update(expected)
            CONTRACT_RESULTS.clear()
            CONTRACT_RESULTS.update(contracts)
            session = SimpleNamespace(config=SimpleNamespace(workeroutput={}))
            plugin.pytest_sessionfinish(session)
            outputs.append(session.config.workeroutput)
        EXPECTED.clear()  # the controller collects nothing itself
        CONTRACT_RESULTS.clear()
        for output in outputs:
            plugin.pytest_testnodedown(SimpleNamespace(workeroutput=output), None)
        assert {ran: PASSED, broke: FAILED} == EXPECTED
        assert {check: FAILED} == CONTRACT_RESULTS
    finally:
        EXPECTED.clear()
        EXPECTED.update(saved[0])
        CONTRACT_RESULTS.clear()
        CONTRACT_RESULTS.update(saved[1])
