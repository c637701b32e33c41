"""epochal: fault-tolerant stream pipelines on Spark Structured Streaming.

Submit a job::

    from epochal import Job, JobConfig

    def build(spark):
        events = spark.readStream.format("epochal.map").option("map", "events").load()
        totals = events.groupBy("key").count()
        return totals.writeStream.format("epochal.map").option("map", "totals").outputMode("update")

    Job.submit("totals", "myjobs:build", JobConfig(guarantee="exactly-once")).join()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epochal.api import Job, list_jobs
    from epochal.config import JobConfig
    from epochal.spark.foreach_batch import foreach_batch
    from epochal.state.jobs import JobRecord, JobStatus
    from epochal_sdk import Guarantee

__all__ = [
    "Guarantee",
    "Job",
    "JobConfig",
    "JobRecord",
    "JobStatus",
    "foreach_batch",
    "list_jobs",
    "register",
]
__version__ = "0.1.0"

_LAZY = {
    "Job": "epochal.api",
    "list_jobs": "epochal.api",
    "JobConfig": "epochal.config",
    "JobRecord": "epochal.state.jobs",
    "JobStatus": "epochal.state.jobs",
    "Guarantee": "epochal_sdk",
    "foreach_batch": "epochal.spark.foreach_batch",
}


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use: the Python processes Spark starts for a query
    import ``epochal.spark`` (and so this package) but never the supervisor's modules."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'epochal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def register(spark: Any, names: list[str] | None = None) -> list[str]:
    """Register the installed connectors on a SparkSession (``format("epochal.<name>")``).
    Refused with an :class:`~epochal_sdk.EpochalError` that says what to do on a pyspark
    without the Python data source API (3.5: the ``foreachBatch`` writers instead)."""
    from epochal.spark import features

    refusal = features.data_source_refusal()
    if refusal:
        from epochal_sdk import EpochalError

        raise EpochalError(f"epochal.register: {refusal}")
    untested = features.untested_release()
    if untested:
        import logging

        logging.getLogger("epochal").warning("epochal.register: %s", untested)
    from epochal.spark.datasource import register as _register

    return _register(spark, names)
