"""What the installed pyspark offers epochal, detected (not assumed from its version), and
the one place that imports the parts of PySpark's Python data source API that not every
supported release has.

epochal's data source formats and ``epochal run`` need pyspark 4.0 through 4.3
(:data:`DATA_SOURCE_API`); its ``foreachBatch`` writers also run on 3.5. The runtime's
distribution does not require pyspark (a platform's own pyspark, installed by pip or not, is
kept; ``epochal[pyspark]`` brings one from PyPI), so what is missing is told here: at submit
(:func:`refusals`) and at :func:`epochal.register` (:func:`data_source_refusal`). Two
features it uses arrived after 4.0:

- :data:`ADMISSION_CONTROL` (4.2): a Python stream reader's ``latestOffset(start, limit)``
  with a read limit, and ``SupportsTriggerAvailableNow``. Without it a batch reads everything
  the source has (``maxRecordsPerBatch`` is not applied by a replayable source), the
  available-now trigger is refused at submit (:func:`refusals`), and a query restarted after
  its last batch committed runs one empty batch first (its reader is told no start, so it
  cannot give back the end as Spark's offset log has it, task count and all).
- :data:`ARROW_STREAM_WRITER` (4.1): ``DataSourceStreamArrowWriter``, a stream writer that
  gets Arrow record batches. Without it the sinks' writers get rows and turn them into Arrow
  record batches themselves (:func:`arrow_batches`).

And one difference with no name to detect: pyspark 4.0 refuses to register a Python data
source under a name it already found by itself (a ``pyspark_epochal_<name>`` package), where
4.1+ replaces it; :func:`found_by_spark` tells that refusal, and the registration keeps the
one Spark found (the same class: :func:`epochal_sdk.define_default_source`).

Nothing of pyspark is imported before a function here is called, so the submit side can
check a job without starting anything.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

ROWS_PER_ARROW_BATCH = 10_000
"""Rows per Arrow record batch when a writer that gets rows builds the batches itself."""


@dataclass(frozen=True)
class Feature:
    """One feature of PySpark that epochal leans on: what it is, the first release that has
    it, and the module and name whose presence says the installed pyspark has it."""

    name: str
    since: str
    module: str
    attribute: str

    @property
    def available(self) -> bool:
        """Whether the installed pyspark has it."""
        return _has(self.module, self.attribute)

    def missing(self, what_to_do: str) -> str:
        """The message for a job that needs it on a pyspark without it."""
        return (
            f"{self.name} needs pyspark {self.since}+; you have {pyspark_version()}: {what_to_do}"
        )


ADMISSION_CONTROL = Feature(
    "the available-now trigger and read limits for Python streaming sources",
    "4.2",
    "pyspark.sql.streaming.datasource",
    "SupportsTriggerAvailableNow",
)
ARROW_STREAM_WRITER = Feature(
    "Arrow record batches for Python streaming sinks",
    "4.1",
    "pyspark.sql.datasource",
    "DataSourceStreamArrowWriter",
)
DATA_SOURCE_API = Feature(
    "epochal's data source formats (format('epochal.<name>'), epochal run)",
    "4.0",
    "pyspark.sql.datasource",
    "DataSource",
)
FEATURES = (DATA_SOURCE_API, ADMISSION_CONTROL, ARROW_STREAM_WRITER)
"""Every feature detected here."""


@functools.cache
def _has(module: str, attribute: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return False


PYSPARK_INSTALL = (
    "install it (pip install 'epochal[pyspark]' brings pyspark 4.3 from PyPI) or put your "
    "Spark's python/ directory and its py4j on PYTHONPATH"
)
"""What to do when no pyspark is importable."""

FOREACH_BATCH_INSTEAD = (
    "on pyspark 3.5 write through the foreachBatch writers "
    "(epochal.foreach_batch, docs/how-to/foreach-batch.md), or upgrade pyspark to 4.0-4.3"
)
"""What to do on a pyspark without the Python data source API."""


def pyspark_installed() -> bool:
    """Whether a pyspark is importable (found on the path: not imported)."""
    import importlib.util

    return importlib.util.find_spec("pyspark") is not None


def pyspark_version() -> str:
    """The installed pyspark's version: from its distribution's metadata (no import), or,
    for a pyspark that is not a pip distribution (a Spark home's ``python/`` on the path), from
    ``pyspark.version``; ``"none"`` when none is importable."""
    from importlib import metadata  # only for a refusal's message: not in every process

    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        if not pyspark_installed():
            return "none"
        from pyspark.version import __version__

        return str(__version__)


NEWEST_TESTED = (4, 3)
"""The newest pyspark line epochal is tested on (its CI's own release; the extra
``epochal[pyspark]`` stops below the next)."""


def untested_release() -> str:
    """A warning when the installed pyspark is newer than any epochal is tested on (a
    platform's own pyspark, which pip's bounds on the extra do not hold back); empty
    otherwise. Such a pyspark is not refused: its features are detected, not assumed."""
    version = pyspark_version()
    try:
        line = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:  # "none", or a version this cannot read: nothing to say
        return ""
    if line <= NEWEST_TESTED:
        return ""
    newest = ".".join(map(str, NEWEST_TESTED))
    return (
        f"pyspark {version} is newer than any epochal is tested on (3.5-{newest}): it runs, "
        f"untested; pin pyspark<={newest}.* for what the tests cover, and report what fails"
    )


def data_source_refusal() -> str:
    """Why epochal's data source formats cannot run on this interpreter's pyspark (no
    pyspark, or one without the Python data source API); empty when they can."""
    if not pyspark_installed():
        return f"epochal needs pyspark, and none is importable: {PYSPARK_INSTALL}"
    if not DATA_SOURCE_API.available:
        return DATA_SOURCE_API.missing(FOREACH_BATCH_INSTEAD)
    return ""


def refusals(*, available_now: bool) -> list[str]:
    """Why a job with these settings cannot run on the installed pyspark (empty: it can).
    Checked at submit, before any driver starts."""
    refusal = data_source_refusal()
    if refusal:
        return [refusal]
    found = []
    if available_now and not ADMISSION_CONTROL.available:
        found.append(
            ADMISSION_CONTROL.missing(
                "run the job with a snapshot interval (a processing-time trigger) and stop it "
                "when it has caught up, or upgrade pyspark"
            )
        )
    return found


def found_by_spark(error: BaseException) -> bool:
    """Whether ``error`` is pyspark 4.0's refusal to register a data source whose name Spark
    already found in a ``pyspark_*`` package (``DATA_SOURCE_ALREADY_EXISTS``)."""
    return "DATA_SOURCE_ALREADY_EXISTS" in str(error)


# -- the classes and names of the newer releases, or what stands in for them ------------------


class _NoTriggerAvailableNow:
    """The base a reader takes instead of ``SupportsTriggerAvailableNow`` on a pyspark
    without it: Spark then never calls ``prepareForTriggerAvailableNow``."""


def trigger_available_now_base() -> type:
    """``SupportsTriggerAvailableNow`` (pyspark 4.2+), or an empty base without it."""
    if ADMISSION_CONTROL.available:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

        return SupportsTriggerAvailableNow
    return _NoTriggerAvailableNow


def stream_writer_base() -> type:
    """The base of epochal's stream writers: ``DataSourceStreamArrowWriter`` (pyspark 4.1+,
    tasks get Arrow record batches), or ``DataSourceStreamWriter`` (tasks get rows, which
    :func:`arrow_batches` turns into record batches)."""
    from pyspark.sql import datasource

    if ARROW_STREAM_WRITER.available:
        return datasource.DataSourceStreamArrowWriter
    return datasource.DataSourceStreamWriter


def read_limit(max_rows: int | None) -> Any:
    """Spark's read limit for at most ``max_rows`` rows a batch, or all available (None).
    Only called by Spark with admission control, so only on pyspark 4.2+."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    return ReadMaxRows(max_rows) if max_rows else ReadAllAvailable()


