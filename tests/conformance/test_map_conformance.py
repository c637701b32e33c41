"""The conformance kit on the map connector: every crash point, driver and executor, both
guarantees, the sink in transactional and in idempotent mode."""

from __future__ import annotations

import pytest

from epochal.testing import ConformanceSuite
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest


class TestMapConformance(ConformanceSuite):
    """Map journal → Spark → map sink."""

    @pytest.fixture
    def epochal_source(self, epochal_map_source: MapSourceUnderTest) -> MapSourceUnderTest:
        return epochal_map_source

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink
