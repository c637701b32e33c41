"""The conformance kit on the sinks' ``foreachBatch`` writers (:func:`epochal.foreach_batch`):
Spark's own text file source → the map sink as a ``foreachBatch`` writer, both sink modes,
exactly-once. Under ``epochal run`` each crash point of the sink kills what runs it (a write
task's Python worker, or the whole driver: the writer's driver steps run in the driver's own
process) and the whole driver after a batch; in a plain session an outside restarter's
application is killed whole, paused past its lease (a zombie), killed at random and stopped
gracefully, with records arriving all along.

The source is Spark's own, so the same suite runs on pyspark 3.5, where epochal's data
sources do not: there only its plain-session case runs (``epochal run`` needs 4.0+), and says
so for the others (``tests/releases``). Here, on the suite's own pyspark, the plain-session
case runs in the full lane (CI's lane runs it on 3.5).

The kit is measured with a broken writer too: one that writes a replayed batch again instead
of completing its decision (each task committing its own transaction, as a plain
``foreachBatch`` function does) must be caught duplicating."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from epochal.base.fault_plan import Fault
from epochal.control.launcher import DriverPool
from epochal.spark.common import Part
from epochal.spark.foreach_batch import ForeachBatchWriter, run_tasks
from epochal.testing import ConformanceSuite
from epochal.testing.runner import run_case
from epochal.testing.scenarios import FOREACH_BATCH, Scenario
from epochal.testing.suite import scenario_problem
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


class RewritingWriter(ForeachBatchWriter):
    """A writer that writes a replayed batch again instead of completing its decision: each
    task commits its own transaction, as a plain ``foreachBatch`` function does."""

    def _complete_replay(self, part: Part, frame: Any, batch: int) -> None:
        run_tasks(replace(part, guarantee=Guarantee.AT_LEAST_ONCE), frame, batch, "transactional")


def rewriting_writer(connector: str, options: dict[str, str]) -> RewritingWriter:
    """:class:`RewritingWriter`, built as :func:`epochal.foreach_batch` builds the writer."""
    return RewritingWriter(connector, options)


@pytest.mark.spark
def test_the_kit_catches_a_writer_that_writes_a_replayed_batch_again(
    epochal_driver_pool: DriverPool | None, epochal_map_sink: MapSinkUnderTest, tmp_path: Path
) -> None:
    """The suite's crash at ``sink.after_commit`` (the batch decided and committed, Spark's
    commit log not written: the next run replays it) catches the broken writer duplicating."""
    scenario = Scenario(
        "points",
        Guarantee.EXACTLY_ONCE,
        "transactional",
        (Fault("sink.after_commit"),),
        sink_path=FOREACH_BATCH,
    )
    source = TextFilesSourceUnderTest(tmp_path / "source", lines_per_file=50)
    outcome = run_case(
        scenario,
        source,
        epochal_map_sink,
        str(tmp_path / "snapshots"),
        pool=epochal_driver_pool,
        writer=f"{__name__}:rewriting_writer",
    )
    problem = scenario_problem(scenario, outcome, source, epochal_map_sink)
    assert problem is not None and "duplicates under exactly-once" in problem, problem
    assert not outcome.lost, outcome
