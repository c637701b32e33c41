"""epochal: fault-tolerant stream pipelines on Spark Structured Streaming.

Submit a job::

    from epochal import Job, JobConfig

    def build(spark):
        events = spark.readStream.format("epochal.map").option("map", "events").load()
        totals = events.groupBy("key").count()
        return totals.writeStream.format("epochal.map").option("map", "totals").outputMode("update")

    Job.submit("totals", "myjobs:build", JobConfig(guarantee="exactly-once")).join()
"""

from epochal.api import Job, list_jobs
from epochal.config import JobConfig
from epochal.jobs import JobRecord, JobStatus
from epochal_sdk import Guarantee

__all__ = ["Guarantee", "Job", "JobConfig", "JobRecord", "JobStatus", "list_jobs", "register"]
__version__ = "0.1.0"


def register(spark, names=None):
    """Register the installed connectors on a SparkSession (``format("epochal.<name>")``)."""
    from epochal.spark.datasource import register as _register

    return _register(spark, names)
