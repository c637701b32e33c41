"""The catalogue of crash points the kit kills at, per contract and guarantee, and the
coverage table that shows each of them was killed (see :mod:`epochal.base.fault_plan` for
the points themselves and where each runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from epochal_sdk import Guarantee

if TYPE_CHECKING:
    from epochal.testing.scenarios import Outcome, Scenario


class LabelsCrashPoints(Protocol):
    """A suite as the coverage table sees it (:class:`~epochal.testing.ConformanceSuite`):
    it names the connector each crash point belongs to."""

    def connector_label(self, point: str) -> str:
        """The connector ``point`` belongs to, for the coverage table."""
        ...


_REPLAYABLE_POINTS = ("source.after_plan", "source.after_read", "source.after_commit")
SOURCE_POINTS = {
    ("replayable", Guarantee.EXACTLY_ONCE): _REPLAYABLE_POINTS,
    ("replayable", Guarantee.AT_LEAST_ONCE): _REPLAYABLE_POINTS,
    ("acknowledging", Guarantee.EXACTLY_ONCE): (
        "ack_source.after_receive",
        "ack_source.after_store",
        "ack_source.before_ack",
        "ack_source.after_ack",
    ),
    ("acknowledging", Guarantee.AT_LEAST_ONCE): (
        "ack_source.after_receive",
        "ack_source.before_ack",
        "ack_source.after_ack",
    ),
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
RESTARTER_KINDS = ("real-failures", "session-failures")
"""Scenarios whose failures come from outside (a restarter), with random kills."""


# -- coverage -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoverageRow:
    """One crash point of one connector at one guarantee and sink mode, killed one way."""

    connector: str
    point: str
    guarantee: str
    mode: str
    kill: str


@dataclass(frozen=True)
class ContractRow:
    """One contract check of one connector in one sink mode."""

    connector: str
    check: str
    mode: str


CONTRACT_RESULTS: dict[ContractRow, str] = {}
"""Every contract check the session ran, with its state: ``passed in <s>`` or ``FAILED``
(filled in by the kit; printed by the plugin at the end of the session)."""

EXPECTED: dict[CoverageRow, str] = {}
"""Every row the collected scenarios should cover, with its state (filled in by the kit;
printed by the plugin at the end of the session): ``not run`` (the scenario did not run),
``passed``, ``FAILED``, or ``not reached`` (its scenario failed before this fault's turn
came). A failed scenario marks FAILED only the rows it can blame (see
:func:`fault_results`)."""

PASSED, FAILED, NOT_REACHED, NOT_RUN = "passed", "FAILED", "not reached", "not run"


def coverage_rows(suite: LabelsCrashPoints, scenario: Scenario) -> list[CoverageRow]:
    """The rows a scenario of ``suite`` covers."""
    rows = []
    for fault in scenario.faults:
        if scenario.kind == "real-failures":
            kill = fault.kind if fault.kind in ("supervisor", "pause") else "random"
        elif scenario.kind == "session-failures":
            kill = f"session {fault.kind}"
        elif scenario.kind == "zombie-upsert":
            kill = "zombie task"
        else:
            kill = fault.kind
        rows.append(
            CoverageRow(
                suite.connector_label(fault.point),
                fault.point if scenario.pipeline == "copy" else f"{fault.point} (aggregate)",
                scenario.guarantee.label,
                scenario.mode_label,
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
                scenario.mode_label,
                "session random" if session else "random",
            )
        )
    return rows


def fault_results(scenario: Scenario, outcome: Outcome, per_batch: int, failed: bool) -> list[str]:
    """The coverage state of each of ``scenario``'s rows (as :func:`coverage_rows` gives them)
    after it ran: all passed when it did not fail. When it failed, FAILED goes only where the
    failure can be placed in its sequence of faults, the faults after it are ``not reached``
    and the ones before it passed:

    - the job did not complete: the last fault that fired (the job broke after it), or the
      first one when none fired;
    - the job completed but a fault did not fire: that fault;
    - records lost (or duplicated under exactly-once) in the copy pipeline: for each of
      those records, the fault that fired last at or before the batch it was in, by the
      batch each fault's marker recorded (a fault that records none, ``source.after_plan``,
      counts at the batch of the fault before it; an acknowledging source's stored batch
      ``n`` is Spark's batch ``n - 1``), and every other fault that fired at that same
      batch: a sequence's faults often fire one after another on the retries of one batch,
      and the records of that batch went through all of them. The kit's sources give the
      produced records in ID order, ``per_batch`` to a batch, so record ``i`` is in batch
      ``i // per_batch``;
    - anything else (transactions left in doubt, the source left unsettled, a loss in the
      aggregate pipeline or in a scenario with random kills, which no marker places): every
      row of the sequence.
    """
    random_row = [PASSED] if scenario.kind in RESTARTER_KINDS else []
    if not failed:
        return [PASSED] * len(scenario.faults) + random_row
    fired = len(outcome.fired)
    states = [PASSED] * fired + [NOT_REACHED] * (len(scenario.faults) - fired)
    if not outcome.ended_as_meant:
        states[max(fired - 1, 0)] = FAILED
        return states + [NOT_REACHED] * len(random_row)
    if fired < len(scenario.faults):
        states[fired] = FAILED
        return states + [NOT_REACHED] * len(random_row)
    bad = list(outcome.lost)
    if scenario.guarantee == Guarantee.EXACTLY_ONCE:
        bad += list(outcome.duplicated)
    if not bad or scenario.pipeline != "copy" or random_row:
        return [FAILED] * (len(scenario.faults) + len(random_row))
    batches: list[int] = []
    for label in outcome.fired:
        fired_at = outcome.fired_batches.get(label)
        if fired_at is None:  # fired after the fault before it
            batches.append(batches[-1] if batches else 0)
        else:  # Spark's batch ids count from 0, an acknowledging source's stored batches from 1
            batches.append(fired_at - 1 if label.startswith("ack_source.") else fired_at)
    for record in bad:
        at_or_before = [b for b in batches if b <= record // per_batch]
        blamed = max(at_or_before) if at_or_before else min(batches)
        for i, fired_at in enumerate(batches):
            if fired_at == blamed:
                states[i] = FAILED
    return states
