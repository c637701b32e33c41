"""The PostgreSQL sink: two-phase commit (``PREPARE TRANSACTION``), idempotent upsert
(``INSERT ... ON CONFLICT DO UPDATE``) or plain at-least-once inserts."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
from psycopg import sql

from epochal_jdbc.db import (
    GID_MAX,
    JdbcError,
    TableName,
    checkout,
    compatible,
    connect,
    is_transient,
    pg_type,
    release,
    translate,
)
from epochal_sdk import (
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    IdempotentWriter,
    Options,
    Prepared,
    RecoveryScope,
    RestartableError,
    Schema,
    SchemaMismatchError,
    Transaction,
    TransactionalSink,
    TransactionId,
)
from epochal_sdk.ids import batch_of

if TYPE_CHECKING:
    import pyarrow as pa
    from psycopg import Connection

log = logging.getLogger("epochal.jdbc")

MODES = ("transactional", "idempotent", "plain")
MARKER_TABLE = "epochal_commits"
"""Default name of the table (in the target's schema) that records committed transactions."""
KEEP_MARKER_BATCHES = 1000
"""Commit markers of batches older than this many batches are deleted."""
ORDINAL = "_epochal_ordinal"


class JdbcSink(TransactionalSink, IdempotentSink):
    """Writes records into a PostgreSQL table.

    Options: ``url`` (or ``dsn``), ``user``, ``password``, ``table`` (required, may be
    schema-qualified), ``mode`` (``transactional``: two-phase commit, exactly-once;
    ``idempotent``: upsert on ``keyColumns``, exactly-once for keyed results; ``plain``:
    inserts committed by the task, at-least-once), ``keyColumns`` (required in idempotent
    mode), ``createTable`` (create a missing table from the records' schema),
    ``markerTable`` (where transactional mode records committed transaction ids; default
    ``epochal_commits`` in the table's schema), ``connectTimeout`` (seconds).
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.table = TableName.parse(
            options.required("table", "Set .option('table', '[schema.]table') to write to.")
        )
        self.mode = options.choice("mode", "transactional", MODES)
        self.create_table = options.bool("createTable", False)
        self.keys = tuple(k.strip() for k in options.str("keyColumns", "").split(",") if k.strip())
        if self.mode == "idempotent" and not self.keys:
            raise options.error(
                "keyColumns",
                "is required in mode 'idempotent'",
                "Set .option('keyColumns', 'col1,col2') to columns with a unique index.",
            )
        marker = options.str("markerTable", "").strip()
        self.marker = (
            TableName.parse(marker, "markerTable") if marker else self.table.sibling(MARKER_TABLE)
        )
        self.reason = ""
        self._conn: Connection[Any] | None = None
        self._reused = False

    # -- driver side -----------------------------------------------------------------------

    def sink_mode(self) -> str:
        """Which contract the runtime drives (``plain`` is the transactional contract with
        the commit done in the task)."""
        return "idempotent" if self.mode == "idempotent" else "transactional"

    def max_guarantee(self) -> Guarantee:
        """At-least-once in ``plain`` mode, and in ``transactional`` mode on a server with
        ``max_prepared_transactions = 0`` (see :attr:`reason`); exactly-once otherwise."""
        if self.mode == "plain":
            self.reason = "mode 'plain' commits in the tasks"
            return Guarantee.AT_LEAST_ONCE
        if self.mode == "idempotent":
            return Guarantee.EXACTLY_ONCE
        shown = self._execute("SHOW max_prepared_transactions", at_start=True).fetchone()
        allowed = int(shown[0]) if shown else 0
        if allowed == 0:
            self.reason = (
                f"table {self.table}: the server has max_prepared_transactions = 0, so "
                "PREPARE TRANSACTION is disabled; set it above the number of concurrent "
                "write tasks (server restart needed) for exactly-once, or use "
                "mode 'idempotent' with keyColumns"
            )
            log.warning("jdbc sink: at most at-least-once: %s", self.reason)
            return Guarantee.AT_LEAST_ONCE
        return Guarantee.EXACTLY_ONCE

    def guarantee_reason(self) -> str:
        """Why :meth:`max_guarantee` is below exactly-once (empty when it is not)."""
        return self.reason

    def check(self, schema: Schema) -> None:
        """Before the job runs: the table exists (or is created with ``createTable``), every
        record column is a column of a compatible type, required columns are written, the key
        has a unique index (idempotent) and the marker table exists (transactional)."""
        self._check_gid_length()
        with connect(self.options, at_start=True) as conn:
            columns = self._columns(conn, self.table)
            if columns is None:
                if not self.create_table:
                    raise SchemaMismatchError(
                        f"jdbc: table {self.table} does not exist in the database. Create it, "
                        "or set .option('createTable', 'true') to create it from the records' "
                        f"columns ({', '.join(f'{f.name} {f.type}' for f in schema)})."
                    )
                self._create(conn, schema)
                columns = self._columns(conn, self.table) or {}
            self._check_columns(schema, columns)
            if self.mode == "idempotent":
                self._check_key(conn, schema)
            if self.mode == "transactional":
                self._create_marker_table(conn)

    def _check_gid_length(self) -> None:
        """The job's transaction ids fit PostgreSQL's gids: the prefix (job and sink id, from
        the context) and room for batch, partition, run and attempt (40 bytes)."""
        prefix = self.context.transaction_prefix
        if len(prefix.encode()) + 40 > GID_MAX:
            raise self.options.error(
                "epochal.id",
                f"transaction ids of this sink ({prefix}.<batch>.<partition>.<run>.<attempt>) "
                f"would not fit PostgreSQL's {GID_MAX}-byte prepared transaction ids",
                "Use a shorter job name, or a short .option('epochal.id', ...) for the sink.",
            )

    @staticmethod
    def _columns(
        conn: Connection[Any], table: TableName
    ) -> dict[str, tuple[str, str, bool]] | None:
        """``name -> (type name, type category, required)`` of an existing table, else None."""
        found = conn.execute(
            "SELECT to_regclass(%s)::oid", (table.sql().as_string(conn),)
        ).fetchone()
        regclass = found[0] if found else None
        if regclass is None:
            return None
        rows = conn.execute(
            "SELECT a.attname, t.typname, t.typcategory,"
            " a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''"
            " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped",
            (regclass,),
        ).fetchall()
        return {name: (typname, category, required) for name, typname, category, required in rows}

    def _create(self, conn: Connection[Any], schema: Schema) -> None:
        parts = [
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(pg_type(f.type)))
            + sql.SQL("" if f.nullable or f.name in self.keys else " NOT NULL")
            for f in schema
        ]
        if self.mode == "idempotent":
            keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.keys)
            parts.append(sql.SQL("PRIMARY KEY ({})").format(keys))
        statement = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.table.sql(), sql.SQL(", ").join(parts)
        )
        try:
            conn.execute(statement)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # created concurrently by another job
        except psycopg.Error as e:
            raise translate(e, self.table, "createTable") from None
        log.info("jdbc sink: created table %s", self.table)

    def _check_columns(self, schema: Schema, columns: dict[str, tuple[str, str, bool]]) -> None:
        problems = []
        for f in schema:
            if f.name not in columns:
                problems.append(f"column {f.name!r} ({f.type}) is missing")
            elif not compatible(f.type, columns[f.name][1], columns[f.name][0]):
                problems.append(
                    f"column {f.name!r} is {columns[f.name][0]} but the records hold {f.type}"
                )
        written = {f.name for f in schema}
        for name, (typname, _, required) in sorted(columns.items()):
            if required and name not in written:
                problems.append(f"column {name!r} ({typname}) is NOT NULL without a default")
        if problems:
            raise SchemaMismatchError(
                f"jdbc: table {self.table} does not fit the records: {'; '.join(problems)}. "
                f"The table has {sorted(columns)}, the records {sorted(written)}. Alter the "
                "table or select/rename the columns written (names are case-sensitive)."
            )

    def _check_key(self, conn: Connection[Any], schema: Schema) -> None:
        regclass = self.table.sql().as_string(conn)
        indexes = conn.execute(
            "SELECT i.indisprimary, array_agg(a.attname::text ORDER BY a.attname)"
            " FROM pg_index i JOIN pg_attribute a"
            "  ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)"
            " WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indisvalid"
            "  AND i.indpred IS NULL AND i.indexprs IS NULL"
            " GROUP BY i.indexrelid, i.indisprimary",
            (regclass,),
        ).fetchall()
        if not any(set(cols) == set(self.keys) for _, cols in indexes):
            raise SchemaMismatchError(
                f"jdbc: table {self.table} has no unique index on exactly the key columns "
                f"{list(self.keys)} (unique indexes: {[c for _, c in indexes] or 'none'}), so "
                "an upsert cannot find the row to replace. Create one: CREATE UNIQUE INDEX ON "
                f"{self.table} ({', '.join(self.keys)}), or set keyColumns to such columns."
            )
        missing = [k for k in self.keys if k not in {f.name for f in schema}]
        if missing:
            raise SchemaMismatchError(
                f"jdbc: table {self.table}: the key columns {missing} are not among the "
                f"records' columns {[f.name for f in schema]}. Write them, or change keyColumns."
            )
        self._check_key_not_null(conn, regclass)

    def _check_key_not_null(self, conn: Connection[Any], regclass: str) -> None:
        """Refuse key columns that may hold NULL: a unique index (unless it is
        ``NULLS NOT DISTINCT``) never finds a row whose key is NULL, so every replay of a
        record with a NULL key would insert it again, a duplicate each time."""
        nullable = [
            name
            for (name,) in conn.execute(
                "SELECT a.attname::text FROM pg_attribute a"
                " WHERE a.attrelid = to_regclass(%s) AND a.attname = ANY (%s)"
                "  AND NOT a.attnotnull ORDER BY a.attname",
                (regclass, list(self.keys)),
            ).fetchall()
        ]
        if not nullable or self._nulls_not_distinct(conn, regclass):
            return
        columns = ", ".join(nullable)
        raise SchemaMismatchError(
            f"jdbc: table {self.table}: the key column(s) {nullable} may hold NULL, and a "
            "unique index never matches a NULL key, so an upsert of a record with a NULL key "
            "would insert it again on every replay (a duplicate each time). Make them NOT "
            f"NULL (ALTER TABLE {self.table} ALTER COLUMN ... SET NOT NULL for {columns}), "
            "or, on PostgreSQL 15 or later, make the unique index NULLS NOT DISTINCT; and "
            "filter out or fill records with a NULL key."
        )

    def _nulls_not_distinct(self, conn: Connection[Any], regclass: str) -> bool:
        """Whether a unique index on exactly the key columns treats NULLs as equal
        (``NULLS NOT DISTINCT``, PostgreSQL 15+), so an upsert finds a NULL key's row."""
        if conn.info.server_version < 150000:
            return False
        rows = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a"
            "  ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)"
            " WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indnullsnotdistinct"
            "  AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL"
            " GROUP BY i.indexrelid",
            (regclass,),
        ).fetchall()
        return any(set(columns) == set(self.keys) for (columns,) in rows)

    def _create_marker_table(self, conn: Connection[Any]) -> None:
        if self._columns(conn, self.marker) is not None:
            return
        statements = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (gid text PRIMARY KEY, prefix text NOT NULL,"
                " batch bigint NOT NULL, rows bigint NOT NULL,"
                " prepared_at timestamptz NOT NULL DEFAULT now())"
            ).format(self.marker.sql()),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (prefix, batch)").format(
                sql.Identifier(f"{self.marker.name}_prefix_batch"), self.marker.sql()
            ),
        ]
        try:
            for statement in statements:
                conn.execute(statement)
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # created concurrently by another job
        except psycopg.Error as e:
            raise translate(e, self.marker, "creating the commit marker table") from None

    # -- contracts ---------------------------------------------------------------------------

    def key_columns(self) -> tuple[str, ...]:
        """The declared key (``keyColumns``)."""
        return self.keys

    def open(self, task: ConnectorContext) -> IdempotentWriter:
        """An upserting writer for one task (one database transaction)."""
        return UpsertWriter(self, task)

    def begin(self, task: ConnectorContext) -> Transaction:
        """The database transaction of one task, prepared as ``task.transaction_id``."""
        if len(str(task.txn).encode()) > GID_MAX:
            raise self.options.error(
                "epochal.id",
                f"transaction id {str(task.txn)!r} is longer than PostgreSQL's {GID_MAX} bytes",
                "Use a shorter job name, or a short .option('epochal.id', ...) for the sink.",
            )
        return PgTransaction(self, task)

    def _execute(
        self, statement: Any, params: Any = None, *, at_start: bool = False
    ) -> psycopg.Cursor[Any]:
        """Run a driver-side statement on the (reused) driver connection. A reused
        connection the server cut meanwhile is replaced once: every driver-side statement is
        safe to repeat (a repeated COMMIT PREPARED finds the transaction committed)."""
        for retry in (False, True):
            if self._conn is None:
                self._conn, self._reused = checkout(self.options, at_start=at_start)
            try:
                return self._conn.execute(statement, params)
            except psycopg.OperationalError as e:
                reused, conn = self._reused, self._conn
                if reused and not retry and conn.broken:
                    conn.close()
                    self._conn = None
                    continue
                if is_transient(e):
                    raise RestartableError(
                        f"jdbc: table {self.table}: lost PostgreSQL on the driver ({e})"
                    ) from None
                raise
        raise AssertionError("unreachable")

    def _run(self, statement: sql.Composable, what: str) -> None:
        self._execute(statement)

    def commit(self, prepared: Prepared) -> None:
        """``COMMIT PREPARED``. Idempotent: a transaction that is no longer prepared but has
        its commit marker is already committed. One that has neither was rolled back outside
        epochal: its batch is lost, and this fails the job rather than hide it."""
        data = prepared.data if isinstance(prepared.data, dict) else {}
        if data.get("committed") or data.get("rows") == 0:
            return  # committed by the task (plain mode), or an empty task prepared nothing
        gid = prepared.transaction_id
        try:
            self._run(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)), f"commit {gid}")
        except psycopg.errors.UndefinedObject:
            if not self._committed(gid):
                raise JdbcError(
                    f"jdbc: table {self.table}: transaction {gid} (batch {batch_of(gid)}) was "
                    "decided but is neither prepared nor committed: it was rolled back outside "
                    "epochal (ROLLBACK PREPARED by hand, a restored backup, another database?). "
                    "Its records are NOT in the table. Check the 'url' option; replay the batch "
                    "by cancelling the job and re-running it from a known position."
                ) from None
        except psycopg.Error as e:
            raise translate(e, self.table, f"commit of {gid}") from None
        self._prune(gid)

    def _committed(self, gid: str) -> bool:
        try:
            row = self._execute(
                sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(self.marker.sql()), (gid,)
            )
            return row.fetchone() is not None
        except psycopg.errors.UndefinedTable:
            return False

    def _prune(self, gid: str) -> None:
        txn = TransactionId.of(gid)
        if txn.batch % 100 or txn.batch < KEEP_MARKER_BATCHES:
            return
        self._execute(
            sql.SQL("DELETE FROM {} WHERE prefix = %s AND batch < %s").format(self.marker.sql()),
            (txn.prefix, txn.batch - KEEP_MARKER_BATCHES),
        )

    def rollback(self, prepared: Prepared) -> None:
        """``ROLLBACK PREPARED``; unknown or settled ids do nothing."""
        gid = prepared.transaction_id
        try:
            self._run(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)), f"rollback {gid}")
        except psycopg.errors.UndefinedObject:
            return
        except psycopg.Error as e:
            raise translate(e, self.table, f"rollback of {gid}") from None

    def in_doubt(self, scope: RecoveryScope) -> list[Prepared]:
        """The prepared transactions of this database in ``scope`` (their gid starts with
        ``scope.head``; the same for every purpose: looking has no side effect)."""
        prefix = scope.head
        try:
            rows = self._execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                " AND left(gid, length(%s)) = %s ORDER BY gid",
                (prefix, prefix),
            )
            return [Prepared(gid, None) for (gid,) in rows.fetchall()]
        except psycopg.Error as e:
            raise translate(e, self.table, "looking for in-doubt transactions") from None

    def close(self) -> None:
        """Give the driver-side connection back (kept for the next sink object)."""
        if self._conn is not None:
            release(self.options, self._conn)
            self._conn = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the options, not the connection."""
        return {**self.__dict__, "_conn": None}


class _TaskWriter:
    """A task's connection and its one database transaction, opened at the first record."""

    def __init__(self, sink: JdbcSink, task: ConnectorContext) -> None:
        from epochal_jdbc import copy  # pyarrow's CSV writer: imported by a task, not a planner

        self.copy_batch = copy.copy_batch
        self.sink, self.task = sink, task
        self.where = (
            f"batch {task.batch}, partition {task.partition}, attempt {task.attempt}, "
            f"job {task.job}"
        )
        self.conn: Connection[Any] | None = None
        self.rows = 0

    def _begin(self) -> Connection[Any]:
        """Connect (reusing the connection an earlier task of this Python worker left idle)
        and ``BEGIN``; subclasses add their set-up."""
        conn, reused = checkout(self.sink.options)
        try:
            conn.execute("BEGIN")
        except psycopg.OperationalError:
            if not reused:
                raise
            conn.close()  # cut while idle (server restart): take a new one
            conn = connect(self.sink.options)
            conn.execute("BEGIN")
        return conn

    def _fail(self, error: psycopg.Error) -> BaseException:
        return translate(error, self.sink.table, self.where)

    def write(self, batch: pa.RecordBatch) -> None:
        """COPY these records inside the task's transaction."""
        if batch.num_rows == 0:
            return
        try:
            if self.conn is None:
                self.conn = self._begin()
            with self.conn.cursor() as cursor:
                self.copy_batch(cursor, self._target(), self._shape(batch))
        except psycopg.Error as e:
            raise self._fail(e) from None
        self.rows += batch.num_rows

    def _target(self) -> sql.Composable:
        return self.sink.table.sql()

    def _shape(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch

    def abort(self) -> None:
        """Roll the transaction back (closing the connection would too)."""
        if self.conn is not None and not self.conn.closed:
            with contextlib.suppress(psycopg.Error):
                self.conn.execute("ROLLBACK")

    def close(self) -> None:
        """Keep the connection for the next task if it is idle and healthy, else close it
        (the server rolls back a transaction left open)."""
        if self.conn is not None:
            release(self.sink.options, self.conn)
            self.conn = None


class PgTransaction(_TaskWriter, Transaction):
    """One task's transaction: COPY into the table, then ``PREPARE TRANSACTION <gid>``
    together with a commit marker row, so that a later commit can tell "already committed"
    from "rolled back"."""

    def _begin(self) -> Connection[Any]:
        conn = super()._begin()
        self.two_phase = self.sink.mode == "transactional" and (
            int((conn.execute("SHOW max_prepared_transactions").fetchone() or (0,))[0]) > 0
        )
        return conn

    def prepare(self) -> dict[str, Any]:
        """Phase 1. In ``plain`` mode (or without prepared transactions) commit right away."""
        if self.conn is None:
            return {"rows": 0}
        gid = str(self.task.txn)
        try:
            if not self.two_phase:
                self.conn.execute("COMMIT")
                return {"rows": self.rows, "committed": True}
            self.conn.execute(
                sql.SQL("INSERT INTO {} (gid, prefix, batch, rows) VALUES (%s, %s, %s, %s)").format(
                    self.sink.marker.sql()
                ),
                (gid, self.task.transaction_prefix, self.task.batch, self.rows),
            )
            self.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject) as e:
            raise JdbcError(
                f"jdbc: table {self.sink.table} ({self.where}): transaction id {gid} was "
                f"already used ({e}): another writer with the same job name and sink id wrote "
                f"to this database (marker table {self.sink.marker}). Give each job a unique "
                "name, or each sink its own .option('epochal.id', ...)."
            ) from None
        except psycopg.Error as e:
            raise self._fail(e) from None
        return {"rows": self.rows}


