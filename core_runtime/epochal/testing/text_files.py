"""Spark's own text file source as the kit's source: a directory the kit writes files of
record IDs into, read by ``format("text")``. Spark's file source is replayable by its own
log (a replayed batch reads the same files) and reads at the available-now trigger on every
release epochal supports, pyspark 3.5 too, where epochal's own sources (Python data sources)
do not run: the source of a suite that proves a sink through its ``foreachBatch`` writer
there (``sink_paths = ("foreachBatch",)``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from epochal.testing.under_test import SourceUnderTest


class TextFilesSourceUnderTest(SourceUnderTest):
    """A directory of text files, one record ID a line, as Spark's text source reads it
    (its one column ``value``).

    Args:
        directory: where the files go (made if missing).
        lines_per_file: record IDs per file; with ``files_per_batch`` it sets how many
            records a batch reads (Spark's file source limits batches by files).
        files_per_batch: Spark's ``maxFilesPerTrigger``.
    """

    connector = "files"
    format = "text"
    id_expr = "CAST(value AS BIGINT)"

    def __init__(self, directory: Path, lines_per_file: int = 50, files_per_batch: int = 2):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.lines_per_file, self.files_per_batch = lines_per_file, files_per_batch
        self._files = 0

    def options(self) -> dict[str, str]:
        return {"path": str(self.directory), "maxFilesPerTrigger": str(self.files_per_batch)}

    def produce(self, ids: Sequence[int]) -> None:
        """Write ``ids`` in files of ``lines_per_file`` lines, each whole before Spark can
        see it (written under a name Spark skips, then renamed)."""
        for start in range(0, len(ids), self.lines_per_file):
            chunk = ids[start : start + self.lines_per_file]
            self._files += 1
            name = f"part-{self._files:08d}.txt"
            hidden = self.directory / f".{name}.tmp"
            hidden.write_text("".join(f"{i}\n" for i in chunk))
            os.replace(hidden, self.directory / name)
