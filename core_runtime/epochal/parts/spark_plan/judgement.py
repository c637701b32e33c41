"""The judgement of a query's parts: the guarantee they let a job run with (:func:`judge`), the
message of a refusal and its remedies (:func:`refusal_message`), what a run's store keeps of
each part (:func:`part_records`), and the judgement again of a source whose replays move rows
between Spark partitions, against a sink that settles each partition on its own
(:func:`settled_by_partition`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epochal.base import secrets
from epochal.parts import registry
from epochal.parts.records import PartRecord
from epochal.parts.spark_plan.capabilities import (
    DECLARED_GUARANTEE,
    EPOCHAL_FORMAT_PREFIX,
    IDEMPOTENT_FOREACH_BATCH,
    ORDERED_KAFKA_FORMAT,
    Origin,
    PlanPart,
    Role,
)
from epochal_sdk import Guarantee, Options
from epochal_sdk.errors import GuaranteeError

log = logging.getLogger("epochal.parts.spark_plan")


@dataclass(frozen=True)
class PartResult:
    """What one part runs with in a job.

    Attributes:
        part: the part.
        runs_with: the guarantee it runs with (the job's, or what the part can give when that
            is less and the job allows the downgrade); ``None`` when not judged here.
        downgraded: it gives less than the job asks, and runs so because the job allows it.
    """

    part: PlanPart
    runs_with: Guarantee | None
    downgraded: bool

    def to_json(self) -> dict[str, Any]:
        """The result as JSON values, for the job's record, status and metrics."""
        part = self.part
        return {
            "role": part.role.value,
            "format": part.format,
            "label": part.label,
            "origin": part.origin.value,
            "can_give": part.guarantee.label if part.guarantee is not None else None,
            "runs_with": self.runs_with.label if self.runs_with is not None else None,
            "downgraded": self.downgraded,
            "why": part.why,
        }


@dataclass(frozen=True)
class Verdict:
    """The guarantee a query runs with, as far as the parts judged here go.

    Attributes:
        asked: the job's guarantee.
        allow_downgrade: whether the job accepts less than it asks.
        effective: the weakest of ``asked`` and what every part judged here can give.
            epochal's own parts are not in it: each is checked, and its guarantee recorded,
            by its data source when Spark plans it; the job's guarantee is the weakest of
            this and theirs.
        parts: one result per part, in the order of the plan.
    """

    asked: Guarantee
    allow_downgrade: bool
    effective: Guarantee
    parts: tuple[PartResult, ...]

    def to_json(self) -> dict[str, Any]:
        """The verdict as JSON values, for the job's record, status and metrics."""
        return {
            "asked": self.asked.label,
            "allow_downgrade": self.allow_downgrade,
            "effective": self.effective.label,
            "parts": [result.to_json() for result in self.parts],
        }


def part_records(verdict: Verdict) -> list[PartRecord]:
    """What a run's store keeps of each source and sink judged here (epochal's own parts
    record themselves when planned; static relations count for nothing): the part's
    connector (``spark:kafka``), the guarantee it runs with, its label (where it reads or
    writes, no secrets) as its target, and why it gives what it gives."""
    return [
        PartRecord(
            kind=result.part.role.value,
            part_id=result.part.part_id,
            connector=result.part.connector,
            guarantee=result.runs_with.label,
            contract=result.part.origin.value,
            reason=result.part.why,
            target={"label": result.part.label},
        )
        for result in verdict.parts
        if result.runs_with is not None and result.part.role is not Role.STATIC
    ]


def judge(
    parts: Sequence[PlanPart],
    asked: Guarantee | str,
    *,
    allow_downgrade: bool,
    in_session: bool = False,
) -> Verdict:
    """The guarantee the parts judged here let a job run with.

    Args:
        parts: the query's parts (:attr:`QueryPlan.parts`).
        asked: the job's guarantee.
        allow_downgrade: the job accepts a weaker guarantee than it asks.
        in_session: the query runs in a plain session (its job given in ``epochal.*``
            options): the remedies name those options instead of ``JobConfig``/the CLI.

    Raises:
        GuaranteeError: a part judged here gives less than the job asks and the job does not
            allow the downgrade; the message names every such part, why, and what to do.
    """
    wanted = Guarantee.parse(asked)
    short = below(parts, wanted)
    if short and not allow_downgrade:
        raise GuaranteeError(refusal_message(short, wanted, in_session=in_session))
    for part in short:
        assert part.guarantee is not None
        log.warning(
            "%s can give at most %s (%s), but the job asks for %s: running it %s because the "
            "job allows the downgrade",
            part.name,
            part.guarantee.label,
            part.why,
            wanted.label,
            part.guarantee.label,
        )
    results = tuple(
        PartResult(
            part,
            runs_with=min(wanted, part.guarantee) if part.guarantee is not None else None,
            downgraded=part in short,
        )
        for part in parts
    )
    effective = min([wanted, *(p.guarantee for p in parts if p.guarantee is not None)])
    return Verdict(wanted, allow_downgrade, effective, results)


def below(parts: Sequence[PlanPart], wanted: Guarantee) -> list[PlanPart]:
    """The parts judged here that give less than ``wanted``."""
    return [p for p in parts if p.guarantee is not None and p.guarantee < wanted]