class UpsertWriter(_TaskWriter, IdempotentWriter):
    """One task's upserts: COPY into a temporary staging table, then one
    ``INSERT ... SELECT DISTINCT ON (key) ... ON CONFLICT (key) DO UPDATE`` (the last record
    of a key in the task wins; rows whose values do not change are not rewritten)."""

    STAGE = "epochal_stage"

    def _begin(self) -> Connection[Any]:
        conn = super()._begin()
        self.columns = [f.name for f in self.task.schema]
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}, 0::bigint AS {} FROM {}"
                " WITH NO DATA"
            ).format(
                sql.Identifier(self.STAGE), cols, sql.Identifier(ORDINAL), self.sink.table.sql()
            )
        )
        return conn

    def _target(self) -> sql.Composable:
        return sql.Identifier(self.STAGE)

    def _shape(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow as pa

        ordinal = pa.array(range(self.rows, self.rows + batch.num_rows), pa.int64())
        return batch.append_column(ORDINAL, ordinal)

    def flush(self) -> None:
        """Upsert the staged records and commit."""
        if self.conn is None:
            return
        keys = self.sink.key_columns()
        ident = sql.Identifier
        key_list = sql.SQL(", ").join(ident(k) for k in keys)
        cols = sql.SQL(", ").join(ident(c) for c in self.columns)
        others = [c for c in self.columns if c not in keys]
        if others:
            action: sql.Composable = sql.SQL(
                "DO UPDATE SET {} WHERE ({}) IS DISTINCT FROM ({})"
            ).format(
                sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(ident(c)) for c in others),
                sql.SQL(", ").join(sql.SQL("t.{}").format(ident(c)) for c in others),
                sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(ident(c)) for c in others),
            )
        else:
            action = sql.SQL("DO NOTHING")
        statement = sql.SQL(
            "INSERT INTO {target} AS t ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {stage}"
            " ORDER BY {keys}, {ordinal} DESC ON CONFLICT ({keys}) {action}"
        ).format(
            target=self.sink.table.sql(),
            cols=cols,
            keys=key_list,
            stage=ident(self.STAGE),
            ordinal=ident(ORDINAL),
            action=action,
        )
        try:
            self.conn.execute(statement)
            self.conn.execute("COMMIT")
        except psycopg.Error as e:
            raise self._fail(e) from None
