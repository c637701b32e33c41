"""The PostgreSQL table source against the real server, without Spark: offsets, limits,
deterministic re-reads, queries, types, and rows that commit out of offset order."""

from __future__ import annotations

import datetime
import decimal

import pytest
from epochal_jdbc import JdbcSource

from epochal_sdk import ConfigError, Options, SchemaMismatchError, Split
from integration.harness.plugin import PostgresDatabase

pytestmark = pytest.mark.integration


def _source(db: PostgresDatabase, **options: str) -> JdbcSource:
    values = {"url": db.dsn, "table": "events", "offsetColumns": "id", **options}
    return JdbcSource(Options("jdbc", values))


@pytest.fixture
def events(postgres_db: PostgresDatabase) -> PostgresDatabase:
    with postgres_db.connect() as conn:
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, payload text)")
        conn.execute("INSERT INTO events SELECT i, 'p' || i FROM generate_series(1, 10) i")
    return postgres_db


def _read(source: JdbcSource, start: object, end: object) -> list[tuple[object, ...]]:
    return list(source.read(Split("0", start, end)))


def test_batches_by_offset_are_re_read_identically(events: PostgresDatabase) -> None:
    source = _source(events)
    source.check()
    assert source.schema() == "`id` bigint, `payload` string"
    start = source.initial_offsets(source.partitions())
    assert start == {"0": None}
    latest = source.latest_offsets(["0"])
    assert latest == {"0": [10]}
    end = source.limit(start, latest, 4)
    assert end == {"0": [4]}
    assert source.splits(start, end) == [Split("0", None, [4])]
    first = _read(source, None, [4])
    assert first == [(i, f"p{i}") for i in range(1, 5)]
    with events.connect() as conn:
        conn.execute("INSERT INTO events VALUES (11, 'p11')")
    assert _read(source, None, [4]) == first, "a re-read of the same range differs"
    assert _read(source, [4], [10]) == [(i, f"p{i}") for i in range(5, 11)]
    assert source.limit({"0": [8]}, {"0": [11]}, 100) == {"0": [11]}
    source.close()


def test_starting_positions(events: PostgresDatabase) -> None:
    assert _source(events, startingPosition="latest").initial_offsets(["0"]) == {"0": [10]}
    assert _source(events, startingPosition="[7]").initial_offsets(["0"]) == {"0": [7]}
    with pytest.raises(ConfigError, match="startingPosition"):
        _source(events, startingPosition="[1, 2]").check()


def test_a_query_with_composite_offsets_and_types(postgres_db: PostgresDatabase) -> None:
    with postgres_db.connect() as conn:
        conn.execute(
            "CREATE TABLE t (at timestamptz, seq int, amount numeric(10,2), doc jsonb,"
            " raw bytea, ok boolean)"
        )
        conn.execute(
            "INSERT INTO t VALUES ('2024-01-01 00:00:00+00', 1, 1.50, '{\"a\": 1}', '\\x01', true),"
            " ('2024-01-01 00:00:00+00', 2, 2.00, NULL, NULL, false),"
            " ('2024-01-02 00:00:00+00', 1, NULL, '[1]', '\\x02', NULL)"
        )
    source = JdbcSource(
        Options(
            "jdbc",
            {
                "url": postgres_db.dsn,
                "query": "SELECT * FROM t WHERE seq > 0;",
                "offsetColumns": "at,seq",
            },
        )
    )
    source.check()
    assert source.schema() == (
        "`at` timestamp, `seq` int, `amount` decimal(10,2), `doc` string, `raw` binary, "
        "`ok` boolean"
    )
    latest = source.latest_offsets(["0"])
    assert latest == {"0": ["2024-01-02 00:00:00+00", 1]}
    end = source.limit({"0": None}, latest, 2)
    assert end == {"0": ["2024-01-01 00:00:00+00", 2]}
    rows = _read(source, None, end["0"])
    utc = datetime.UTC
    assert rows == [
        (
            datetime.datetime(2024, 1, 1, tzinfo=utc),
            1,
            decimal.Decimal("1.50"),
            '{"a": 1}',
            b"\x01",
            True,
        ),
        (datetime.datetime(2024, 1, 1, tzinfo=utc), 2, decimal.Decimal("2.00"), None, None, False),
    ]
    assert [r[1] for r in _read(source, end["0"], latest["0"])] == [1]
    source.close()


def test_a_row_committing_behind_a_newer_one_is_not_skipped(events: PostgresDatabase) -> None:
    """Id 11 is taken by a transaction still open when id 12 commits: the source does not
    move past 11 until that transaction ends."""
    source = _source(events, inProgressWaitMs="200")
    assert source.latest_offsets(["0"]) == {"0": [10]}
    slow = events.connect(autocommit=False)
    try:
        slow.execute("INSERT INTO events VALUES (11, 'late')")
        with events.connect() as conn:
            conn.execute("INSERT INTO events VALUES (12, 'early')")
        assert source.latest_offsets(["0"]) == {"0": [10]}, "moved past an in-progress row"
        slow.commit()
    finally:
        slow.close()
    assert source.latest_offsets(["0"]) == {"0": [12]}
    assert [r[0] for r in _read(source, [10], [12])] == [11, 12]
    source.close()


def test_bad_options_are_clear(events: PostgresDatabase) -> None:
    with pytest.raises(ConfigError, match="exactly one of 'table' and 'query'"):
        JdbcSource(Options("jdbc", {"url": events.dsn, "offsetColumns": "id"}))
    with pytest.raises(ConfigError, match="offsetColumns"):
        JdbcSource(Options("jdbc", {"url": events.dsn, "table": "events"}))
    with pytest.raises(SchemaMismatchError, match="does not exist"):
        _source(events, table="nope").check()
    with pytest.raises(SchemaMismatchError, match=r"offset columns \['ts'\]"):
        _source(events, offsetColumns="ts").check()
