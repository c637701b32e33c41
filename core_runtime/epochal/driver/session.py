"""What the driver asks of its SparkSession (executors, running jobs, whether it is alive);
the job's function and environment; the planner workers kept warm between runs. The session's
profile and how it is built are :mod:`epochal.startup.session`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import threading
import time
from typing import Any

from epochal.parts.job_context import (
    ENV_ALLOW_DOWNGRADE,
    ENV_FAULTS,
    ENV_GUARANTEE,
    ENV_JOB,
    ENV_JOB_DIR,
)
from epochal.state.jobs import JobDirectory, JobRecord

log = logging.getLogger("epochal.driver")


def expected_executors(master: str, conf: dict[str, str] | None = None) -> int:
    """How many executors the job asks for: ``local-cluster[N,…]``'s N; on a cluster
    ``spark.executor.instances``, or ``spark.cores.max / spark.executor.cores``; else 1."""
    match = re.match(r"local-cluster\[(\d+)", master)
    if match:
        return int(match.group(1))
    if master.startswith("local"):
        return 1
    conf = conf or {}
    with contextlib.suppress(ValueError):
        if conf.get("spark.executor.instances"):
            return max(1, int(conf["spark.executor.instances"]))
        if conf.get("spark.cores.max"):
            per = int(conf.get("spark.executor.cores") or 1)
            return max(1, int(conf["spark.cores.max"]) // max(1, per))
    return 1


def executor_count(spark: Any) -> int:
    """Executors registered now (the driver alone counts as one in local mode)."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return max(1, status.size() - 1) if status.size() > 1 else 1


def wait_for_executors(spark: Any, wanted: int, seconds: float) -> int:
    """Wait (with a deadline) until ``wanted`` executors registered; the count reached."""
    deadline = time.monotonic() + seconds
    count = executor_count(spark)
    while count < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        count = executor_count(spark)
    return count


def session_alive(spark: Any) -> bool:
    """Whether the session's JVM and SparkContext are up (not stopped, not gone)."""
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:
        return False


def running_jobs(spark: Any) -> list[int]:
    """The Spark jobs running now, but the driver's own keep-warm jobs (the query's)."""
    from epochal.startup.warmup import KEEP_WARM_JOB_GROUP  # imports pyspark and pyarrow

    tracker = spark.sparkContext.statusTracker()
    keeping = set(tracker.getJobIdsForGroup(KEEP_WARM_JOB_GROUP))
    return [job for job in tracker.getActiveJobsIds() if job not in keeping]


def wait_for_idle(spark: Any, seconds: float) -> None:
    """Wait (with a deadline) until no Spark job of the failed query runs any more; cancel
    what is left, so no straggler task of the old run prepares after the new run's recovery."""
    deadline = time.monotonic() + seconds
    while running_jobs(spark) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running_jobs(spark):
        spark.sparkContext.cancelAllJobs()


def load_target(target: str) -> Any:
    """Import ``module:function``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target {target!r} must look like module:function")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def job_environment(record: JobRecord, jobdir: JobDirectory) -> None:
    """Point this process at the job: its environment (for code that reads it) and the
    Python path it was submitted with."""
    config = record.job_config
    os.environ.update(
        {
            ENV_JOB: record.name,
            ENV_JOB_DIR: jobdir.path,
            ENV_GUARANTEE: config.guarantee.label,
            ENV_ALLOW_DOWNGRADE: "1" if config.allow_downgrade else "0",
            ENV_FAULTS: config.faults,
        }
    )
    for entry in reversed(record.python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)


class PlannerKeeper:
    """Keeps the Python workers that a query's start takes (its planners) alive while the
    driver runs the job, so an in-place restart finds them: one tiny batch job through the
    warm-up source every :data:`~epochal.startup.warmup.KEEP_WARM_SECONDS` (see
    :func:`~epochal.startup.warmup.touch_planners`); a failure there is only logged."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def start(self) -> None:
        threading.Thread(target=self._keep, name="epochal-keep-warm", daemon=True).start()

    def _keep(self) -> None:
        from epochal.startup import warmup  # not at the top: the supervisor imports this module

        registered = False
        while True:
            time.sleep(warmup.KEEP_WARM_SECONDS)
            try:
                if not registered:
                    warmup.register(self.spark)
                    registered = True
                warmup.touch_planners(self.spark)
            except Exception:  # a cancel of every job: next round
                if not session_alive(self.spark):
                    return  # the driver is ending
                log.warning("keeping the planner workers warm failed", exc_info=True)
