"""How a job's recoveries went, phase by phase, from its record: what the demo's summary and
``jobs status`` print.

Each run after a failure records when the failure was seen (the previous run's end), when the
new run started (a promoted standby, a new driver process, or the same driver restarting the
query in place), the steps of its start (:class:`~epochal.driver.progress.Phases`), when its
first batch was committed and how Spark spent that batch; a promoted standby's entry also
says whether it had finished its warm-up. A crash point's marker adds the moment of the kill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

START_STEPS = (
    "process",
    "session",
    "register",
    "bind",
    "restart",
    "quorum",
    "query start",
    "first batch",
)
"""The steps of a run's start in the order they happen (a cold driver's first three; a
promoted standby binds; a query restarted in place has its ``restart``)."""
SPARK_STEPS = (
    ("latestOffset", "offsets"),
    ("queryPlanning", "planning"),
    ("addBatch", "the batch's tasks and commit"),
    ("walCommit", "offset log"),
    ("commitOffsets", "commit log"),
)
"""Spark's names for the parts of a batch (``durationMs`` of its progress) worth showing."""


@dataclass
class Recovery:
    """One run that recovered from a failure: its kind, the phases from the failure (or the
    kill) to its first committed batch, and what its standby was at promotion."""

    run: int
    kind: str
    seconds: float
    """From the failure seen (or the kill, when known) to the first committed batch."""
    phases: list[tuple[str, float]] = field(default_factory=list)
    batch: list[tuple[str, float]] = field(default_factory=list)
    """How Spark spent the first batch (a part of the last phase)."""
    standby: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """For ``jobs status --json``."""
        return {
            "run": self.run,
            "kind": self.kind,
            "seconds": self.seconds,
            "phases": dict(self.phases),
            "first_batch": dict(self.batch),
            **({"standby": self.standby} if self.standby else {}),
        }

    def describe(self) -> str:
        """One line: ``run 3 (standby, ready): 2.41 s = failure seen 0.20 + ...``."""
        kind = self.kind
        if self.standby is not None:
            ready = self.standby.get("ready")
            up = self.standby.get("up_s")
            kind += (", ready" if ready else f", still warming up ({up} s after its launch)") + (
                f", warm-up {self.standby['warmup_s']} s" if self.standby.get("warmup_s") else ""
            )
        parts = " + ".join(f"{name} {seconds:.2f}" for name, seconds in self.phases)
        spark = ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.batch)
        return f"run {self.run} ({kind}): {self.seconds:.2f} s = {parts}" + (
            f" (the first batch: {spark})" if spark else ""
        )


def recoveries(runs: list[dict[str, Any]], kills: list[float] | None = None) -> list[Recovery]:
    """The recoveries in a job record's run history (``JobRecord.runs``); ``kills`` are the
    moments of kills known from outside (crash point markers), matched to the failure each
    preceded."""
    out = []
    for entry in runs:
        failed, done = entry.get("failed_at"), entry.get("first_batch_at")
        if failed is None or done is None:
            continue
        failed, done = float(failed), float(done)
        phases: list[tuple[str, float]] = []
        kill = _kill_before(kills or [], failed)
        start = failed
        if kill is not None:
            phases.append(("kill → failure seen", failed - kill))
            start = kill
        began = float(entry.get("started") or failed)
        if entry.get("kind") != "in-place":  # in place: the query's end is the run's start
            phases.append(("new run started", max(0.0, began - failed)))
        steps = dict(entry.get("phases") or {})
        order = [name for name in START_STEPS if name in steps] + sorted(
            set(steps) - set(START_STEPS)
        )
        phases += [(name, float(steps[name])) for name in order]
        spark = dict(entry.get("first_batch_spark_ms") or {})
        batch = [(label, spark[key] / 1000) for key, label in SPARK_STEPS if spark.get(key)]
        out.append(
            Recovery(
                int(entry.get("run", 0)),
                str(entry.get("kind", "?")),
                round(done - start, 3),
                phases,
                batch,
                entry.get("standby"),
            )
        )
    return out


def _kill_before(kills: list[float], failed: float) -> float | None:
    """The last kill at most a minute before the failure was seen, if any."""
    before = [k for k in kills if failed - 60 <= k <= failed]
    return max(before) if before else None
