"""Operators' view of a job's in-doubt PostgreSQL transactions, and settling them by hand.

::

    python -m epochal_jdbc.indoubt list   --dsn URL --job NAME --snapshot-dir DIR [--sink-id ID]
    python -m epochal_jdbc.indoubt settle --dsn URL --job NAME --snapshot-dir DIR [--sink-id ID]

``list`` shows every prepared transaction of the job in that database with the decision the
job's snapshot holds for it. ``settle`` does what the job does when it starts: it commits the
decided ones and rolls back the rest (through epochal's own two-phase-commit driver, so the
job's records stay consistent). It refuses while the job runs, unless ``--force``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from epochal_jdbc.db import JdbcError, connect
from epochal_jdbc.sink import JdbcSink
from epochal_sdk import EpochalError, Options, batch_of, transaction_prefix


def _sink(args: argparse.Namespace) -> JdbcSink:
    options = {"url": args.dsn, "table": args.table}
    if args.marker_table:
        options["markerTable"] = args.marker_table
    return JdbcSink(Options("jdbc", options))


def _sink_ids(args: argparse.Namespace, store: Any, sink: JdbcSink) -> list[str]:
    """The job's jdbc sinks: named, recorded in the job's store, or seen in gids."""
    if args.sink_id:
        return [args.sink_id]
    found = set()
    for key in store.list("parts"):
        name = key.rsplit("/", 1)[1]
        if name.startswith("sink-") and store.read_json(key).get("connector") == "jdbc":
            found.add(name[len("sink-") :])
    head = f"ep.{args.job}."
    for prepared in sink.in_doubt(head):
        found.add(prepared.transaction_id[len(head) :].rsplit(".", 4)[0])
    return sorted(found)


def _decided(protocol: Any) -> set[str]:
    ids: set[str] = set()
    if protocol.store is None:
        return ids
    for key in protocol.store.list(f"sinks/{protocol.sink_id}/decisions"):
        ids |= {p.transaction_id for p in protocol.decision(int(key.rsplit("/", 1)[1]))}
    return ids


def _protocols(args: argparse.Namespace, sink: JdbcSink) -> list[Any]:
    from epochal.jobs import JobDirectory
    from epochal.protocols.two_phase import TwoPhaseCommit

    jobdir = JobDirectory(args.snapshot_dir, args.job)
    store = jobdir.store
    return [
        TwoPhaseCommit(store, sink, sink_id, transaction_prefix(args.job, sink_id))
        for sink_id in _sink_ids(args, store, sink)
    ]


def list_in_doubt(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """``(gid, decision, prepared at)`` of every in-doubt transaction of the job."""
    sink = _sink(args)
    try:
        out = []
        with connect(sink.options) as conn:
            prepared_at = dict(
                conn.execute(
                    "SELECT gid, prepared::text FROM pg_prepared_xacts"
                    " WHERE database = current_database()"
                ).fetchall()
            )
        for protocol in _protocols(args, sink):
            decided = _decided(protocol)
            for prepared in protocol._in_doubt():
                gid = prepared.transaction_id
                decision = "decided: commit" if gid in decided else "undecided: roll back"
                out.append((gid, decision, prepared_at.get(gid, "?")))
        return out
    finally:
        sink.close()


def settle(args: argparse.Namespace) -> list[str]:
    """Commit the decided, roll back the rest; return what was done (one line each)."""
    _refuse_if_running(args)
    sink = _sink(args)
    try:
        lines = []
        for protocol in _protocols(args, sink):
            report = protocol.recover()
            lines.append(f"sink {protocol.sink_id}: {report}")
        return lines
    finally:
        sink.close()


def _refuse_if_running(args: argparse.Namespace) -> None:
    from epochal.jobs import LEASE_TTL, JobDirectory, JobError

    jobdir = JobDirectory(args.snapshot_dir, args.job)
    try:
        record = jobdir.load()
    except JobError:
        return  # no job record: nothing can be running it from this directory
    lease = jobdir.lease() or {}
    age = time.time() - float(lease.get("renewed", 0.0))
    if not record.status.finished and age < LEASE_TTL and not args.force:
        raise JdbcError(
            f"job {args.job!r} is {record.status.value} (its lease was renewed {age:.0f}s ago): "
            "settling now would roll back the transactions its tasks are preparing. Suspend "
            "the job first (`epochal jobs suspend`), or pass --force if that process is gone."
        )


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(prog="python -m epochal_jdbc.indoubt", description=__doc__)
    top.add_argument("action", choices=["list", "settle"])
    top.add_argument("--dsn", required=True, help="PostgreSQL URL or libpq string")
    top.add_argument("--job", required=True, help="the job's name")
    top.add_argument("--snapshot-dir", required=True, help="the job's snapshot directory")
    top.add_argument("--sink-id", help="only this sink (default: every jdbc sink of the job)")
    top.add_argument("--table", default="epochal_unknown", help="the sink's table (messages)")
    top.add_argument("--marker-table", help="the sink's markerTable option, if it set one")
    top.add_argument("--force", action="store_true", help="settle even if the job looks alive")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        if args.action == "list":
            rows = list_in_doubt(args)
            if not rows:
                print(f"job {args.job}: no in-doubt transactions")
            for gid, decision, when in rows:
                print(f"{gid}  batch {batch_of(gid)}  prepared {when}  {decision}")
            return 0
        for line in settle(args):
            print(line)
        return 0
    except EpochalError as exc:
        print(f"epochal_jdbc.indoubt: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
