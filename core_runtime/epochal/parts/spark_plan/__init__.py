"""Every part of a streaming query, read before it starts: its sources and its sink, Spark's
own included, each with the guarantee it can give inside an epochal job.

epochal's own parts (``format("epochal.<name>")``) are checked by epochal's data source when
Spark plans them (:func:`epochal.parts.effective.effective`); this package lists them and
leaves them to that check. Every other part is judged here, from one table
(:data:`SPARK_PARTS`), before the query starts:

* sources: Kafka, files, rate, Delta, Iceberg are replayable (exactly-once); socket and
  memory are not (none);
* sinks: Spark's Kafka sink and ``foreach`` give at-least-once, the file sink exactly-once
  through its own log, ``console`` and ``memory`` none, Delta's and Iceberg's sinks
  exactly-once (idempotent per batch id), ``foreachBatch`` at-least-once unless the job
  declares its function idempotent with the writer option :data:`IDEMPOTENT_FOREACH_BATCH`
  (``epochal.foreachBatchIdempotent`` = ``true``);
* a Python data source that is not epochal's gives what its class declares in the attribute
  :data:`DECLARED_GUARANTEE` (``epochal_guarantee = "exactly-once"``), else at-least-once;
* anything else is unknown: at most at-least-once, so refused under exactly-once.

A batch (static) relation joined to a stream is read whole in every micro-batch: it is listed
with the role ``static`` and counts for nothing.

Use: ``plan = read_query(writer)`` on a PySpark classic ``DataStreamWriter`` that is not
started, then ``verdict = judge(plan.parts, asked, allow_downgrade=...)``; ``verdict.to_json()``
is what a job record shows, :func:`part_records` what the run's store keeps of each part. The
plan is read through py4j from the JVM: the DataFrame's analysed logical plan and the JVM
writer's private fields (``source``, ``extraOptions``). A Spark Connect writer has no JVM
objects in this process: :func:`read_query` raises :class:`UnreadablePlanError`.

A supervised driver reads its query before it starts it. A query started in a plain session
is read once started, before Spark plans its sources and sink (:func:`read_started_query`,
from a ``StreamingQueryListener``'s ``onQueryStarted``, which Spark calls synchronously
before it plans them): :func:`check_session_query` warns about every part below the job's
guarantee and, under exactly-once, writes a refusal that epochal's data source raises when it
plans the query (:func:`session_refusal`). The verdict is kept per driver JVM
(``sessions/<driver>.verdict.json`` in the job's directory) and written again at every query
start, so a query never meets another one's, nor a verdict of an earlier JVM.
"""

from epochal.parts.spark_plan.capabilities import (
    DECLARED_GUARANTEE,
    EPOCHAL_FORMAT_PREFIX,
    FILE_FORMATS,
    IDEMPOTENT_FOREACH_BATCH,
    SPARK_PARTS,
    UNDECLARED_PYTHON,
    UNKNOWN_PART,
    Capability,
    Origin,
    PlanPart,
    QueryPlan,
    Role,
)
from epochal.parts.spark_plan.judgement import (
    PartResult,
    Verdict,
    below,
    judge,
    part_records,
    settled_by_partition,
)
from epochal.parts.spark_plan.jvm import UnreadablePlanError
from epochal.parts.spark_plan.reading import (
    StartedQuery,
    read_plan_sources,
    read_query,
    read_started_query,
)
from epochal.parts.spark_plan.session import (
    SESSION_VERDICT_SUFFIX,
    check_session_query,
    session_driver,
    session_refusal,
    session_verdict_path,
)

__all__ = [
    "DECLARED_GUARANTEE",
    "EPOCHAL_FORMAT_PREFIX",
    "FILE_FORMATS",
    "IDEMPOTENT_FOREACH_BATCH",
    "SESSION_VERDICT_SUFFIX",
    "SPARK_PARTS",
    "UNDECLARED_PYTHON",
    "UNKNOWN_PART",
    "Capability",
    "Origin",
    "PartResult",
    "PlanPart",
    "QueryPlan",
    "Role",
    "StartedQuery",
    "UnreadablePlanError",
    "Verdict",
    "below",
    "check_session_query",
    "judge",
    "part_records",
    "read_plan_sources",
    "read_query",
    "read_started_query",
    "session_driver",
    "session_refusal",
    "session_verdict_path",
    "settled_by_partition",
]
