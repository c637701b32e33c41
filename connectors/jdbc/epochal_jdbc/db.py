"""What the source and the sink share: the connection options, connecting with clear errors,
table names, type mapping and the translation of PostgreSQL errors into epochal's errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from epochal_sdk import (
    ConfigError,
    EpochalError,
    Options,
    PoisonRecordError,
    RestartableError,
    SchemaMismatchError,
    unreachable,
)

CONNECTOR = "jdbc"
GID_MAX = 200
"""PostgreSQL's limit on a prepared transaction's global id (bytes)."""

# SQLSTATE classes/codes that mean "the server went away or is not there yet": transient.
_TRANSIENT_STATES = ("08", "57P01", "57P02", "57P03", "53300", "40001", "40P01", "55P03")


class JdbcError(EpochalError):
    """A PostgreSQL failure that is neither transient nor a bad record (fails the job)."""


@dataclass(frozen=True)
class TableName:
    """A possibly schema-qualified table name, with identifiers already folded the way
    PostgreSQL folds them (unquoted parts to lower case, quoted parts kept as written)."""

    schema: str | None
    name: str

    @classmethod
    def parse(cls, text: str, option: str = "table") -> TableName:
        """Parse ``t``, ``s.t``, ``"My Schema"."My Table"``; a clear error on anything else."""
        parts: list[str] = []
        rest = text.strip()
        pattern = re.compile(r'\s*(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*))\s*')
        while True:
            match = pattern.match(rest)
            if not match:
                raise ConfigError(
                    CONNECTOR,
                    option,
                    f"{text!r} is not a table name",
                    'Write table, schema.table or "Quoted Schema"."Quoted Table".',
                )
            quoted, bare = match.groups()
            parts.append(quoted.replace('""', '"') if quoted is not None else bare.lower())
            rest = rest[match.end() :]
            if not rest:
                break
            if not rest.startswith("."):
                raise ConfigError(
                    CONNECTOR, option, f"{text!r} is not a table name", "Separate parts with '.'."
                )
            rest = rest[1:]
        if len(parts) > 2:
            raise ConfigError(
                CONNECTOR,
                option,
                f"{text!r} has {len(parts)} parts",
                "Give table or schema.table (the database is chosen by 'url').",
            )
        return cls(parts[0], parts[1]) if len(parts) == 2 else cls(None, parts[0])

    def sql(self) -> sql.Composable:
        """The name as quoted SQL."""
        if self.schema is None:
            return sql.Identifier(self.name)
        return sql.Identifier(self.schema, self.name)

    def sibling(self, name: str) -> TableName:
        """Another table in the same schema."""
        return TableName(self.schema, name)

    def __str__(self) -> str:
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


def conninfo(options: Options) -> str:
    """The libpq connection string from ``url``/``dsn`` (a ``postgresql://`` URL, a
    ``jdbc:postgresql://`` URL or ``key=value`` pairs) plus optional ``user``/``password``."""
    raw = (options.str("url", "") or options.str("dsn", "")).strip()
    if not raw:
        raise ConfigError(
            CONNECTOR,
            "url",
            "is required",
            "Set .option('url', 'postgresql://user:password@host:5432/database') "
            "(or a libpq 'host=... dbname=...' string).",
        )
    if raw.startswith("jdbc:"):
        raw = raw[len("jdbc:") :]
    extra = {k: options[k] for k in ("user", "password") if options.str(k, "")}
    try:
        return psycopg.conninfo.make_conninfo(raw, **extra)
    except psycopg.ProgrammingError as e:
        raise ConfigError(
            CONNECTOR, "url", f"is not a valid connection string ({e})", "Check its syntax."
        ) from None


def describe(info: str) -> str:
    """The connection string without its password, for messages."""
    params = psycopg.conninfo.conninfo_to_dict(info)
    params.pop("password", None)
    host = params.get("host", "localhost")
    return f"{host}:{params.get('port', 5432)}/{params.get('dbname', params.get('user', ''))}"


_SERVER_NOT_READY = ("shutting down", "starting up", "recovery mode", "not yet accepting")


def connect(options: Options, *, autocommit: bool = True, at_start: bool = False) -> Any:
    """A psycopg connection. ``at_start`` (the checks before a job's batches): a server that
    does not answer is the SDK's ``unreachable`` error (a :class:`ConfigError` when the job
    starts, a :class:`RestartableError` on a restart). Elsewhere (tasks, commits) a lost
    server is a :class:`RestartableError`. A refused login or a missing database is always a
    :class:`ConfigError`."""
    info = conninfo(options)
    timeout = options.int("connectTimeout", 10, minimum=1)
    try:
        return psycopg.connect(info, autocommit=autocommit, connect_timeout=timeout)
    except psycopg.OperationalError as e:
        text = " ".join(str(e).split()) or type(e).__name__
        permanent = any(
            word in text
            for word in (
                "password",
                "authentication",
                "does not exist",
                "could not translate host name",
                "permission denied",
            )
        )
        not_ready = any(word in text for word in _SERVER_NOT_READY)
        problem = f"cannot connect to PostgreSQL at {describe(info)} ({text})"
        fix = "Check host, port, database, user and password, and that the server runs."
        if permanent:
            raise ConfigError(CONNECTOR, "url", problem, fix) from None
        if at_start and not not_ready:
            raise unreachable(CONNECTOR, "url", problem, fix) from None
        raise RestartableError(
            f"jdbc: lost PostgreSQL at {describe(info)} ({text}); restarting from the last snapshot"
        ) from None


_IDLE: dict[str, Any] = {}
"""One idle driver-side connection per connection string, kept between sink objects: the
runtime builds a fresh sink (and data source) for every batch commit, in a Python worker that
Spark reuses, and a new PostgreSQL connection (fork + SCRAM) costs more than the commit."""


def checkout(options: Options, *, at_start: bool = False) -> tuple[Any, bool]:
    """A driver-side connection (autocommit) and whether it was reused from an earlier sink
    object (a reused one may have been cut by a server restart: retry once on a new one)."""
    idle = _IDLE.pop(conninfo(options), None)
    if idle is not None and not idle.closed and not idle.broken:
        return idle, True
    return connect(options, at_start=at_start), False


def release(options: Options, conn: Any) -> None:
    """Keep ``conn`` for the next driver-side sink object if it is healthy and idle."""
    healthy = not conn.closed and not conn.broken
    if healthy and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        previous = _IDLE.pop(conninfo(options), None)
        if previous is not None:
            previous.close()
        _IDLE[conninfo(options)] = conn
    else:
        conn.close()


def is_transient(error: BaseException) -> bool:
    """Whether a psycopg error means a lost or not-yet-ready server (worth a restart)."""
    state = getattr(error, "sqlstate", None) or ""
    if isinstance(error, psycopg.OperationalError) and not state:
        return True  # connection-level failure: no SQLSTATE from the server
    return any(state.startswith(s) for s in _TRANSIENT_STATES)


def translate(error: psycopg.Error, table: TableName, where: str) -> EpochalError:
    """The epochal error for a psycopg error while working on ``table`` (``where`` names the
    batch and task). Lost connections restart the job; a bad row or a constraint violation
    names the row; a missing table or column is a schema mismatch."""
    diag = getattr(error, "diag", None)
    detail = " ".join(
        part
        for part in (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
            getattr(diag, "message_detail", None) or "",
            f"[{diag.context.strip()}]" if diag is not None and diag.context else "",
        )
        if part
    )
    if is_transient(error):
        return RestartableError(
            f"jdbc: table {table} ({where}): lost the connection to PostgreSQL ({detail}); "
            "nothing of this task was committed; restarting from the last snapshot"
        )
    if isinstance(error, psycopg.errors.IntegrityError | psycopg.errors.DataError):
        return PoisonRecordError(
            f"jdbc: table {table} ({where}): a record was refused: {detail}. Nothing of this "
            "task was committed. Fix or filter the record (COPY line numbers count the task's "
            "records from 1), or relax the table's constraint."
        )
    if isinstance(
        error,
        psycopg.errors.UndefinedTable
        | psycopg.errors.UndefinedColumn
        | psycopg.errors.DatatypeMismatch,
    ):
        return SchemaMismatchError(
            f"jdbc: table {table} ({where}): the table does not fit the records: {detail}. "
            "Nothing of this task was committed. Alter the table or the query's columns."
        )
    return JdbcError(f"jdbc: table {table} ({where}): PostgreSQL error: {detail}")


# -- types -------------------------------------------------------------------------------------

_SPARK_TO_PG = {
    "string": "text",
    "bigint": "bigint",
    "int": "integer",
    "smallint": "smallint",
    "tinyint": "smallint",
    "double": "double precision",
    "float": "real",
    "boolean": "boolean",
    "timestamp": "timestamptz",
    "timestamp_ntz": "timestamp",
    "date": "date",
    "binary": "bytea",
}

# PostgreSQL type categories (pg_type.typcategory) each Spark type can be written to.
_COMPATIBLE = {
    "string": None,  # anything with a text input function; bad values fail per row
    "bigint": "N",
    "int": "N",
    "smallint": "N",
    "tinyint": "N",
    "double": "N",
    "float": "N",
    "decimal": "N",
    "boolean": "B",
    "timestamp": "D",
    "timestamp_ntz": "D",
    "date": "D",
    "binary": "U",  # bytea is category U (user-defined) in pg_type
}


def pg_type(spark_type: str) -> str:
    """The PostgreSQL column type for a Spark SQL type name (``createTable``)."""
    base = spark_type.strip().lower()
    if base.startswith("decimal"):
        return base.replace("decimal", "numeric")
    if base in _SPARK_TO_PG:
        return _SPARK_TO_PG[base]
    return "jsonb" if base.startswith(("array", "map", "struct")) else "text"


def compatible(spark_type: str, pg_category: str, pg_name: str) -> bool:
    """Whether values of ``spark_type`` can be written to a column of this PostgreSQL type."""
    base = spark_type.strip().lower().split("(")[0]
    if base == "binary":
        return pg_name == "bytea"
    wanted = _COMPATIBLE.get(base)
    return wanted is None or wanted == pg_category


# PostgreSQL type oid -> Spark SQL type of the source schema.
_PG_TO_SPARK = {
    16: "boolean",
    17: "binary",
    20: "bigint",
    21: "smallint",
    23: "int",
    26: "bigint",
    700: "float",
    701: "double",
    1082: "date",
    1114: "timestamp_ntz",
    1184: "timestamp",
    25: "string",
    1043: "string",
    1042: "string",
    19: "string",
}
NUMERIC_OID = 1700


def spark_type(oid: int, precision: int | None, scale: int | None) -> tuple[str, bool]:
    """The Spark type of a result column and whether the value must be cast to text in SQL
    (types Spark has no equivalent for: uuid, json, intervals, arrays ...)."""
    if oid == NUMERIC_OID:
        if precision and precision <= 38:
            return f"decimal({precision},{scale or 0})", False
        return "string", True  # unconstrained numeric: exact as text, not rounded
    if oid in _PG_TO_SPARK:
        return _PG_TO_SPARK[oid], False
    return "string", True
