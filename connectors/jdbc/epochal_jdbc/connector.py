"""The jdbc connector: PostgreSQL tables as a replayable source and a transactional or
idempotent sink."""

from __future__ import annotations

from epochal_jdbc.sink import JdbcSink
from epochal_jdbc.source import JdbcSource
from epochal_sdk import Connector


class JdbcConnector(Connector):
    """``format("epochal.jdbc")``: PostgreSQL through psycopg 3."""

    name = "jdbc"
    description = (
        "PostgreSQL: two-phase-commit, upsert or plain-insert sink; table/query source read "
        "by growing offset columns."
    )
    source_class = JdbcSource
    sink_class = JdbcSink
