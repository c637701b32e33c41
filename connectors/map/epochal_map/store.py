"""A durable key-value map with an event journal, kept in one local SQLite file.

Several maps share a file. Every change to an entry appends an event to the map's journal in
the same SQLite transaction, so the journal has no gaps and readers only see committed events.
The journal is split into a fixed number of partitions by ``crc32(key) % partitions``; each
partition numbers its events densely from 0.

Writing a key with the value it already has still appends an event: replaying a batch into the
map leaves the entries unchanged but duplicates journal events.

Two-phase commit: :meth:`MapStore.stage` durably stages a transaction's rows (phase 1) and
:meth:`MapStore.commit_staged` applies them (phase 2); both survive crashes and restarts.

The file may be written by several processes at once: every write takes SQLite's write lock
up front (``BEGIN IMMEDIATE``) and waits up to 60 s for it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from epochal_sdk import ConfigError, EpochalError, Options, RestartableError, TransactionId

BUSY_TIMEOUT_S = 60
PATH_ENV = "EPOCHAL_MAP_PATH"
DEFAULT_FILE = "epochal-map.sqlite"

PREPARED, COMMITTED, ROLLED_BACK = "prepared", "committed", "rolled_back"

Event = tuple[int, str, str, int]
"""A journal event as read: ``(sequence, key, value, event_time)``, the time in microseconds
since the epoch (UTC)."""

_TABLES = (
    "CREATE TABLE IF NOT EXISTS maps (name TEXT PRIMARY KEY, partitions INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS entries (map TEXT NOT NULL, key TEXT NOT NULL,"
    " value TEXT NOT NULL, PRIMARY KEY (map, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS journal (map TEXT NOT NULL, partition INTEGER NOT NULL,"
    " sequence INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,"
    " event_time INTEGER NOT NULL, PRIMARY KEY (map, partition, sequence)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS txns (txn_id TEXT PRIMARY KEY, map TEXT,"
    " state TEXT NOT NULL, updated INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS staged (txn_id TEXT NOT NULL, ordinal INTEGER NOT NULL,"
    " key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (txn_id, ordinal)) WITHOUT ROWID",
)


class MapStoreError(EpochalError):
    """The store refuses an operation: an unknown or rolled-back transaction."""


def partition_of(key: str, partitions: int) -> int:
    """The journal partition of ``key`` in a map of ``partitions`` partitions."""
    return zlib.crc32(key.encode()) % partitions


def _now_us() -> int:
    return time.time_ns() // 1000


def _checked(items: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"map keys and values must be str, got {key!r}: {value!r}")
        yield key, value


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode = WAL``. Two processes creating the same new file at once can
    get "database is locked" from it at once, without SQLite's busy handler: retry then,
    within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class MapStore:
    """Named maps with event journals in the SQLite file ``path``.

    One connection per object; make one object per process (or per task). ``partitions`` is
    the partition count of maps this object creates; a map keeps the count it was created with.
    """

    def __init__(self, path: str | os.PathLike[str], partitions: int = 4) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        self.path = os.fspath(path)
        self.partitions = partitions
        self._lock = threading.RLock()
        with self._guard():
            self._conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
            _switch_to_wal(self._conn)
            self._conn.execute("PRAGMA synchronous = FULL")
        with self._transaction() as conn:
            for statement in _TABLES:
                conn.execute(statement)

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Hold the object's lock; turn a lock wait that timed out into a restartable error."""
        with self._lock:
            try:
                yield
            except sqlite3.OperationalError as e:
                if "locked" in str(e) or "busy" in str(e):
                    raise RestartableError(
                        f"map store {self.path} stayed locked by another process for "
                        f"{BUSY_TIMEOUT_S} s ({e})"
                    ) from e
                raise

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding SQLite's write lock from its start."""
        with self._guard():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self._guard():
            return self._conn.execute(sql, params).fetchall()

    def _ensure_map(self, conn: sqlite3.Connection, map: str) -> int:
        conn.execute("INSERT OR IGNORE INTO maps VALUES (?, ?)", (map, self.partitions))
        return conn.execute("SELECT partitions FROM maps WHERE name = ?", (map,)).fetchone()[0]

    def _apply(self, conn: sqlite3.Connection, map: str, items: Iterable[tuple[str, str]]) -> None:
        """Upsert ``items`` and append one journal event each, inside ``conn``'s transaction."""
        partitions = self._ensure_map(conn, map)
        now = _now_us()
        next_sequence: dict[int, int] = {}
        for key, value in _checked(items):
            partition = partition_of(key, partitions)
            if partition not in next_sequence:
                next_sequence[partition] = self._end(conn, map, partition)
            conn.execute(
                "INSERT INTO entries VALUES (?, ?, ?)"
                " ON CONFLICT (map, key) DO UPDATE SET value = excluded.value",
                (map, key, value),
            )
            conn.execute(
                "INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?)",
                (map, partition, next_sequence[partition], key, value, now),
            )
            next_sequence[partition] += 1

    @staticmethod
    def _end(conn: sqlite3.Connection, map: str, partition: int) -> int:
        row = conn.execute(
            "SELECT max(sequence) FROM journal WHERE map = ? AND partition = ?", (map, partition)
        ).fetchone()
        return 0 if row[0] is None else row[0] + 1

    # -- maps and entries ---------------------------------------------------------------------

    def create_map(self, map: str) -> int:
        """Create ``map`` if it does not exist; return its partition count."""
        with self._transaction() as conn:
            return self._ensure_map(conn, map)

    def partition_count(self, map: str) -> int | None:
        """The partition count of ``map``, or None if the map does not exist."""
        rows = self._query("SELECT partitions FROM maps WHERE name = ?", map)
        return rows[0][0] if rows else None

    def put(self, map: str, key: str, value: str) -> None:
        """Set ``key`` to ``value`` and journal the change (creates the map if needed)."""
        self.put_all(map, [(key, value)])

    def put_all(self, map: str, items: Iterable[tuple[str, str]]) -> None:
        """Set every ``(key, value)`` in order, in one transaction, journaling each change."""
        with self._transaction() as conn:
            self._apply(conn, map, items)

    def append_events(self, map: str, items: Iterable[tuple[str, str]]) -> None:
        """Same as :meth:`put_all`: the way to fill a journal in a demo or a test."""
        self.put_all(map, items)

    def get(self, map: str, key: str) -> str | None:
        """The value of ``key``, or None."""
        rows = self._query("SELECT value FROM entries WHERE map = ? AND key = ?", map, key)
        return rows[0][0] if rows else None

    def entries(self, map: str) -> dict[str, str]:
        """Every entry of ``map``."""
        return dict(self._query("SELECT key, value FROM entries WHERE map = ?", map))

    # -- journal -----------------------------------------------------------------------------

    def journal_partitions(self, map: str) -> list[int]:
        """The journal partitions of ``map`` (empty if the map does not exist)."""
        return list(range(self.partition_count(map) or 0))

    def journal_end(self, map: str, partition: int) -> int:
        """The sequence the next event of this partition will get (its event count)."""
        with self._guard():
            return self._end(self._conn, map, partition)

    def journal_read(self, map: str, partition: int, start: int, end: int) -> list[Event]:
        """The committed events with ``start <= sequence < end``, ordered by sequence."""
        return self._query(
            "SELECT sequence, key, value, event_time FROM journal WHERE map = ?"
            " AND partition = ? AND sequence >= ? AND sequence < ? ORDER BY sequence",
            map,
            partition,
            start,
            end,
        )

    # -- two-phase commit --------------------------------------------------------------------

    def _state(self, conn: sqlite3.Connection, txn_id: str) -> tuple[str | None, str] | None:
        return conn.execute("SELECT map, state FROM txns WHERE txn_id = ?", (txn_id,)).fetchone()

    def _settle(self, conn: sqlite3.Connection, txn_id: str, state: str) -> None:
        conn.execute("DELETE FROM staged WHERE txn_id = ?", (txn_id,))
        conn.execute(
            "INSERT INTO txns VALUES (?, NULL, ?, ?)"
            " ON CONFLICT (txn_id) DO UPDATE SET state = excluded.state,"
            " updated = excluded.updated",
            (txn_id, state, _now_us()),
        )

    def stage(self, txn_id: str, map: str, items: Iterable[tuple[str, str]]) -> None:
        """Phase 1: store ``items`` durably, invisible, and mark ``txn_id`` prepared, in one
        transaction. Staging a prepared id again replaces its rows; a settled id is refused."""
        with self._transaction() as conn:
            known = self._state(conn, txn_id)
            if known is not None and known[1] != PREPARED:
                raise MapStoreError(
                    f"transaction {txn_id!r} is already {known[1]} in {self.path}; it cannot "
                    "be prepared again. A task attempt with this id was settled: this writer "
                    "is a zombie and must stop."
                )
            self._ensure_map(conn, map)
            conn.execute("DELETE FROM staged WHERE txn_id = ?", (txn_id,))
            conn.executemany(
                "INSERT INTO staged VALUES (?, ?, ?, ?)",
                ((txn_id, i, k, v) for i, (k, v) in enumerate(_checked(items))),
            )
            conn.execute(
                "INSERT INTO txns VALUES (?, ?, ?, ?) ON CONFLICT (txn_id) DO UPDATE"
                " SET map = excluded.map, state = excluded.state, updated = excluded.updated",
                (txn_id, map, PREPARED, _now_us()),
            )

    def commit_staged(self, txn_id: str) -> None:
        """Phase 2: apply a prepared transaction to the entries and the journal, in one
        transaction. Committing a committed transaction does nothing."""
        with self._transaction() as conn:
            known = self._state(conn, txn_id)
            if known is None:
                raise MapStoreError(
                    f"transaction {txn_id!r} is unknown in {self.path}: it was never prepared "
                    "in this file. Check that the 'path' option still names the file the job "
                    "wrote to."
                )
            map, state = known
            if state == COMMITTED:
                return
            if state == ROLLED_BACK:
                raise MapStoreError(
                    f"transaction {txn_id!r} was rolled back in {self.path} and cannot be "
                    "committed. Restart the job from its last snapshot to write the batch again."
                )
            assert map is not None  # a prepared transaction names its map
            items = conn.execute(
                "SELECT key, value FROM staged WHERE txn_id = ? ORDER BY ordinal", (txn_id,)
            ).fetchall()
            self._apply(conn, map, items)
            self._settle(conn, txn_id, COMMITTED)

    def rollback_staged(self, txn_id: str) -> None:
        """Drop a prepared transaction's rows and mark it rolled back. Settled ids do nothing;
        an unknown id is recorded as rolled back so that a late prepare or commit is refused."""
        with self._transaction() as conn:
            known = self._state(conn, txn_id)
            if known is None or known[1] == PREPARED:
                self._settle(conn, txn_id, ROLLED_BACK)

    def transaction_state(self, txn_id: str) -> str | None:
        """``prepared``, ``committed``, ``rolled_back``, or None for an unknown id."""
        rows = self._query("SELECT state FROM txns WHERE txn_id = ?", txn_id)
        return rows[0][0] if rows else None

    def forget_settled(self, prefix: str, before_batch: int) -> int:
        """Delete the records of settled transactions of ``prefix`` whose batch is before
        ``before_batch`` (ids in :class:`~epochal_sdk.TransactionId` form); returns how many.
        A settled record refuses a zombie's late prepare or commit of its id: it is kept for
        as long as the runtime may still complete a batch (its decisions' retention)."""
        rows = self._query(
            "SELECT txn_id FROM txns WHERE state != ? AND substr(txn_id, 1, ?) = ?",
            PREPARED,
            len(prefix),
            prefix,
        )
        old = []
        for (txn_id,) in rows:
            txn = TransactionId.parse(txn_id)
            if txn is not None and txn.batch < before_batch:
                old.append((txn_id,))
        if old:
            with self._transaction() as conn:
                conn.executemany("DELETE FROM txns WHERE txn_id = ? AND state != 'prepared'", old)
        return len(old)

    def in_doubt(self, prefix: str) -> list[str]:
        """The ids of prepared, unsettled transactions that start with ``prefix``, sorted."""
        return [
            row[0]
            for row in self._query(
                "SELECT txn_id FROM txns WHERE state = ? AND substr(txn_id, 1, ?) = ?"
                " ORDER BY txn_id",
                PREPARED,
                len(prefix),
                prefix,
            )
        ]

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection. The object cannot be used afterwards."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> MapStore:
        """Use the store in a ``with`` block that closes it."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()


@dataclass
class MapTarget:
    """The ``path``, ``map`` and ``partitions`` options of a source or sink, and its store.

    The store is opened on first use and is not pickled: Spark ships sources and sinks to its
    tasks, and every task opens its own connection.
    """

    path: str
    map: str
    partitions: int
    _store: MapStore | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_options(cls, options: Options) -> MapTarget:
        """Read the options (no I/O). ``path`` defaults to ``$EPOCHAL_MAP_PATH``, then to
        ``epochal-map.sqlite`` in the working directory."""
        default = os.environ.get(PATH_ENV) or DEFAULT_FILE
        return cls(
            path=os.path.abspath(options.str("path", default).strip() or default),
            map=options.required("map", "Set .option('map', '<name>') to the map to use."),
            partitions=options.int("partitions", 4, minimum=1),
        )

    @property
    def store(self) -> MapStore:
        """The open store (opened now if needed)."""
        if self._store is None:
            try:
                self._store = MapStore(self.path, self.partitions)
            except sqlite3.Error as e:
                raise ConfigError(
                    "map",
                    "path",
                    f"cannot open the SQLite file {self.path} ({e})",
                    "Give the path of a writable SQLite file in an existing directory.",
                ) from e
        return self._store

    def close(self) -> None:
        """Close the store if it is open."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the options, not the open connection."""
        return {**self.__dict__, "_store": None}
