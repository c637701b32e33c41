"""The conformance kit on the map connector: every crash point, driver and executor, both
guarantees, the sink in transactional and in idempotent mode; each point killed in place
(the process performing the step) and with the whole driver, executor JVMs killed, the
running aggregation, and the real failures (supervisor killed, zombie driver, random kills).
The map suite proves the runtime's own protocols, so it kills the whole driver everywhere."""

from __future__ import annotations

import pytest

from epochal.testing import ConformanceSuite
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest


class TestMapConformance(ConformanceSuite):
    """Map journal → Spark → map sink."""

    whole_driver_kills = True
    executor_kills = True
    source_connector = "map"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, epochal_map_source: MapSourceUnderTest) -> MapSourceUnderTest:
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink
