"""The kit's contract checks: the fast layer, in-process, no Spark.

Each check drives a connector's own source or sink objects through the runtime's protocol
classes (:class:`~epochal.protocols.acking.AckProtocol`, the two-phase commit of
:func:`~epochal.protocols.transactions.two_phase_commit`, the key digests of
:mod:`epochal.protocols.keys`), the way a job does, and plays its crashes: a step that runs in
a task or a driver runs in a child process that dies right after it
(:func:`~epochal.testing.crashing.run_then_die`), and what comes next is done by new objects,
as the next run does. An independent reader (the suite's ``SourceUnderTest`` or
``SinkUnderTest``) then says what was lost, duplicated or left behind. A check takes
milliseconds to a few seconds against a real server; it fails with what it saw and what the
contract says.

The checks of a suite (:meth:`~epochal.testing.suite.ConformanceSuite.contract_cases`) are
collected as ``test_contract[<check>]`` before the Spark scenarios, and the bug
catalogue (epochal's ``tests/conformance/catalogue.py``) runs them against broken connectors to show
that each one fails. Where a bug shows only under a real crash in a real job, the Spark scenarios
of :mod:`epochal.testing.suite` catch it.
"""

from __future__ import annotations

from epochal.testing.contract_checks.acknowledging import (
    check_ack_close_unacknowledged,
    check_ack_crash_before_ack,
    check_ack_crash_before_store,
    check_ack_settles_those,
    receive_step,
    store_step,
)
from epochal.testing.contract_checks.common import (
    CheckNotApplicableError,
    ContractCheck,
    ContractViolationError,
    Part,
    Subject,
    arrow_type,
)
from epochal.testing.contract_checks.replayable import check_replay_once, check_replay_same_rows
from epochal.testing.contract_checks.sinks import (
    check_2pc_cancel,
    check_2pc_crash_before_decision,
    check_2pc_crash_in_phase_2,
    check_2pc_empty_task,
    check_2pc_retried_task,
    check_typed_values,
    check_upsert_replay,
    check_upsert_update,
    transaction_step,
    upsert_step,
)

# -- the catalogue of checks -------------------------------------------------------------------
CHECKS: tuple[ContractCheck, ...] = (
    ContractCheck(
        "replay-same-rows",
        "replayable",
        "plans a batch over the produced records and reads each of its splits twice, with a "
        "new source object each time (two task attempts): the same rows, in the same order",
        check_replay_same_rows,
    ),
    ContractCheck(
        "replay-once",
        "replayable",
        "the planned batches hold every record exactly once; after more records arrive, the "
        "first batch reads the same again and the next batches hold the new records once",
        check_replay_once,
    ),
    ContractCheck(
        "ack-crash-before-store",
        "acknowledging",
        "a process receives the messages and dies before the runtime stored them: a new "
        "source receives every one again, with the same IDs; the runtime stores each once",
        check_ack_crash_before_store,
    ),
    ContractCheck(
        "ack-crash-before-ack",
        "acknowledging",
        "the runtime stores batches and its process dies before acknowledging: the "
        "redeliveries are dropped by ID (nothing stored twice); acknowledging settles the source",
        check_ack_crash_before_ack,
    ),
    ContractCheck(
        "ack-settles-those",
        "acknowledging",
        "a process acknowledges half of what it received (twice) and dies: only the other "
        "half comes back, with the same IDs; acknowledging the rest settles the source",
        check_ack_settles_those,
    ),
    ContractCheck(
        "ack-close-unacknowledged",
        "acknowledging",
        "a source receives a few messages, acknowledges none and is closed (a graceful stop): "
        "a new source gets every message again, with the same IDs",
        check_ack_close_unacknowledged,
    ),
    ContractCheck(
        "2pc-retried-task",
        "transactional",
        "a task attempt aborts, the next prepares and dies unreported, a third prepares and "
        "is decided: every record visible once, nothing left in doubt",
        check_2pc_retried_task,
    ),
    ContractCheck(
        "2pc-crash-before-decision",
        "transactional",
        "two tasks prepare (in processes that die) and the driver dies before the decision; "
        "a new run recovers (in_doubt, rollback) and replays: visible once, nothing in doubt",
        check_2pc_crash_before_decision,
    ),
    ContractCheck(
        "2pc-crash-in-phase-2",
        "transactional",
        "the driver dies after a decision, then after phase 2 but before it was recorded; "
        "recovery commits from new objects, the second time again: visible once",
        check_2pc_crash_in_phase_2,
    ),
    ContractCheck(
        "2pc-cancel",
        "transactional",
        "a batch commits, the next one's tasks prepare and the driver dies before its "
        "decision; the job is cancelled: the operator's settling (a sink built from its "
        "options, no run asking) settles it: the first visible once, the other's task all "
        "or nothing, nothing in doubt",
        check_2pc_cancel,
    ),
    ContractCheck(
        "2pc-empty-task",
        "transactional",
        "a task that got no rows prepares too; the batch commits without an error",
        check_2pc_empty_task,
    ),
    ContractCheck(
        "2pc-types",
        "transactional",
        "a batch of typed records (every type the suite says the sink maps, nulls in every "
        "column of some) reads back the same by value; a type it does not map is refused by "
        "check() naming the column",
        check_typed_values,
    ),
    ContractCheck(
        "upsert-replay",
        "idempotent",
        "a task writes in several Arrow batches, flushes and dies: every record visible; the "
        "replay in a new run and attempt leaves what a reader sees unchanged (same key digest)",
        check_upsert_replay,
    ),
    ContractCheck(
        "upsert-update",
        "idempotent",
        "a later batch writes new values for the same keys: the reader's last value of each "
        "key is the new one",
        check_upsert_update,
    ),
    ContractCheck(
        "upsert-types",
        "idempotent",
        "a batch of typed records (every type the suite says the sink maps, nulls in every "
        "column of some) reads back the same by value; a type it does not map is refused by "
        "check() naming the column",
        check_typed_values,
    ),
)
"""Every contract check, cheapest first within a contract."""

BY_NAME = {check.name: check for check in CHECKS}


def checks_of(contract: str) -> list[ContractCheck]:
    """The checks of one contract, in order."""
    return [c for c in CHECKS if c.contract == contract]


__all__ = [
    "BY_NAME",
    "CHECKS",
    "CheckNotApplicableError",
    "ContractCheck",
    "ContractViolationError",
    "Part",
    "Subject",
    "arrow_type",
    "checks_of",
    "receive_step",
    "store_step",
    "transaction_step",
    "upsert_step",
]
