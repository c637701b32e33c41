"""``epochal in-doubt``: an operator's view of a job's prepared transactions, and settling
them by hand, for every transactional sink, through the sink contract alone.

::

    epochal in-doubt list   JOB [--snapshot-dir DIR] [--sink ID] [--connector NAME] [-o K=V]...
    epochal in-doubt settle JOB [--snapshot-dir DIR] [--sink ID] [--connector NAME] [-o K=V]...
                                [--force]

The job's transactional sinks are found in its snapshot store (each run records every part's
connector and options, secrets left out); ``-o`` adds or overrides options (a password),
``--connector`` names the connector of sinks the store does not know (found by their
transaction ids). ``list`` shows every in-doubt transaction (the sink's ``in_doubt``, scope
``inspect``) with the decision the job's snapshot holds for it; ``settle`` does what a run
does when it starts: commit the decided, roll back the rest (the runtime's own two-phase
commit protocol, so the job's records stay consistent). It refuses while the job runs,
unless ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epochal.parts.records import read_parts
from epochal.parts.settling import build_sink, job_incarnation
from epochal_sdk import (
    ConfigError,
    EpochalError,
    RecoveryScope,
    TransactionalSink,
    TransactionId,
)
from epochal_sdk.ids import Purpose, job_head, transaction_prefix

ACTIONS = ("list", "settle")


class InDoubtError(EpochalError):
    """The command cannot do what was asked; the message says why and what to do."""


@dataclass
class SinkOfJob:
    """One transactional sink of the job, built to inspect or settle its transactions.

    Attributes:
        job: the job's name.
        sink_id: the sink's part id.
        connector: its connector's name.
        sink: the sink, built with its recorded options.
        incarnation: the incarnation of the job its transactions belong to (see
            :mod:`epochal_sdk.ids`; "" for the form without one).
        recorded: whether the job's snapshot store records it (then its commit decisions
            there are its own); a sink found only by its transaction ids (of a predecessor
            of the job under the same name, or a job whose snapshots are gone) has none, so
            settling it rolls back everything it left in doubt.
    """

    job: str
    sink_id: str
    connector: str
    sink: TransactionalSink
    incarnation: str = ""
    recorded: bool = True

    @property
    def prefix(self) -> str:
        """Its transactions' prefix (``transaction_prefix``)."""
        return transaction_prefix(self.job, self.sink_id, self.incarnation)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(
        prog="epochal in-doubt",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument(
        "action",
        choices=ACTIONS,
        help="list: show the job's in-doubt transactions and their decisions; settle: commit "
        "the decided ones, roll back the rest",
    )
    top.add_argument("job", help="the job's name")
    top.add_argument(
        "--snapshot-dir",
        default=None,
        help="where the job lives (default: $EPOCHAL_SNAPSHOT_DIR, else ./epochal-snapshots)",
    )
    top.add_argument("--sink", help="only this sink (its part id; default: every one)")
    top.add_argument(
        "--connector",
        help="the connector of sinks the job's store does not record (found by their "
        "transaction ids); default: only the recorded ones",
    )
    top.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a sink option to add or override (e.g. a password, left out of the records); "
        "repeat it for more",
    )
    top.add_argument(
        "--force", action="store_true", help="settle even if the job looks alive (default: off)"
    )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``epochal in-doubt``; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(words)
        if args.action == "list":
            return _list(args)
        return _settle(args)
    except EpochalError as exc:
        print(f"epochal in-doubt: {exc}", file=sys.stderr)
        return 2


# -- the job's sinks ---------------------------------------------------------------------------
def _jobdir(args: argparse.Namespace) -> Any:
    import os

    from epochal.state.jobs import JobDirectory

    snapshot_dir = args.snapshot_dir or os.environ.get(
        "EPOCHAL_SNAPSHOT_DIR", "./epochal-snapshots"
    )
    return JobDirectory(snapshot_dir, args.job)


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    out = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InDoubtError(f"-o {item!r}: write options as KEY=VALUE")
        out[key] = value
    return out


