"""The peer of :mod:`integration.bench.flink_bench`: a PyFlink SQL job that copies one Kafka
topic into another, exactly-once, and ends when it has read the input to its end.

Run by the PyFlink virtual environment's interpreter (apache-flink is not a dependency of the
suite), with one JSON argument: ``bootstrap``, ``source``, ``sink``, ``jars`` (the Kafka SQL
connector), ``parallelism``, ``checkpoint_ms``, ``transactional_id_prefix`` and, optionally,
``bounded`` (default true; false: the job reads on until it is killed, for the latency
benchmark).

It is the job a Flink user writes for this copy: the Kafka SQL connector on both sides
(``raw`` key and value), the source bounded at the offsets it finds at start
(``scan.bounded.mode = latest-offset``, so the job finishes as an ``availableNow`` query
does), the sink with ``sink.delivery-guarantee = exactly-once`` (Kafka transactions committed
when a checkpoint completes, the last one when the input ends), checkpoints every
``checkpoint_ms``. It prints ``submitted`` when the job is submitted and ``finished`` when it
ended; the benchmark times the output itself, through its own read_committed reader.
"""

import json
import sys


def main() -> None:
    """Run the copy described by ``sys.argv[1]`` to its end."""
    spec = json.loads(sys.argv[1])
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("pipeline.jars", ";".join(f"file://{jar}" for jar in spec["jars"]))
    config.set("parallelism.default", str(spec["parallelism"]))
    config.set("execution.checkpointing.interval", f"{spec['checkpoint_ms']} ms")
    config.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    kafka = f"'connector' = 'kafka', 'properties.bootstrap.servers' = '{spec['bootstrap']}'"
    bounded = (
        ",\n            'scan.bounded.mode' = 'latest-offset'" if spec.get("bounded", True) else ""
    )
    raw = (
        "'key.format' = 'raw', 'key.fields' = 'k', 'value.format' = 'raw', "
        "'value.fields-include' = 'EXCEPT_KEY'"
    )
    env.execute_sql(
        f"""CREATE TABLE source_topic (k BYTES, v BYTES) WITH ({kafka}, {raw},
            'topic' = '{spec["source"]}',
            'properties.group.id' = 'flink-bench',
            'scan.startup.mode' = 'earliest-offset'{bounded})"""
    )
    env.execute_sql(
        f"""CREATE TABLE sink_topic (k BYTES, v BYTES) WITH ({kafka}, {raw},
            'topic' = '{spec["sink"]}',
            'sink.delivery-guarantee' = 'exactly-once',
            'sink.transactional-id-prefix' = '{spec["transactional_id_prefix"]}',
            'properties.transaction.timeout.ms' = '600000')"""
    )
    result = env.execute_sql("INSERT INTO sink_topic SELECT k, v FROM source_topic")
    print("submitted", flush=True)
    result.wait()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
