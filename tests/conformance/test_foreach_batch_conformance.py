"""The conformance kit on the sinks' ``foreachBatch`` writers (:func:`epochal.foreach_batch`):
Spark's own text file source → the map sink as a ``foreachBatch`` writer, both sink modes,
exactly-once. Under ``epochal run`` each crash point of the sink kills what runs it (a write
task's Python worker, or the whole driver: the writer's driver steps run in the driver's own
process) and the whole driver after a batch; in a plain session an outside restarter's
application is killed whole, paused past its lease (a zombie), killed at random and stopped
gracefully, with records arriving all along.

The source is Spark's own, so the same suite runs on pyspark 3.5, where epochal's data
sources do not: there only its plain-session case runs (``epochal run`` needs 4.0+), and says
so for the others (``tests/releases``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.testing import ConformanceSuite
from epochal.testing.text_files import TextFilesSourceUnderTest
from epochal_map.testing import MapSinkUnderTest
from epochal_sdk import Guarantee


class TestMapSinkThroughForeachBatch(ConformanceSuite):
    """Text files → Spark → ``foreachBatch`` → the map sink."""

    scope = "sink"
    sink_paths = ("foreachBatch",)
    guarantees = (Guarantee.EXACTLY_ONCE,)
    aggregate = False
    contract_checks = False  # the map suite runs the sink's contract checks
    source_connector = "files"
    sink_connector = "map"

    @pytest.fixture
    def epochal_source(self, tmp_path: Path) -> TextFilesSourceUnderTest:
        return TextFilesSourceUnderTest(
            tmp_path / "source", lines_per_file=self.records_per_batch // 2, files_per_batch=2
        )

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink
