"""The conformance kit against a real broker (Artemis from the harness).

Source suite: JMS queue → Spark → map sink (transactional), every crash point of the
acknowledging-source protocol, exactly-once and at-least-once, plus the aggregate pipeline
killed after a sink decision; at the end no message may be left on the queue.
Sink suite: map journal → Spark → JMS queue (idempotent contract: duplicate IDs), every crash
point of the idempotent sink, both guarantees; an independent STOMP consumer counts the
messages by ID.
"""

from __future__ import annotations

from typing import Any

import pytest
from epochal_jms.testing import JmsQueueUnderTest, JmsSinkUnderTest, broker_config

from epochal.testing import ConformanceSuite
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest
from integration.harness.jms import JmsQueue, JmsServer

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _config(server: JmsServer) -> Any:
    return broker_config(server.host, server.port, server.user, server.password)


class TestJmsSourceConformance(ConformanceSuite):
    """JMS queue (acknowledging source) → Spark → map sink."""

    source_contract = "acknowledging"
    sink_modes = ("transactional",)
    scope = "source"
    records = 150
    records_per_batch = 50
    source_connector = "jms"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, jms_server: JmsServer, jms_queue: JmsQueue) -> JmsQueueUnderTest:
        return JmsQueueUnderTest(_config(jms_server), jms_queue.destination)

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink


class TestJmsSinkConformance(ConformanceSuite):
    """Map journal → Spark → JMS queue (duplicate IDs, one STOMP transaction per task)."""

    sink_modes = ("idempotent",)
    scope = "sink"
    records = 150
    records_per_batch = 50
    real_failures = False  # they run once per connector: in the source suite
    source_connector = "map"
    sink_connector = "jms"

    @pytest.fixture
    def epochal_source(self, epochal_map_source: MapSourceUnderTest) -> MapSourceUnderTest:
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, jms_server: JmsServer, jms_queue: JmsQueue) -> JmsSinkUnderTest:
        return JmsSinkUnderTest(_config(jms_server), jms_queue.destination)