def max_rows(limit: Any) -> int | None:
    """The row limit of Spark's read limit ``limit``; None for none (or no admission control:
    ``latestOffset()`` was called without a limit)."""
    if limit is None or not ADMISSION_CONTROL.available:
        return None
    from pyspark.sql.streaming.datasource import ReadMaxRows

    return limit.max_rows if isinstance(limit, ReadMaxRows) else None


def arrow_batches(items: Iterable[Any], schema: StructType | None) -> Iterator[pa.RecordBatch]:
    """A stream writer's input as Arrow record batches: record batches pass through; rows
    (what a writer gets without :data:`ARROW_STREAM_WRITER`) are gathered into batches of
    :data:`ROWS_PER_ARROW_BATCH` in ``schema``'s Arrow form."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    arrow_schema = None
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
            continue
        rows.append(item.asDict(recursive=True))
        if len(rows) >= ROWS_PER_ARROW_BATCH:
            arrow_schema = arrow_schema or _arrow_schema(schema)
            yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema or _arrow_schema(schema))


def _arrow_schema(schema: StructType | None) -> pa.Schema | None:
    return arrow_schema(schema) if schema is not None else None


def arrow_schema(schema: StructType) -> pa.Schema:
    """``schema`` in Arrow, timestamps in UTC (``to_arrow_schema`` takes ``timezone`` from
    pyspark 4.2 on and ``timestamp_utc`` before)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]
