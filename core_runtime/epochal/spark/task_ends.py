"""When the tasks of a stopped or failed Spark job have really ended.

A query stopped with ``query.stop()`` (or a batch whose job failed) has its job cancelled at
once, and the driver hears of the failure at once; but a task that was running goes on. Its
Python worker keeps running its step (a transactional sink's write and prepare) until it
next hands rows to the JVM, or until Spark kills it, ``spark.python.task.killTimeout`` (2 s)
after its monitor saw the kill, which it looks for every 2 s. A driver that rolls back the
stopped batch's transactions before those tasks ended can miss one that a task prepares a
second later: it stays in doubt until the job's next start.

Spark's status tracker alone cannot tell: its stages count a task as active only when an
update of the stage was written after the task started (at most every
``spark.ui.liveUpdate.period``), so a stage whose tasks all started at once shows none active
while they run; and the scheduler's pool drops a cancelled stage's task set at once. The task
scheduler's task set of each stage attempt can: it stays until each of its running tasks has
ended (the task's worker returned or was killed). The stages are those of the jobs of the job
group that a streaming query sets to its run id for every batch's jobs (the status tracker
lists a job once its start event, posted before any of its tasks runs, was delivered).
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("epochal.task_ends")

JOB_GROUP_PROPERTY = "spark.jobGroup.id"
"""The local property that holds a job's group (a streaming query's run id)."""
TASKS_END_SECONDS = 30.0
"""How long a stopped batch's settling waits for its tasks to end: Spark kills a cancelled
task's Python worker 2 to 4 s after the cancel; a task that ignores that is a stuck executor,
and the job's next start settles what it leaves."""
POLL_SECONDS = 0.05
NEWEST_JOBS = 10
"""How many of the group's newest jobs are looked at: a batch the stop interrupted is among
them (a query's run has a job or a few per batch)."""


def job_group(spark: Any) -> str | None:
    """The job group of the calling thread's jobs (in a ``foreachBatch`` function: the
    query's run id), or None when it has none or Spark cannot be asked."""
    try:
        group = spark.sparkContext.getLocalProperty(JOB_GROUP_PROPERTY)
    except Exception:  # a Spark Connect session: no SparkContext here
        return None
    return str(group) if group else None


def running_tasks(spark: Any, group: str) -> int:
    """How many tasks of the newest jobs of ``group`` are still running, by the task
    scheduler's task sets (see the module doc).

    Raises:
        Exception: Spark's scheduler cannot be read here (a Spark Connect session, a stopped
            context).
    """
    context = spark.sparkContext
    tracker = context.statusTracker()
    scheduler = context._jsc.sc().taskScheduler()
    running = 0
    for job in sorted(tracker.getJobIdsForGroup(group))[-NEWEST_JOBS:]:
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info is not None else ():
            stage_info = tracker.getStageInfo(stage)
            attempts = stage_info.currentAttemptId if stage_info is not None else 0
            for attempt in range(attempts + 1):
                manager = scheduler.taskSetManagerForAttempt(stage, attempt)
                if manager.isDefined():
                    running += int(manager.get().runningTasks())
    return running


def wait_for_tasks_to_end(spark: Any, group: str, seconds: float = TASKS_END_SECONDS) -> bool:
    """Wait until no task of the jobs of ``group`` runs any more, at most ``seconds``.

    Returns:
        whether they ended (also when the context stopped meanwhile: its tasks ended with
        it); False at the deadline, or when Spark's scheduler cannot be read here.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            if running_tasks(spark, group) == 0:
                return True
        except Exception as exc:
            if _stopped(spark):
                return True  # its tasks ended with it
            log.debug("epochal: the tasks of %s cannot be followed: %s", group, exc)
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


def _stopped(spark: Any) -> bool:
    """Whether ``spark``'s context has been stopped (``spark.stop()``)."""
    try:
        return spark.sparkContext._jsc is None
    except Exception:  # a Spark Connect session: no SparkContext here, never "stopped"
        return False
