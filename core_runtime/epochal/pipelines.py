"""The pipelines the conformance kit runs. The driver process imports them by name and reads
their parameters from the job's directory (or, for tests that set it, the environment)."""

from __future__ import annotations

import json
import os
from typing import Any

from epochal.parts.job_context import ENV_JOB_DIR

SPEC_ENV = "EPOCHAL_CONFORMANCE_SPEC"
SPEC_FILE = "conformance.json"
"""The kit writes a scenario's spec into the job's directory: a warm driver (a standby, a
driver of a pool) started before the scenario cannot see it in its environment."""


def _spec() -> dict[str, Any]:
    directory = os.environ.get(ENV_JOB_DIR)
    if directory and os.path.exists(f"{directory}/{SPEC_FILE}"):
        with open(f"{directory}/{SPEC_FILE}") as fh:
            return dict(json.load(fh))
    return dict(json.loads(os.environ[SPEC_ENV]))


def _source(spark: Any, spec: dict[str, Any]) -> Any:
    return (
        spark.readStream.format(f"epochal.{spec['source']}")
        .options(**spec["source_options"])
        .load()
    )


def copy(spark: Any) -> Any:
    """source → ``key`` = the record ID, ``value`` = the ID again → sink."""
    spec = _spec()
    out = _source(spark, spec).selectExpr(
        f"CAST({spec['id_expr']} AS STRING) AS key", f"CAST({spec['id_expr']} AS STRING) AS value"
    )
    return (
        out.writeStream.format(f"epochal.{spec['sink']}")
        .options(**spec["sink_options"])
        .outputMode("append")
    )


def running_totals(events: Any, key_expr: str, id_column: str = "id") -> Any:
    """A keyed running aggregation in Spark state: for every key updated in a batch, one row
    ``(key, "<count>:<sum of ids>")`` with the totals so far.

    Spark's Python data source sinks take append mode only, so the running aggregation is a
    stateful operator (``applyInPandasWithState``, state in the state store, restored per batch
    version) that emits in append mode, instead of ``groupBy().agg()`` in update mode.
    """
    from pyspark.sql.streaming.state import GroupStateTimeout

    def update(key: tuple[str], frames: Any, state: Any) -> Any:
        import pandas as pd

        count, total = state.get if state.exists else (0, 0)
        for frame in frames:
            count += len(frame)
            total += int(frame[id_column].sum())
        state.update((count, total))
        yield pd.DataFrame({"key": [key[0]], "value": [f"{count}:{total}"]})

    keyed = events.selectExpr(
        f"CAST({key_expr} AS STRING) AS key", f"CAST({id_column} AS BIGINT) AS {id_column}"
    )
    return keyed.groupBy("key").applyInPandasWithState(
        update,
        outputStructType="key string, value string",
        stateStructType="n long, total long",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def aggregate(spark: Any) -> Any:
    """source → running count and ID sum per group (Spark state) → sink.

    A group's last ``value`` is ``"<count>:<sum of ids>"``, so a lost or duplicated record
    shows up in the count and the sum of its group.
    """
    spec = _spec()
    groups = int(spec.get("groups", 10))
    events = _source(spark, spec).selectExpr(f"CAST({spec['id_expr']} AS BIGINT) AS id")
    totals = running_totals(events, f"id % {groups}")
    return (
        totals.writeStream.format(f"epochal.{spec['sink']}")
        .options(**spec["sink_options"])
        .outputMode("append")
    )
