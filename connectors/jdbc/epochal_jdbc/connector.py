"""The jdbc connector: PostgreSQL tables as a replayable source and a transactional or
idempotent sink."""

from __future__ import annotations

from epochal_jdbc.db import TableName, conninfo, describe
from epochal_jdbc.sink import JdbcSink
from epochal_jdbc.source import JdbcSource
from epochal_sdk import Connector, Options

_CONNECTION = frozenset({"url", "dsn", "user", "password", "connectTimeout"})


class JdbcConnector(Connector):
    """``format("epochal.jdbc")``: PostgreSQL through psycopg 3."""

    name = "jdbc"
    description = (
        "PostgreSQL: two-phase-commit, upsert or plain-insert sink; table/query source read "
        "by growing offset columns."
    )
    source_class = JdbcSource
    sink_class = JdbcSink
    secret_options = frozenset({"password"})
    source_options = _CONNECTION | {
        "table",
        "query",
        "offsetColumns",
        "orderBy",
        "startingPosition",
        "waitForInProgress",
        "inProgressWaitMs",
    }
    sink_options = _CONNECTION | {"table", "mode", "keyColumns", "createTable", "markerTable"}
    target_options = ("url", "dsn", "table", "query")

    def target(self, options: Options, kind: str) -> dict[str, str]:
        """The server and database (``host:port/dbname`` from ``url``/``dsn``, without who
        logs in) and the table (a source may read a ``query`` instead)."""
        found = {"database": describe(conninfo(options))}
        table = options.str("table", "").strip()
        if table:
            found["table"] = str(TableName.parse(table))
        elif kind == "source" and options.str("query", "").strip():
            found["query"] = " ".join(options.str("query", "").split())
        return found
