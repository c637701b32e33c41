"""The catalogue of crash points the kit kills at, per contract and guarantee, and the
coverage table that shows each of them was killed (see :mod:`epochal.base.fault_plan` for
the points themselves and where each runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal_sdk import Guarantee

if TYPE_CHECKING:
    from epochal.testing.scenarios import Scenario
    from epochal.testing.suite import ConformanceSuite

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
