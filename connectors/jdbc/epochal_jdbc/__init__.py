"""epochal-jdbc: PostgreSQL for epochal, on psycopg 3.

A sink with three modes (two-phase commit with ``PREPARE TRANSACTION``, idempotent upsert on a
declared key, plain at-least-once inserts) and a replayable source that reads a table or a
query incrementally by growing offset columns.
"""

from epochal_jdbc.connector import JdbcConnector
from epochal_jdbc.db import JdbcError, TableName
from epochal_jdbc.sink import JdbcSink
from epochal_jdbc.source import JdbcSource

__all__ = ["JdbcConnector", "JdbcError", "JdbcSink", "JdbcSource", "TableName"]
