"""A broken ``foreachBatch`` writer (the mutant of :func:`epochal.foreach_batch`'s writers): it
writes a replayed batch again instead of completing its decision, each task committing its own
transaction, as a plain ``foreachBatch`` function does. Exactly-once must catch it
duplicating: the kit's foreachBatch suite (tests/conformance/test_foreach_batch_conformance.py)
and the Kafka → JDBC case of integration/kafka/test_foreach_batch.py build it by the path
``tests.conformance.foreach_batch_mutants:rewriting_writer``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from epochal.spark.common import Part
from epochal.spark.foreach_batch import ForeachBatchWriter, run_tasks
from epochal_sdk import Guarantee

WRITER_PATH = "tests.conformance.foreach_batch_mutants:rewriting_writer"
"""Where a job's spec finds :func:`rewriting_writer`."""


class RewritingWriter(ForeachBatchWriter):
    """A writer that writes a replayed batch again instead of completing its decision."""

    def _complete_replay(self, part: Part, frame: Any, batch: int) -> None:
        run_tasks(replace(part, guarantee=Guarantee.AT_LEAST_ONCE), frame, batch, "transactional")


def rewriting_writer(connector: str, options: dict[str, str]) -> RewritingWriter:
    """:class:`RewritingWriter`, built as :func:`epochal.foreach_batch` builds the writer."""
    return RewritingWriter(connector, options)
