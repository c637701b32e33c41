"""Transactions staged by hand, for tests of what a runtime does with prepared ones
(recovery, the in-doubt command): the one way to write and prepare a task's transaction
outside Spark, exactly as a task does."""

from __future__ import annotations

from typing import Any

from epochal_sdk import ConnectorContext, Prepared, TransactionalSink


def prepare_transaction(sink: TransactionalSink, task: ConnectorContext, records: Any) -> Prepared:
    """Write ``records`` (an Arrow record batch) in ``task``'s transaction of ``sink`` and
    prepare it, leaving it undecided: what the runtime finds after a crash between a task's
    prepare and the driver's decision."""
    transaction = sink.begin(task)
    try:
        transaction.write(records)
        data = transaction.prepare()
    finally:
        transaction.close()
    return Prepared(str(task.txn), data)
