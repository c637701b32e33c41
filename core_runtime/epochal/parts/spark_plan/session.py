"""The check of a query started in a plain session (not by a supervised driver): read once
started, before Spark plans its sources and sink (from a ``StreamingQueryListener``'s
``onQueryStarted``), judged against the job its ``epochal.*`` options give; a refusal under
exactly-once is written to the driver JVM's verdict in the job's directory, which epochal's
data source raises when Spark plans the query (:func:`session_refusal`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from epochal.base import files, processes
from epochal.parts.job_context import JobContext
from epochal.parts.spark_plan.judgement import PartResult, Verdict, below, refusal_message
from epochal.parts.spark_plan.reading import read_started_query
from epochal.state.layout import JobLayout
from epochal.state.lease.session import DriverJvm, record_path
from epochal_sdk import EpochalError, Guarantee

log = logging.getLogger("epochal.parts.spark_plan")

SESSION_VERDICT_SUFFIX = ".verdict.json"
"""A session driver's verdict: ``sessions/<driver>.verdict.json`` in the job's directory,
beside the driver's session record (:mod:`epochal.state.lease.session`)."""


def session_driver(spark: Any) -> DriverJvm:
    """The driver JVM of the classic SparkSession ``spark``, as its Python workers name it
    (:meth:`DriverJvm.current`): its pid comes from the JVM itself, so it is right whether
    Python started the JVM (``python app.py``) or the JVM started Python (``spark-submit``)."""
    pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    return DriverJvm(pid, processes.start_ticks(pid) or 0)


def session_verdict_path(job_dir: str, driver: DriverJvm) -> str:
    """Where the session check keeps ``driver``'s verdict for the job in ``job_dir``."""
    snapshot_dir, _, name = job_dir.rstrip("/").rpartition("/")
    sessions = JobLayout(snapshot_dir, name).sessions
    return os.path.join(sessions, f"{driver.key}{SESSION_VERDICT_SUFFIX}")


def check_session_query(spark: Any, query_id: str, driver: DriverJvm) -> dict[str, Any] | None:
    """Check a query just started in a plain session (``epochal.register``'s listener calls
    it from ``onQueryStarted``, before Spark plans the query's sources and sink).

    A query with an epochal source or sink runs in the job its ``epochal.*`` options give
    (:meth:`JobContext.current`). Every part judged here that gives less than that job's
    guarantee is named in a warning (the driver's log). Under exactly-once, unless the job
    allows the downgrade (``epochal.allowDowngrade``), the query is refused: the refusal is
    written to the driver's verdict in the job's directory, and epochal's data source raises
    it as a ``GuaranteeError`` when Spark plans the query, before any batch runs
    (:func:`session_refusal`). The verdict is written at every start of a query of the job,
    refusing or not, so a later query of the same driver never meets an earlier one's. A
    query not refused holds its job's lease from here, and a start after the first in this
    driver begins a new run (:func:`_start_of_query`).

    Returns:
        the verdict written (also when the job has no directory to write it to), or None when
        the query has no epochal part (it is none of epochal's business).
    """
    query = spark.streams.get(query_id)
    if query is None:
        return None
    started = read_started_query(spark, query._jsq.streamingQuery())
    if not started.has_epochal_part:
        return None
    context = JobContext.current(started.job_options)
    asked, parts = context.guarantee, started.plan.parts
    short = below(parts, asked)
    refused = bool(short) and asked is Guarantee.EXACTLY_ONCE and not context.allow_downgrade
    message = refusal_message(short, asked, in_session=True) if refused else None
    name = str(query.name or query_id)
    for part in short:
        assert part.guarantee is not None
        log.warning(
            "epochal: query %r of job %r: %s can give at most %s (%s), below the job's "
            "guarantee %s%s",
            name,
            context.job,
            part.name,
            part.guarantee.label,
            part.why,
            asked.label,
            "; the query is refused before its first batch" if refused else "",
        )
    verdict = Verdict(
        asked,
        context.allow_downgrade,
        min([asked, *(p.guarantee for p in short if p.guarantee is not None)]),
        tuple(
            PartResult(p, min(asked, p.guarantee) if p.guarantee is not None else None, p in short)
            for p in parts
        ),
    )
    written = {
        "driver": driver.key,
        "job": context.job,
        "query_id": query_id,
        "run_id": str(query.runId),
        "query_name": name,
        "refused": message,
        "verdict": verdict.to_json(),
        "written": time.time(),
    }
    if context.job_dir:
        path = session_verdict_path(context.job_dir, driver)
        files.makedirs(os.path.dirname(path))
        temporary = f"{path}.{os.getpid()}.tmp"
        with files.open_private(temporary) as fh:
            json.dump(written, fh)
        os.replace(temporary, path)
        if not refused:
            held = _start_of_query(context, started.job_options, driver, name, str(query.runId))
            if held is not None:
                written["session_record"] = held
                written["job_dir"] = context.job_dir
    return written


def _start_of_query(
    context: JobContext, options: Any, driver: DriverJvm, query_name: str, run_id: str
) -> str | None:
    """The job's query starts in this driver: the driver holds the job's lease from here,
    and every start of the query after the first in this driver's JVM begins a new run
    (:func:`~epochal.state.lease.session.hold` with ``query_start``), before Spark plans
    the query's parts, so that its sinks' recovery at the start of the run settles what the
    stopped query left prepared, as a new driver's would (``run_id``: the query's Spark run
    id; its ``foreachBatch`` writer claims the same start again, which changes nothing). A
    lease that cannot be held is only noted here: the query's planning meets it again and
    fails with it.

    Returns:
        the driver's session record of the job (:func:`~epochal.state.lease.session.
        record_path`), which the driver's query fence watches, or None when no lease is
        held."""
    try:
        held = context.holding_the_lease(options, driver, query_start=run_id)
    except EpochalError as exc:
        log.warning(
            "epochal: query %r of job %r: the job's lease is not held: %s",
            query_name,
            context.job,
            exc,
        )
        return None
    if not held.fence.active or held.job_dir is None:
        return None
    snapshot_dir, _, name = held.job_dir.rstrip("/").rpartition("/")
    return record_path(JobLayout(snapshot_dir, name), driver)


def session_refusal(context: JobContext) -> str | None:
    """The refusal the session check wrote for the query this process's driver JVM plans now
    (:func:`check_session_query`), or None: for a supervised run (its driver judged the
    query before it started it), a job without a directory, no verdict, or a verdict that
    does not refuse. Read by epochal's data source when Spark plans a streaming read or
    write."""
    if context.supervised or not context.job_dir:
        return None
    path = session_verdict_path(context.job_dir, DriverJvm.current())
    try:
        with open(path) as fh:
            found = json.load(fh)
    except (OSError, ValueError):
        return None
    refusal = found.get("refused") if isinstance(found, dict) else None
    return str(refusal) if refusal else None
