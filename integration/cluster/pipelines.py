"""The pipeline of the cluster tests: Kafka → a marking step → PostgreSQL, exactly-once.

The job's driver imports it by name (``integration.cluster.pipelines:marked_copy``), the
executors import it to run the marking step. Its parameters come from the environment
(:data:`SPEC_ENV`: the supervisor's, inherited by every driver it starts).

The marking step is a pandas UDF that, for every task attempt, writes a *start* marker
(batch, partition, attempt, the Python worker's pid and its process ancestry, so the test
knows which worker's executor runs it), holds the task for ``task_seconds`` (a window in
which the test can kill that worker while the task runs), then writes an *end* marker.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

SPEC_ENV = "EPOCHAL_CLUSTER_TEST_SPEC"


def _ancestry() -> list[int]:
    """This process and its ancestors (pids)."""
    chain, pid = [], os.getpid()
    while pid > 1 and len(chain) < 12:
        chain.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain


def _marker(directory: str, kind: str, payload: dict[str, Any]) -> None:
    name = "{batch}-{partition}-{attempt}-{pid}".format(**payload)
    path = Path(directory, f"{kind}-{name}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.rename(path)


def read_markers(directory: str, kind: str) -> list[dict[str, Any]]:
    """Every marker of ``kind`` (``start`` or ``end``) written so far."""
    found = []
    for path in Path(directory).glob(f"{kind}-*"):
        if path.suffix != ".tmp":
            found.append(json.loads(path.read_text()))
    return found


def marked_copy(spark: Any) -> Any:
    """Kafka topic → key = value = the record ID (through the marking step) → JDBC table."""
    from pyspark.sql.functions import pandas_udf

    spec = json.loads(os.environ[SPEC_ENV])
    markers, hold = spec["markers"], float(spec["task_seconds"])

    @pandas_udf("string")  # type: ignore[call-overload]
    def mark(ids: pd.Series) -> pd.Series:
        from pyspark import TaskContext

        context = TaskContext.get()
        payload = {
            "batch": int(context.getLocalProperty("streaming.sql.batchId") or -1),
            "partition": context.partitionId(),
            "attempt": context.attemptNumber(),
            "pid": os.getpid(),
            "chain": _ancestry(),
            "rows": len(ids),
        }
        _marker(markers, "start", payload)
        time.sleep(hold)
        _marker(markers, "end", payload)
        return ids.astype("int64").astype(str)

    source = spark.readStream.format("epochal.kafka").options(**spec["source_options"]).load()
    ids = source.selectExpr(f"CAST({spec['id_expr']} AS BIGINT) AS id")
    out = ids.select(mark("id").alias("key")).selectExpr("key", "key AS value")
    return (
        out.writeStream.format("epochal.jdbc").options(**spec["sink_options"]).outputMode("append")
    )
