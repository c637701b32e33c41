"""A replayable source over a PostgreSQL table or query, read incrementally by monotonic
offset columns (an identity, or a commit timestamp with a tie-breaker)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from epochal_jdbc.db import TableName, connect, spark_type, translate
from epochal_sdk import Guarantee, Offsets, Options, ReplayableSource, SchemaMismatchError, Split
from epochal_sdk.sources import Rows

log = logging.getLogger("epochal.jdbc")

PARTITION = "0"
"""The source has one partition; an offset is the offset columns' values of the last row
read (a JSON list), or None before the first row."""

INTEGER_OIDS = {20, 21, 23}
FETCH_ROWS = 10_000


class JdbcSource(ReplayableSource):
    """Reads the rows of ``table`` (or ``query``) in the order of ``offsetColumns``.

    A batch is the range ``(start, end]`` of the offset columns' values, read in one
    ``REPEATABLE READ`` transaction, so a range is re-read identically as long as rows are
    only appended with growing offsets. Options: ``url``/``dsn``, ``table`` or ``query``,
    ``offsetColumns`` (alias ``orderBy``; comma-separated, together unique and growing),
    ``maxRecordsPerBatch``, ``startingPosition`` (``earliest``, ``latest`` or a JSON list of
    offset values to start after), ``waitForInProgress`` (default true) and
    ``inProgressWaitMs`` (default 5000): see :meth:`latest_offsets`.
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        table = options.str("table", "").strip()
        query = options.str("query", "").strip().rstrip(";")
        if bool(table) == bool(query):
            raise options.error(
                "table",
                "give exactly one of 'table' and 'query'",
                "Set .option('table', '[schema.]table') or .option('query', 'SELECT ...').",
            )
        self.label = str(TableName.parse(table)) if table else f"query {query[:60]!r}"
        self.relation: sql.Composable = (
            TableName.parse(table).sql() if table else sql.SQL("({})").format(sql.SQL(query))
        )
        raw = options.str("offsetColumns", "") or options.str("orderBy", "")
        self.offset_columns = tuple(c.strip() for c in raw.split(",") if c.strip())
        if not self.offset_columns:
            raise options.error(
                "offsetColumns",
                "is required",
                "Name the growing column(s) to read by, e.g. .option('offsetColumns', 'id') "
                "or 'updated_at,id'.",
            )
        self.wait = options.bool("waitForInProgress", True)
        self.wait_s = options.int("inProgressWaitMs", 5000, minimum=0) / 1000.0
        self.start = options.str("startingPosition", "earliest").strip()
        self._conn: Any = None
        self._columns: list[tuple[str, str, bool]] | None = None
        self._offset_types: list[tuple[str, bool]] = []
        self._safe: Any = None

    # -- plumbing ------------------------------------------------------------------------------

    def _db(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.options, at_start=self._columns is None)
        return self._conn

    def _describe(self) -> list[tuple[str, str, bool]]:
        """``(name, spark type, cast to text)`` of the result columns."""
        if self._columns is not None:
            return self._columns
        conn = self._db()
        try:
            cursor = conn.execute(sql.SQL("SELECT * FROM {} AS q LIMIT 0").format(self.relation))
            described = [
                (d.name, *spark_type(d.type_code, d.precision, d.scale)) for d in cursor.description
            ]
            names = [d[0] for d in described]
            missing = [c for c in self.offset_columns if c not in names]
            if missing:
                raise SchemaMismatchError(
                    f"jdbc source {self.label}: offset columns {missing} are not among its "
                    f"columns {names}. Set offsetColumns to growing columns of the result."
                )
            oids = {d.name: d.type_code for d in cursor.description}
            for column in self.offset_columns:
                name = conn.execute("SELECT format_type(%s, NULL)", (oids[column],)).fetchone()[0]
                self._offset_types.append((name, oids[column] in INTEGER_OIDS))
        except psycopg.errors.UndefinedTable:
            raise SchemaMismatchError(
                f"jdbc source {self.label} does not exist in the database. Check 'table' "
                "(schema-qualify it, quote mixed-case names) or 'query'."
            ) from None
        except psycopg.Error as e:
            raise translate(e, TableName(None, self.label), "describing the source") from None
        self._columns = described
        return described

    def _key(self) -> sql.Composable:
        return sql.SQL("({})").format(
            sql.SQL(", ").join(
                sql.SQL("q.{}").format(sql.Identifier(c)) for c in self.offset_columns
            )
        )

    def _key_values(self) -> sql.Composable:
        """The offset columns as stored in offsets (ints as ints, the rest as text)."""
        self._describe()
        return sql.SQL(", ").join(
            sql.SQL("q.{}" if is_int else "q.{}::text").format(sql.Identifier(c))
            for c, (_, is_int) in zip(self.offset_columns, self._offset_types, strict=True)
        )

    def _param(self, position: list[Any]) -> sql.Composable:
        """``(value::type, ...)`` for a position in the WHERE clause."""
        return sql.SQL("({})").format(
            sql.SQL(", ").join(
                sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
                for v, (t, _) in zip(position, self._offset_types, strict=True)
            )
        )

    def _range(self, start: Any, end: Any) -> sql.Composable:
        lower = (
            sql.SQL("TRUE")
            if start is None
            else sql.SQL("{} > {}").format(self._key(), self._param(start))
        )
        return sql.SQL("{} AND {} <= {}").format(lower, self._key(), self._param(end))

    def _query(
        self, statement: sql.Composable, what: str, params: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]:
        try:
            return self._db().execute(statement, params or None).fetchall()
        except psycopg.Error as e:
            raise translate(e, TableName(None, self.label), what) from None

    # -- contract ------------------------------------------------------------------------------

    def schema(self) -> str:
        """The result columns as Spark DDL (types PostgreSQL has and Spark not: as text)."""
        return ", ".join(f"`{name}` {kind}" for name, kind, _ in self._describe())

    def check(self) -> None:
        """Connect, and check that the table or query and the offset columns exist."""
        self._describe()
        if self.start not in ("earliest", "latest"):
            self._position(self.start)

    def partitions(self) -> list[str]:
        """One partition."""
        return [PARTITION]

    def _position(self, text: str) -> list[Any]:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, list) or len(value) != len(self.offset_columns):
            raise self.options.error(
                "startingPosition",
                f"{text!r} is not earliest, latest or a JSON list of "
                f"{len(self.offset_columns)} offset value(s)",
                f"Write e.g. '[1000]' to start after offset columns {list(self.offset_columns)}.",
            )
        return value

    def initial_offsets(self, partitions: Sequence[str]) -> Offsets:
        """Before everything, the current end, or after a given position."""
        if self.start == "earliest":
            return {p: None for p in partitions}
        if self.start == "latest":
            return self.latest_offsets(partitions)
        return {p: self._position(self.start) for p in partitions}

    def latest_offsets(self, partitions: Sequence[str]) -> Offsets:
        """The offset of the newest row that no transaction still running can precede.

        An identity or a timestamp is taken when a row is written, not when it commits: a
        transaction that took id 7 may commit after one that took id 8. Reading up to 8 at
        once would skip 7 forever. So the newest offset M seen in a snapshot S becomes
        readable only once every transaction in progress in S has ended (the oldest running
        transaction id is past S's ``xmax``); until then the previous safe offset is kept
        (waiting at most ``inProgressWaitMs``). ``waitForInProgress=false`` trusts the
        offsets to commit in order (a single writer, or no concurrent writes).
        """
        statement = sql.SQL(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text,"
            " (SELECT json_build_array({values}) FROM {rel} AS q ORDER BY {desc} LIMIT 1)"
        ).format(
            values=self._key_values(),
            rel=self.relation,
            desc=sql.SQL(", ").join(
                sql.SQL("q.{} DESC").format(sql.Identifier(c)) for c in self.offset_columns
            ),
        )
        xmax, newest = self._query(statement, "finding the newest row")[0]
        if newest is not None and any(value is None for value in newest):
            raise self._null_offsets()
        if newest is not None and self.wait:
            deadline = time.monotonic() + self.wait_s
            check = "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s::xid8"
            while not self._query(sql.SQL(check).format(), "waiting", (xmax,))[0][0]:
                if time.monotonic() >= deadline:
                    if self._safe is not None:
                        return {p: self._safe for p in partitions}
                    # A fresh source knows no safe offset below the snapshot's: keep waiting.
                    log.warning(
                        "jdbc source %s: waiting for transactions older than xid %s to end "
                        "(an open or in-doubt prepared transaction holds the source back)",
                        self.label,
                        xmax,
                    )
                    deadline = time.monotonic() + max(self.wait_s, 1.0)
                time.sleep(0.02)
        if newest is not None:
            self._safe = newest
        return {p: self._safe for p in partitions}

    def _null_offsets(self) -> Exception:
        """The error for rows whose offset columns hold NULL: such a row sorts as the newest
        (``DESC`` puts NULLs first) and compares as unknown with every offset, so the source
        would stall on it without a word, and never read it."""
        columns = ", ".join(self.offset_columns)
        nulls = " OR ".join(f"{c} IS NULL" for c in self.offset_columns)
        return self.options.error(
            "offsetColumns",
            f"jdbc source {self.label}: a row has NULL in the offset column(s) {columns}; "
            "offsets must be non-null and growing, and a NULL one can be neither read nor "
            "passed",
            f"Make the column(s) NOT NULL, or read a query that leaves those rows out "
            f"(.option('query', 'SELECT ... WHERE NOT ({nulls})'))",
        )

    def limit(self, start: Offsets, latest: Offsets, max_records: int) -> Offsets:
        """The offset of the ``max_records``-th row after ``start`` (or ``latest``)."""
        end = dict(latest)
        for p, last in latest.items():
            first = start.get(p)
            if last is None or first == last:
                continue
            statement = sql.SQL(
                "SELECT json_build_array({values}) FROM {rel} AS q WHERE {range}"
                " ORDER BY {key} LIMIT 1 OFFSET {skip}"
            ).format(
                values=self._key_values(),
                rel=self.relation,
                range=self._range(first, last),
                key=sql.SQL(", ").join(
                    sql.SQL("q.{}").format(sql.Identifier(c)) for c in self.offset_columns
                ),
                skip=sql.Literal(max_records - 1),
            )
            rows = self._query(statement, "planning a batch")
            if rows:
                end[p] = rows[0][0]
        return end

    def read(self, split: Split) -> Rows:
        """The rows with ``start < offset <= end``, in offset order, from one consistent
        snapshot (``REPEATABLE READ``)."""
        self._describe()
        columns = sql.SQL(", ").join(
            sql.SQL("q.{}::text" if as_text else "q.{}").format(sql.Identifier(name))
            for name, _, as_text in self._describe()
        )
        statement = sql.SQL("SELECT {} FROM {} AS q WHERE {} ORDER BY {}").format(
            columns,
            self.relation,
            self._range(split.start, split.end),
            sql.SQL(", ").join(
                sql.SQL("q.{}").format(sql.Identifier(c)) for c in self.offset_columns
            ),
        )
        conn = self._db()
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                with conn.cursor(name="epochal_read") as cursor:
                    cursor.itersize = FETCH_ROWS
                    cursor.execute(statement)
                    yield from cursor
        except psycopg.Error as e:
            raise translate(
                e, TableName(None, self.label), f"reading ({split.start}, {split.end}]"
            ) from None

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the options, not the connection."""
        return {**self.__dict__, "_conn": None}