def refusal_message(
    short: Sequence[PlanPart], wanted: Guarantee, *, in_session: bool = False
) -> str:
    """The message of a refusal, in the words of epochal's own parts' refusals."""
    lowest = min(p.guarantee for p in short if p.guarantee is not None)
    reasons = "; ".join(
        f"{p.name} can give at most {p.guarantee.label} ({p.why})"
        for p in short
        if p.guarantee is not None
    )
    if in_session:
        remedies = [
            f"lower the job's guarantee (.option('epochal.guarantee', '{lowest.label}') on "
            "the query's epochal source or sink)",
            "allow the downgrade for the job (.option('epochal.allowDowngrade', 'true'))",
        ]
    else:
        remedies = [
            f"lower the job's guarantee (--guarantee {lowest.label} / "
            f"JobConfig(guarantee='{lowest.label}'))",
            "allow the downgrade for the job (JobConfig(allow_downgrade=True) / --allow-downgrade)",
        ]
    for part in short:
        remedy = _remedy(part, wanted)
        if remedy not in remedies:
            remedies.append(remedy)
    return (
        f"{reasons}; but the job asks for {wanted.label}. Refusing to start. Either "
        f"{', '.join(remedies[:-1])}, or {remedies[-1]}."
    )


def _remedy(part: PlanPart, wanted: Guarantee) -> str:
    """What else can make ``part`` fit a job that asks for ``wanted``."""
    if part.role is Role.SINK and part.format.lower() == "foreachbatch":
        return (
            "declare the foreachBatch function idempotent, if it is, with "
            f".option('{IDEMPOTENT_FOREACH_BATCH}', 'true')"
        )
    if part.role is Role.SOURCE and part.moves_rows_on_replay:
        return _keep_rows_in_place(part.format)
    if part.origin is Origin.PYTHON:
        return (
            f"declare the Python data source's guarantee, if it keeps {wanted.label}, with "
            f"the class attribute {DECLARED_GUARANTEE} = '{wanted.label}'"
        )
    return f"use a {part.role.value} that can give {wanted.label}"


def settled_by_partition(
    sources: tuple[PlanPart, ...], sink: PlanPart, sink_options: Mapping[str, str]
) -> tuple[PlanPart, ...]:
    """The sources, judged again against a sink that settles each Spark partition on its own.

    A source that may give a replayed batch's rows to other Spark partitions (Spark's Kafka
    source lists a topic's partitions in another order when it replays a batch from its
    offset log), with nothing routing them by key on the way, into an epochal sink whose
    :meth:`~epochal_sdk.sinks.Sink.settles_each_partition` is true (the Kafka sink commits each
    partition's transaction in ``prepare``; an idempotent sink's keys are checked per
    partition) can lose or repeat rows on a replay, or fail the key check: it gives at most
    at-least-once there, and says how to keep exactly-once.
    """
    moving = [p for p in sources if p.moves_rows_on_replay and p.guarantee is not None]
    if not moving or sink.origin is not Origin.EPOCHAL:
        return sources
    connector = sink.format[len(EPOCHAL_FORMAT_PREFIX) :]
    if not _settles_each_partition(connector, sink_options):
        return sources
    why = (
        f"a replayed batch may give its records to other Spark partitions than its first "
        f"attempt did, and {sink.label}'s sink settles each Spark partition on its own "
        "(Sink.settles_each_partition); to keep exactly-once, "
        + "; ".join(sorted({_keep_rows_in_place(p.format) for p in moving}))
    )
    return tuple(
        dataclasses.replace(
            p,
            guarantee=min(p.guarantee or Guarantee.AT_LEAST_ONCE, Guarantee.AT_LEAST_ONCE),
            why=why,
        )
        if p in moving
        else p
        for p in sources
    )


_READ_IN_ORDER = {
    "kafka": (
        f", or read the topics with format('{ORDERED_KAFKA_FORMAT}') instead of "
        "format('kafka'): Spark's Kafka source with every batch planned in one order "
        "(epochal.spark.ordered_kafka.jar() on the driver's class path)"
    )
}
"""What else keeps a source that moves rows on replay fit for such a sink, by format."""


def _keep_rows_in_place(fmt: str) -> str:
    """What keeps a replayed batch's rows in their Spark partitions after a source of format
    ``fmt`` that moves them: routing by key, or the source's in-order form where it has one."""
    return (
        "route the rows by key before the sink (.repartition(<column>) or a keyed "
        f"aggregation){_READ_IN_ORDER.get(fmt.lower(), '')}"
    )


def _settles_each_partition(connector: str, options: Mapping[str, str]) -> bool:
    """What the epochal sink ``connector`` says with these writer options: built as the
    runtime builds it on the driver (without Spark's and epochal's own options)."""
    own = registry.SPARK_OWN_OPTIONS
    given = {
        k: v
        for k, v in options.items()
        if not k.lower().startswith(EPOCHAL_FORMAT_PREFIX) and k.lower() not in own
    }
    sink = registry.connector(connector).sink(Options(connector, secrets.resolved(given)))
    try:
        return bool(sink.settles_each_partition())
    finally:
        sink.close()
