"""A sink that upserts records into a map, idempotently or in two-phase-commit transactions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from epochal_map.store import MapStore, MapTarget
from epochal_sdk import (
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    IdempotentWriter,
    Options,
    PoisonRecordError,
    Prepared,
    RecoveryScope,
    Schema,
    SchemaMismatchError,
    Transaction,
    TransactionalSink,
    TransactionId,
)

if TYPE_CHECKING:
    import pyarrow

FLUSH_ROWS = 50_000
"""An idempotent writer writes its buffer once it holds this many records."""

MODES = ("idempotent", "transactional")
KEEP_SETTLED_BATCHES = 1000
"""Batches for which the map's file keeps the records of settled transactions (a late prepare
or commit of a zombie's id is refused while they are kept; the runtime completes no batch
older than its decisions' retention, 100 batches)."""
PRUNE_EVERY = 10
"""Batches between two prunings of settled transactions' records."""


def to_text(value: Any) -> str:
    """A column value as map text: strings as they are, None as ``null``, lists and dicts as
    JSON, anything else with ``str()``."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


class MapSink(TransactionalSink, IdempotentSink):
    """Writes records to a map as ``key -> value`` entries, journaling every write.

    Options: ``path``, ``map`` (required), ``partitions`` (used when the map is created),
    ``keyColumn`` (default ``key``), ``valueColumn`` (default ``value``; when the records have
    no such column the value is a JSON object of every non-key column), ``mode``
    (``idempotent``: upsert by key; ``transactional``: two-phase commit).
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.target = MapTarget.from_options(options)
        self.key_column = options.str("keyColumn", "key")
        self.value_column = options.str("valueColumn", "value")
        self.mode = options.choice("mode", "idempotent", MODES)

    @property
    def store(self) -> MapStore:
        """The map store, opened on first use."""
        return self.target.store

    def sink_mode(self) -> str:
        """Which contract the runtime drives: ``idempotent`` or ``transactional``."""
        return self.mode

    def check(self, schema: Schema) -> None:
        """Fail if the key column (or an explicitly named value column) is missing; create the
        map so that readers can start before the first write."""
        names = [f.name for f in schema]
        wanted = [("keyColumn", self.key_column)]
        if "valueColumn" in self.options:
            wanted.append(("valueColumn", self.value_column))
        for option, column in wanted:
            if column not in names:
                raise SchemaMismatchError(
                    f"map sink: column {column!r} ({option}) is not among the columns "
                    f"{names} written to map {self.target.map!r} in {self.target.path}. "
                    f"Set .option({option!r}, ...) to one of them or add the column."
                )
        self.store.create_map(self.target.map)

    def to_items(self, batch: pyarrow.RecordBatch, first_row: int = 0) -> list[tuple[str, str]]:
        """The ``(key, value)`` items of a batch; ``first_row`` numbers rows in errors."""
        items = []
        for index, row in enumerate(batch.to_pylist(), start=first_row):
            key = row.get(self.key_column)
            if key is None:
                raise PoisonRecordError(
                    f"map sink: row {index} of this task has a null {self.key_column!r}, and "
                    f"map {self.target.map!r} needs a key. Filter out or fill null keys."
                )
            if self.value_column in row:
                value = row[self.value_column]
            else:
                value = {c: v for c, v in row.items() if c != self.key_column}
            items.append((to_text(key), to_text(value)))
        return items

    def key_columns(self) -> tuple[str, ...]:
        """The key column."""
        return (self.key_column,)

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        """An upserting writer for one task."""
        return MapWriter(self)

    def begin(self, task: ConnectorContext) -> Transaction:
        """The transaction ``task.transaction_id`` of one task."""
        return MapTransaction(self, str(task.txn))

    def _data(self) -> dict[str, str]:
        return {"path": self.target.path, "map": self.target.map}

    def commit(self, prepared: Prepared) -> None:
        """Apply a prepared transaction (idempotent). Every :data:`PRUNE_EVERY` batches the
        records of transactions settled more than :data:`KEEP_SETTLED_BATCHES` batches ago
        are deleted: the file keeps a bounded number of them however long the job runs."""
        self.store.commit_staged(prepared.transaction_id)
        txn = TransactionId.of(prepared.transaction_id)
        if txn.batch % PRUNE_EVERY == 0 and txn.partition == 0:
            self.store.forget_settled(txn.prefix + ".", txn.batch - KEEP_SETTLED_BATCHES)

    def rollback(self, prepared: Prepared) -> None:
        """Drop a prepared transaction (idempotent)."""
        self.store.rollback_staged(prepared.transaction_id)

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        """The staged transactions of the map's file in ``scope`` (the same for every
        purpose: looking has no side effect)."""
        return [Prepared(t, self._data()) for t in self.store.in_doubt(scope.head)]

    def close(self) -> None:
        """Close the store."""
        self.target.close()


class _Buffered:
    """Converts and buffers a task's records."""

    def __init__(self, sink: MapSink) -> None:
        self.sink = sink
        self.items: list[tuple[str, str]] = []
        self.rows = 0

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Convert and buffer these records."""
        self.items += self.sink.to_items(batch, self.rows)
        self.rows += batch.num_rows

    def close(self) -> None:
        """Drop the buffer."""
        self.items = []


class MapWriter(_Buffered, IdempotentWriter):
    """Upserts one task's records; a replay writes the same values again."""

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Buffer these records; write the buffer once it is large."""
        super().write(batch)
        if len(self.items) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records in one SQLite transaction."""
        if self.items:
            self.sink.store.put_all(self.sink.target.map, self.items)
        self.items = []


class MapTransaction(_Buffered, Transaction):
    """One task's transaction: buffered, staged durably by ``prepare``, applied by commit."""

    def __init__(self, sink: MapSink, transaction_id: str) -> None:
        super().__init__(sink)
        self.transaction_id = transaction_id

    def prepare(self) -> dict[str, str]:
        """Stage the records durably and invisibly; return where they are."""
        self.sink.store.stage(self.transaction_id, self.sink.target.map, self.items)
        self.items = []
        return self.sink._data()

    def abort(self) -> None:
        """Drop the buffer and anything staged; a late prepare of this id is then refused."""
        self.items = []
        self.sink.store.rollback_staged(self.transaction_id)
