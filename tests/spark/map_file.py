"""What a map file holds, read with SQLite directly (independently of the connector's code)."""

from __future__ import annotations

import contextlib
import sqlite3

from epochal_sdk import TransactionId


def committed_transactions(path: str) -> list[TransactionId]:
    """Every transaction the map file at ``path`` committed, in id order."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        query = "SELECT txn_id FROM txns WHERE state = 'committed' ORDER BY txn_id"
        rows = conn.execute(query).fetchall()
    return [TransactionId.of(text) for (text,) in rows]