def sinks_of(
    jobdir: Any,
    *,
    only: str | None = None,
    connector: str | None = None,
    overrides: dict[str, str] | None = None,
) -> list[SinkOfJob]:
    """The job's transactional sinks: those its store records (with their recorded options,
    of the job's incarnation), and, with ``connector``, those whose transactions that
    connector's sink finds (of any incarnation of the job's name)."""
    overrides = overrides or {}
    incarnation = job_incarnation(jobdir)
    found: dict[str, SinkOfJob] = {}
    for record in read_parts(jobdir.store).values():
        if record.kind != "sink" or record.contract != "transactional":
            continue
        if only and record.part_id != only:
            continue
        options = {**record.options, **overrides}
        sink = build_sink(record.connector, record.part_id, jobdir.name, options, incarnation)
        recorded = SinkOfJob(jobdir.name, record.part_id, record.connector, sink, incarnation)
        found[recorded.prefix] = recorded
    if connector and not (only and any(f.sink_id == only for f in found.values())):
        options = dict(overrides)
        try:
            probe = build_sink(connector, only or "*", jobdir.name, options)
        except ConfigError:
            if found:  # the recorded sinks are enough; the options name no other one
                return [found[k] for k in sorted(found)]
            raise
        ids = _sink_ids_in_doubt(probe, jobdir.name)
        if only:
            ids = {(i, s) for i, s in ids if s == only} or {(incarnation, only)}
        for inc, sink_id in sorted(ids):
            if transaction_prefix(jobdir.name, sink_id, inc) in found:
                continue
            sink = build_sink(connector, sink_id, jobdir.name, options, inc)
            # of the job's own incarnation, the store's decisions are this sink's (a sink the
            # job ran before it recorded its parts); of an earlier one, they are not
            extra = SinkOfJob(
                jobdir.name, sink_id, connector, sink, inc, recorded=inc == incarnation
            )
            found[extra.prefix] = extra
        probe.close()
        if not ids:  # the connector's sinks of this job have nothing in doubt
            return [found[k] for k in sorted(found)]
    if not found:
        hint = (
            ""
            if connector
            else "; name the connector of its sinks with --connector (and "
            "their options with -o) if the job ran before epochal recorded them, or its "
            "snapshots were deleted"
        )
        raise InDoubtError(f"job {jobdir.name!r}: no transactional sink found{hint}")
    return [found[k] for k in sorted(found)]


def _sink_ids_in_doubt(sink: TransactionalSink, job: str) -> set[tuple[str, str]]:
    """The (incarnation, sink id) pairs in the transaction ids of ``job`` (of any of its
    incarnations) that ``sink`` finds in doubt."""
    raw = sink.in_doubt(RecoveryScope(job_head(job).rstrip("."), "inspect"))
    out = set()
    for prepared in raw:
        txn = TransactionId.parse(prepared.transaction_id)
        if txn is not None and txn.job == job and txn.sink_id and txn.incarnation is not None:
            out.add((txn.incarnation, txn.sink_id))
    return out


def _protocol(jobdir: Any, found: SinkOfJob, purpose: Purpose) -> Any:
    from epochal.protocols.transactions import two_phase_commit

    protocol, _ = two_phase_commit(
        jobdir.store if found.recorded else None,
        found.sink,
        jobdir.name,
        found.sink_id,
        incarnation=found.incarnation,
        run=None,
        purpose=purpose,
    )
    return protocol


# -- the actions -------------------------------------------------------------------------------
def _list(args: argparse.Namespace) -> int:
    from epochal.protocols.transactions import in_doubt

    jobdir = _jobdir(args)
    rows = []
    for found in _sinks(args, jobdir):
        try:
            protocol = _protocol(jobdir, found, "inspect")
            decided = protocol.decided_ids() if found.recorded else set()
            for prepared in in_doubt(found.sink, RecoveryScope(found.prefix, "inspect")):
                txn = TransactionId.of(prepared.transaction_id)
                decision = (
                    "decided: commit"
                    if prepared.transaction_id in decided
                    else "undecided: roll back"
                )
                rows.append(
                    f"{prepared.transaction_id}  batch {txn.batch}  run {txn.run}  "
                    f"sink {found.sink_id} ({found.connector})  {decision}"
                )
        finally:
            found.sink.close()
    if not rows:
        print(f"job {jobdir.name}: no in-doubt transactions")
    for row in rows:
        print(row)
    return 0


def _settle(args: argparse.Namespace) -> int:
    jobdir = _jobdir(args)
    _refuse_if_running(jobdir, args.force)
    for found in _sinks(args, jobdir):
        try:
            report = _protocol(jobdir, found, "recovery").recover()
            print(f"sink {found.sink_id} ({found.connector}): {report}")
        finally:
            found.sink.close()
    return 0


def _sinks(args: argparse.Namespace, jobdir: Any) -> list[SinkOfJob]:
    return sinks_of(
        jobdir,
        only=args.sink,
        connector=args.connector,
        overrides=_overrides(args),
    )


def _refuse_if_running(jobdir: Any, force: bool) -> None:
    from epochal.state.locks import JobError

    try:
        record = jobdir.load()
    except JobError:
        return  # no job record: nothing can be running it from this directory
    lease = jobdir.lease.read()
    live = bool(lease and lease.live)
    if not record.status.finished and live and not force:
        renewed = lease.age() if lease else 0.0
        raise InDoubtError(
            f"job {jobdir.name!r} is {record.status.value} (its lease was renewed "
            f"{renewed:.0f}s ago): settling now would roll back the transactions its tasks are "
            "preparing. Suspend the job first (`epochal jobs suspend`), or pass --force if "
            "that process is gone."
        )
