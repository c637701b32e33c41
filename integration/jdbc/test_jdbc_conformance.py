"""The conformance kit on the jdbc connector against the real PostgreSQL server: every crash
point of the sink (two-phase commit and upsert, exactly-once and at-least-once) with the map
journal as the source, and every crash point of the table source with the map as the sink.
After every case ``pg_prepared_xacts`` must hold nothing of the job."""

from __future__ import annotations

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest, JdbcSourceUnderTest

from epochal.testing import ConformanceSuite
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest
from epochal_sdk import Guarantee
from tests.lane import FULL

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class TestJdbcSinkConformance(ConformanceSuite):
    """Map journal → Spark → PostgreSQL table (2PC and upsert)."""

    scope = "sink"
    records = 150
    records_per_batch = 50
    session_failures = False  # per contract: the map suite's transactional sink runs them
    graceful_stop = FULL  # CI's lane: the map suite's real- and session-failures stop gracefully
    source_connector = "map"
    sink_connector = "jdbc"

    @pytest.fixture
    def epochal_source(self, epochal_map_source: MapSourceUnderTest) -> MapSourceUnderTest:
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, epochal_jdbc_sink: JdbcSinkUnderTest) -> JdbcSinkUnderTest:
        return epochal_jdbc_sink


class TestJdbcSourceConformance(ConformanceSuite):
    """PostgreSQL table → Spark → map (upsert)."""

    scope = "source"
    sink_modes = ("idempotent",)
    # The replayable-source protocol is the same at both guarantees and the map suite runs
    # it at both, with the aggregation; here: every source crash point, exactly-once.
    guarantees = (Guarantee.EXACTLY_ONCE,)
    aggregate = False
    real_failures = False  # they run once per connector: in the sink suite
    records = 150
    records_per_batch = 50
    source_connector = "jdbc"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, epochal_jdbc_source: JdbcSourceUnderTest) -> JdbcSourceUnderTest:
        return epochal_jdbc_source

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink
