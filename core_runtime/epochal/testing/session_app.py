"""A user's application, as the conformance kit's plain-session scenario runs it: a plain
SparkSession (no ``epochal run``, no supervisor), the kit's pipeline with the job given in
the options of its source and sink, the Spark checkpoint where the user chose it, and an
``availableNow`` trigger. It exits 0 once the query has processed everything, non-zero when
the query failed: an outside restarter (the kit, standing for YARN or a restart policy)
starts it again until it succeeds.

It calls ``epochal.register(spark)`` unless the spec says ``"register": false``: then Spark
finds epochal's formats by itself and the session check attaches itself at the query's start
(:mod:`epochal.spark.attach`, from epochal's installed wheel).

``python -m epochal.testing.session_app CHECKPOINT [STOP_FILE]`` with the kit's spec in
``EPOCHAL_CONFORMANCE_SPEC`` (see :mod:`epochal.pipelines`): once ``STOP_FILE`` exists, the
application stops its query and its session (``query.stop()`` and ``spark.stop()``, as a
deployment's shutdown hook does) and exits with :data:`STOPPED`.
"""

from __future__ import annotations

import json
import os
import sys

from epochal.pipelines import SPEC_ENV

MASTER = "local[2,4]"
"""Two cores, and a failed task is retried (as the kit's supervised scenarios run)."""
STOPPED = 3
"""The exit code after the query was stopped on request (``STOP_FILE`` appeared): not
finished; the restarter starts the application again."""


def main(argv: list[str] | None = None) -> int:
    """Run the query to its end; 0 when it finished, 1 when it failed."""
    args = sys.argv[1:] if argv is None else argv
    checkpoint = args[0]
    spec = json.loads(os.environ[SPEC_ENV])
    from epochal import pipelines
    from epochal.startup.session import SessionProfile, spark_session
    from epochal.testing.scenarios import TEST_SPARK_CONF

    spark = spark_session(SessionProfile(MASTER, tuple(sorted(TEST_SPARK_CONF.items()))))
    if uses_epochal_data_sources(spec) and spec.get("register", True):
        from epochal.spark.datasource import register

        register(spark)  # else Spark finds the formats and the session check attaches itself
    writer = getattr(pipelines, spec.get("pipeline", "copy"))(spark)
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    stop_file = args[1] if len(args) > 1 else ""
    try:
        while not query.awaitTermination(0.2):
            if stop_file and os.path.exists(stop_file):  # a graceful stop, as a shutdown hook
                query.stop()
                spark.stop()  # as a shutdown hook does; epochal's listener settles first
                return STOPPED
    except Exception as exc:  # the query failed: say why, exit non-zero for the restarter
        sys.stderr.write(f"session app: the query failed: {exc}\n")
        return 1
    return 0


def uses_epochal_data_sources(spec: dict) -> bool:
    """Whether the pipeline reads or writes an epochal connector as a Spark data source (it
    then needs ``epochal.register``, and pyspark 4); Spark's own source into a
    ``foreachBatch`` writer needs neither, and runs on pyspark 3.5 too."""
    return not (spec.get("source_format") and spec.get("sink_path") == "foreachBatch")


if __name__ == "__main__":
    sys.exit(main())
