"""Settling what a job left in doubt when one of its sinks goes away, in one place: before
``jobs cancel`` or ``run --replace`` delete a job's snapshots (:func:`settle_before_deleting`),
when a supervised job is suspended (its snapshots stay), when a plain session's query was
stopped, and at the start of a run whose query no longer has a sink the job's last run wrote to
(:func:`settle_sinks`). Each transactional sink the job's snapshot store records
(:mod:`epochal.parts.records`) is built from its recorded options and settled as
``epochal in-doubt settle`` settles it (commit the decided, roll back the rest); a sink that
cannot be reached is reported, with its transactions, never passed over in silence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epochal.parts.records import read_parts
from epochal_sdk import ConfigError, ConnectorContext, Options, TransactionalSink
from epochal_sdk.ids import transaction_prefix


def build_sink(
    connector: str, sink_id: str, job: str, options: dict[str, str], incarnation: str = ""
) -> TransactionalSink:
    """A sink of the job, to settle or inspect its transactions: built from its recorded
    options (``${env:...}`` references resolved here) with the job's ``incarnation``."""
    from epochal.base import secrets
    from epochal.parts import registry

    context = ConnectorContext(job=job, part_id=sink_id, incarnation=incarnation)
    resolved = secrets.resolved(options)  # ``${env:...}`` references, as the job had them
    sink = registry.connector(connector).sink(Options(connector, resolved, context))
    if not isinstance(sink, TransactionalSink):
        raise ConfigError(
            connector,
            "mode",
            f"sink {sink_id} is not a transactional sink: it leaves nothing in doubt",
            "Name the sink of a transactional part.",
        )
    return sink


def job_incarnation(jobdir: Any) -> str:
    """The incarnation the job's record names ("" without a record, or for a job recorded
    without one)."""
    from epochal.state.locks import JobError

    try:
        return jobdir.load().incarnation
    except JobError:
        return ""


@dataclass(frozen=True)
class Unsettled:
    """A transactional sink of a job whose in-doubt transactions could not be settled.

    Attributes:
        sink_id: the sink's part id.
        connector: its connector's name.
        prefix: what the ids of its transactions start with (every one still prepared is
            ``<prefix>.<batch>.<partition>.<run>.<attempt>``).
        problem: why they could not be settled (the store cannot be reached, an option left
            out of the records, ...).
        decided: the transactions the job's snapshot decided to commit whose commit is not
            recorded as done (the undecided ones are known only to the store).
    """

    sink_id: str
    connector: str
    prefix: str
    problem: str
    decided: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for an operator: the sink, its transactions, why they stay."""
        decided = (
            f"; decided to commit, not yet done: {', '.join(self.decided)}" if self.decided else ""
        )
        return (
            f"sink {self.sink_id} ({self.connector}): its prepared transactions "
            f"{self.prefix}.* could not be settled ({self.problem}){decided}"
        )


def settle_job(jobdir: Any) -> tuple[list[tuple[str, str]], list[Unsettled]]:
    """Settle what the job left in doubt, as ``epochal in-doubt settle`` does (commit the
    decided, roll back the rest), in every transactional sink its snapshot store records,
    with the job's incarnation. For the job's end (``jobs cancel``, ``run --replace``, a
    ``run`` after a cancel): call it before the snapshots (the sinks' records and commit
    decisions) are deleted, and while nothing runs the job.

    Returns:
        What was done (a sink's id and a line saying it), and the sinks that could not be
        settled.
    """
    return settle_sinks(jobdir.store, jobdir.name, job_incarnation(jobdir))


def settle_sinks(
    store: Any,
    job: str,
    incarnation: str,
    *,
    skip: frozenset[str] = frozenset(),
    run: int | None = None,
    fence: Any = None,
) -> tuple[list[tuple[str, str]], list[Unsettled]]:
    """Settle the in-doubt transactions of every transactional sink that ``store`` (a run's
    snapshot store) records, but those in ``skip``: commit the decided, roll back the rest
    (of runs before ``run``, when given: the run asking; else of every run).

    Returns:
        What was done (a sink's id and a line saying it), and the sinks that could not be
        settled.
    """
    from epochal.protocols.transactions import two_phase_commit

    done: list[tuple[str, str]] = []
    unsettled: list[Unsettled] = []
    for record in sorted(read_parts(store).values(), key=lambda r: r.part_id):
        if record.kind != "sink" or record.contract != "transactional" or record.part_id in skip:
            continue
        prefix = transaction_prefix(job, record.part_id, incarnation)
        try:
            sink = build_sink(record.connector, record.part_id, job, record.options, incarnation)
        except Exception as exc:  # unreachable, an option left out: reported, never hidden
            unsettled.append(_unsettled(store, record.part_id, record.connector, prefix, exc))
            continue
        try:
            extra = {"fence": fence} if fence is not None else {}
            protocol, _ = two_phase_commit(
                store, sink, job, record.part_id, incarnation=incarnation, run=run, **extra
            )
            report = protocol.recover()
            done.append((record.part_id, f"sink {record.part_id} ({record.connector}): {report}"))
        except Exception as exc:
            unsettled.append(_unsettled(store, record.part_id, record.connector, prefix, exc))
        finally:
            sink.close()
    return done, unsettled


def _unsettled(store: Any, sink_id: str, connector: str, prefix: str, exc: Exception) -> Unsettled:
    from epochal.protocols.two_phase import pending_decisions

    problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
    try:
        decided = tuple(pending_decisions(store, sink_id))
    except Exception:  # the store's own trouble: the prefix alone says what is left
        decided = ()
    return Unsettled(sink_id, connector, prefix, problem, decided)


def settle_before_deleting(
    jobdir: Any, doing: str, force: bool, report: Any = None, retry: str = ""
) -> None:
    """Settle what the job left in doubt before ``doing`` deletes its snapshots
    (:func:`settle_job`); each sink's outcome goes to ``report``. When a sink cannot be
    settled, refuse (:class:`~epochal.state.locks.JobError`) with the transactions left, the
    command that settles them and ``retry`` (how to do ``doing`` again); with ``force``, go
    on and say what stays prepared and how to settle it later."""
    from epochal.state.locks import JobError

    done, unsettled = settle_job(jobdir)
    for _, line in done:
        if report is not None:
            report(f"[{jobdir.name}] {doing}: settled {line}")
    if not unsettled:
        return
    where = f"{jobdir.name} --snapshot-dir {jobdir.snapshot_dir}"
    listed = "\n".join(f"  - {u.describe()}" for u in unsettled)
    if not force:
        commands = "\n".join(
            f"  python -m epochal in-doubt settle {where} --sink {u.sink_id} [-o KEY=VALUE ...]"
            for u in unsettled
        )
        raise JobError(
            f"job {jobdir.name!r}: refusing to {doing}: it would delete the job's snapshots "
            f"(its sinks' records and commit decisions) while transactions are left in doubt:\n"
            f"{listed}\nSettle them first (-o gives options left out of the records, such as a "
            f"password; the store must be reachable):\n{commands}\nthen {retry or doing} "
            "again; or pass --force to go on and leave them prepared."
        )
    connectors = sorted({u.connector for u in unsettled})
    later = "\n".join(
        f"  python -m epochal in-doubt settle {where} --connector {c} -o KEY=VALUE ..."
        for c in connectors
    )
    if report is not None:
        report(
            f"[{jobdir.name}] {doing} (--force): these stay prepared in their stores, holding "
            f"what they staged (and, in a database, their locks):\n{listed}\nOnce the stores "
            f"can be reached, settle them by their ids (every option of the sink given with -o):"
            f"\n{later}"
        )
