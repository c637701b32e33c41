"""End-to-end latency, Kafka → Kafka through Spark: how late a record becomes visible to a
``read_committed`` reader, for epochal's exactly-once and at-least-once pipelines beside
Spark's own at-least-once Kafka pair, at a fixed input rate below saturation.

    python -m integration.bench.latency_bench [--rounds 3] [--rate 2000] [--seconds 20]
        [--warmup 5] [--triggers 1,0] [--plot latency-bench.png] [--json latency.json]
        [--smoke]

Five ways to copy one topic into another, each a fresh streaming query (new input and output
topic, checkpoint and epochal job) that runs until every record it was given is visible:

* ``epochal exactly-once``: ``epochal.kafka`` source → ``epochal.kafka`` sink,
  ``mode=transactional``, in an exactly-once job (a record is visible when its batch's
  transactions commit);
* ``fast path, in order → epochal (EO)``: Spark's Kafka source read in order
  (``format("kafka-ordered")``, :mod:`epochal.spark.ordered_kafka`: no shuffle), epochal's
  Kafka sink, ``mode=transactional``, in an exactly-once job;
* ``fast path, in order → foreachBatch epochal (EO)``: the same source, epochal's Kafka sink
  as a ``foreachBatch`` writer (:func:`epochal.foreach_batch`), ``mode=transactional``, in an
  exactly-once job;
* ``epochal at-least-once``: ``epochal.kafka`` → ``epochal.kafka``, ``mode=idempotent``, in an
  at-least-once job;
* ``Spark Kafka → Spark Kafka (ALO)``: Spark's own Kafka source and sink (at-least-once).
* ``PyFlink exactly-once`` (with ``--pyflink``, under triggers above 0 only): a PyFlink SQL job
  (:mod:`integration.bench.flink_job`) with Flink's Kafka SQL connector on both sides,
  exactly-once, checkpointing every trigger interval (a record is visible when the checkpoint
  after it completes and the sink's transactions commit); it counts as started once a
  readiness record went through it.

The trigger is a parameter (``--triggers``, seconds between micro-batches; ``0``: as fast as
possible, the next batch as soon as the last ends): every way runs under each.

A run: the query starts on the empty input topic and is waited for until its first trigger has
found no data (the query's start-up is not measured); then a producer in this process writes
``rate`` records a second (100 B, key = the record's number, two partitions, ``linger.ms`` 0)
for ``warmup`` + ``seconds`` seconds, each with its Kafka timestamp set when it is produced
(CreateTime, milliseconds) and written into its value too; a ``read_committed`` consumer of
the output topic (``fetch.wait.max.ms`` 10) notes when each record arrives. A record's latency
is its arrival time minus its Kafka timestamp (one clock: everything runs on this machine);
records of the first ``warmup`` seconds (the query's first batches with data: Python workers,
JIT) are not measured. A run's figures are the p50, p99 and max over its measured records;
a record seen twice (at-least-once after a retry) counts once, at its first arrival, and the
duplicates and any record never seen are printed.

Each round runs every way under every trigger once, in an order rotated from round to round;
the table prints, per trigger and way, the median over the rounds of each figure with its
interquartile range and a bootstrap 95% interval, and the ratio of exactly-once p99 to Spark's
own pair's p99 within each round (target <= 1.2). The plot (matplotlib) shows the per-round
figures and ratios. Kafka comes from the harness (or ``EPOCHAL_KAFKA_BOOTSTRAP``); Spark's
Kafka connector from the harness cache (:func:`integration.bench.kafka_bench.spark_kafka_jars`).
``--smoke`` runs one round of 3 + 2 seconds at 200 records a second: a check that the command
works, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from epochal.spark import ordered_kafka
from integration.bench.common import (
    SMOKE_HELP,
    bench_session,
    epochal_options,
    machine,
    mean_phases,
    quantile,
    rotated,
    smoke_run,
    spread,
    write_runs,
)
from integration.bench.flink_bench import FLINK_JOB, flink_kafka_jar, pyflink_python
from integration.bench.kafka_bench import (
    PARTITIONS,
    VALUE_BYTES,
    Bench,
    bench_place,
    epochal_kafka_reader,
    spark_kafka_jars,
)

EXACTLY_ONCE = "epochal exactly-once"
FAST_IN_ORDER = "fast path, in order → epochal (EO)"
FB_IN_ORDER = "fast path, in order → foreachBatch epochal (EO)"
AT_LEAST_ONCE = "epochal at-least-once"
SPARK_KAFKA = "Spark Kafka → Spark Kafka (ALO)"
PYFLINK = "PyFlink exactly-once"
"""A PyFlink SQL job (:mod:`integration.bench.flink_job`, unbounded) with Flink's Kafka SQL
connector, exactly-once, checkpointing every trigger interval (``--pyflink``; not under the
as-fast-as-possible trigger, which Flink's checkpoints have no counterpart of)."""
WAYS = (EXACTLY_ONCE, FAST_IN_ORDER, FB_IN_ORDER, AT_LEAST_ONCE, SPARK_KAFKA, PYFLINK)
RATIOS = {
    f"p99 {EXACTLY_ONCE} / {SPARK_KAFKA}": (EXACTLY_ONCE, SPARK_KAFKA),
    f"p99 {FAST_IN_ORDER} / {SPARK_KAFKA}": (FAST_IN_ORDER, SPARK_KAFKA),
    f"p99 {FB_IN_ORDER} / {SPARK_KAFKA}": (FB_IN_ORDER, SPARK_KAFKA),
    f"p99 {AT_LEAST_ONCE} / {SPARK_KAFKA}": (AT_LEAST_ONCE, SPARK_KAFKA),
    f"p99 {EXACTLY_ONCE} / {PYFLINK}": (EXACTLY_ONCE, PYFLINK),
    f"p99 {FAST_IN_ORDER} / {PYFLINK}": (FAST_IN_ORDER, PYFLINK),
}
"""Ratios of p99 latency within a round (lower is better)."""
TARGETS = {
    f"p99 {EXACTLY_ONCE} / {SPARK_KAFKA}": 1.2,
    f"p99 {FAST_IN_ORDER} / {SPARK_KAFKA}": 1.2,
    f"p99 {FB_IN_ORDER} / {SPARK_KAFKA}": 1.2,
    f"p99 {EXACTLY_ONCE} / {PYFLINK}": 1.0,
}
"""The targets under a trigger interval: exactly-once p99 latency <= 1.2x Spark's own
at-least-once pair's at the same rate and trigger, and <= PyFlink's exactly-once p99 with its
checkpoint interval equal to the trigger interval."""
ASAP_TARGETS = {
    f"p99 {EXACTLY_ONCE} / {SPARK_KAFKA}": 2.0,
    f"p99 {FAST_IN_ORDER} / {SPARK_KAFKA}": 2.0,
    f"p99 {FB_IN_ORDER} / {SPARK_KAFKA}": 2.0,
}
"""The targets as fast as possible (trigger 0): exactly-once p99 <= 2x Spark's pair's (a
batch's fixed cost is the whole of a record's wait there)."""


def targets(trigger: float) -> dict[str, float]:
    """The p99 ratio targets under ``trigger`` (seconds; 0: as fast as possible)."""
    return ASAP_TARGETS if trigger == 0 else TARGETS


STAMP_DIGITS = 13
"""The value starts with the record's Kafka timestamp (ms) in this many digits."""
FIGURES = ("p50", "p99", "max")


@dataclass
class Run:
    """One way under one trigger in one round: its measured latencies (ms) and counts."""

    way: str
    trigger: float
    round: int
    latencies: list[float] = field(default_factory=list)
    produced: int = 0
    measured_from: int = 0
    """Records numbered below this were produced in the warm-up (not measured)."""
    seen: int = 0
    duplicates: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    """Mean ms per batch with data of Spark's ``durationMs`` phases (the query's first batch
    left out: it pays the start)."""

    def figure(self, name: str) -> float:
        """``p50``, ``p99`` or ``max`` of the measured latencies (ms)."""
        if not self.latencies:
            return float("nan")
        if name == "max":
            return max(self.latencies)
        return quantile(self.latencies, int(name[1:]) / 100)


class Arrivals:
    """A ``read_committed`` consumer of a topic in a thread of its own: per record number the
    ms from its Kafka timestamp (in its value) to its arrival here, the first arrival only."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"latency-{topic}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
                "log_level": 0,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.latency: dict[int, float] = {}
        self.duplicates = 0
        self.error: str = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"arrivals-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                messages = self.consumer.consume(1000, timeout=0.05)
                now = time.time() * 1000
                for message in messages:
                    if message.error() is not None:
                        if message.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        self.error = str(message.error())
                        return
                    number = int(message.key())
                    if number in self.latency:
                        self.duplicates += 1
                    else:
                        self.latency[number] = now - int(message.value()[:STAMP_DIGITS])
        finally:
            self.consumer.close()

    def wait_for(self, records: int, timeout: float) -> bool:
        """Whether records ``0 .. records - 1`` all arrived within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while len(self.latency) < records and time.monotonic() < deadline and not self.error:
            time.sleep(0.05)
        return len(self.latency) >= records

    def stop(self) -> None:
        """Stop reading and close the consumer."""
        self._stop.set()
        self._thread.join(30)


def produce_at_rate(bootstrap: str, topic: str, rate: int, seconds: float) -> int:
    """``rate`` records a second for ``seconds`` seconds, numbered from 0, round-robin over
    the partitions, each with its Kafka timestamp (now, ms) also at the start of its value;
    returns how many were produced. A record is produced when it is due (every 5 ms, the ones
    due since the last tick), not in bursts."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all", "log_level": 0}
    )
    pad = b"x" * (VALUE_BYTES - STAMP_DIGITS)
    total = int(rate * seconds)
    started = time.monotonic()
    number = 0
    while number < total:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        while number < due:
            stamp = int(time.time() * 1000)
            value = b"%0*d" % (STAMP_DIGITS, stamp) + pad
            producer.produce(
                topic, value, b"%d" % number, partition=number % PARTITIONS, timestamp=stamp
            )
            number += 1
        producer.poll(0)
        time.sleep(0.005)
    if producer.flush(60):
        raise RuntimeError(f"latency bench: input to {topic} not acknowledged within 60 s")
    return total


class Latency:
    """The ways on one broker and one SparkSession (``local[2]``, Spark's Kafka connector and
    epochal's ``kafka`` connector)."""

    def __init__(self, kafka: Bench, jars: list[str], pyflink: tuple[str, str] | None) -> None:
        self.kafka = kafka
        self.workdir = kafka.workdir
        self.pyflink = pyflink
        """PyFlink's interpreter and Flink's Kafka SQL connector jar (``--pyflink``), or None."""
        self.spark = bench_session(
            "epochal-latency-bench",
            ["kafka"],
            **{
                "spark.jars": ",".join([*jars, ordered_kafka.jar()]),
                "spark.sql.streaming.metricsEnabled": "false",
            },
        )

    def _query(self, way: str, source: str, out: str, job: str, trigger: float) -> Any:
        bootstrap = self.kafka.bootstrap
        if way in (EXACTLY_ONCE, AT_LEAST_ONCE):
            guarantee = "exactly-once" if way == EXACTLY_ONCE else "at-least-once"
            mode = "transactional" if way == EXACTLY_ONCE else "idempotent"
            common = epochal_options(f"{self.workdir}/snap", guarantee, job)
            rows = epochal_kafka_reader(self.spark, bootstrap, source, 100_000, common)
            writer = rows.select("key", "value").writeStream.format("epochal.kafka")
            writer = writer.option("mode", mode).options(**common)
        else:
            fmt = ordered_kafka.FORMAT if way in (FAST_IN_ORDER, FB_IN_ORDER) else "kafka"
            rows = (
                self.spark.readStream.format(fmt)
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", source)
                .option("startingOffsets", "earliest")
                .option("kafka.isolation.level", "read_committed")
                .load()
                .select("key", "value")
            )
            if way == FB_IN_ORDER:  # the writer's own options below: foreachBatch ignores them
                import epochal

                common = epochal_options(f"{self.workdir}/snap", "exactly-once", job)
                options = {"kafka.bootstrap.servers": bootstrap, "topic": out}
                write = epochal.foreach_batch(
                    "kafka", options={**common, **options, "mode": "transactional"}
                )
                writer = rows.writeStream.foreachBatch(write)
            elif way == FAST_IN_ORDER:
                common = epochal_options(f"{self.workdir}/snap", "exactly-once", job)
                writer = rows.writeStream.format("epochal.kafka")
                writer = writer.option("mode", "transactional").options(**common)
            else:
                writer = rows.writeStream.format("kafka")
        return (
            writer.option("kafka.bootstrap.servers", bootstrap)
            .option("topic", out)
            .option("checkpointLocation", f"{self.workdir}/cp-{job}")
            .trigger(processingTime=f"{trigger:g} seconds")
            .start()
        )

    def run(self, way: str, trigger: float, turn: str, args: argparse.Namespace) -> Run:
        """One query of ``way`` under ``trigger`` fed at ``args.rate`` records a second."""
        job = f"latency-{WAYS.index(way)}-{trigger:g}-{turn}".replace(".", "_")
        source, out = self.kafka.new_topic(), self.kafka.new_topic()
        arrivals = Arrivals(self.kafka.bootstrap, out)
        query: Any = None
        run = Run(way, trigger, -1, measured_from=int(args.rate * args.warmup))
        try:
            if way == PYFLINK:
                query = self._flink(source, out, job, trigger, arrivals)
            else:
                query = self._query(way, source, out, job, trigger)
                _wait_for_first_trigger(query, way)
            run.produced = produce_at_rate(
                self.kafka.bootstrap, source, args.rate, args.warmup + args.seconds
            )
            ready = 1 if way == PYFLINK else 0  # its readiness record
            arrivals.wait_for(run.produced + ready, timeout=60 + 3 * trigger)
            if way != PYFLINK:
                if query.exception() is not None:
                    raise RuntimeError(f"{way}: {query.exception()}")
                with_data = [p for p in query.recentProgress if p["numInputRows"] > 0]
                run.phases = mean_phases(with_data[1:] or with_data)
        finally:
            if query is not None:
                query.stop()
            arrivals.stop()
            self.kafka.drop_topic(source)
            self.kafka.drop_topic(out)
        if arrivals.error:
            raise RuntimeError(f"{way}: the output's reader failed: {arrivals.error}")
        run.seen = sum(1 for n in arrivals.latency if n >= 0)
        run.duplicates = arrivals.duplicates
        run.latencies = [ms for n, ms in arrivals.latency.items() if n >= run.measured_from]
        return run

    def _flink(self, source: str, out: str, job: str, trigger: float, arrivals: Arrivals) -> Any:
        """The PyFlink job copying ``source`` into ``out`` (checkpoints every ``trigger``),
        started in a process group of its own and running once a readiness record (number
        -1) went through it: submitted, reading, and its first checkpoint committed."""
        assert self.pyflink is not None
        python, jar = self.pyflink
        spec = {
            "bootstrap": self.kafka.bootstrap,
            "source": source,
            "sink": out,
            "jars": [jar],
            "parallelism": PARTITIONS,
            "checkpoint_ms": int(trigger * 1000),
            "transactional_id_prefix": f"{job}-{uuid.uuid4().hex[:8]}",
            "bounded": False,
        }
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
        job_process = FlinkProcess(
            subprocess.Popen(
                [python, str(FLINK_JOB), json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,
            )
        )
        producer = Producer({"bootstrap.servers": self.kafka.bootstrap, "log_level": 0})
        stamp = int(time.time() * 1000)
        value = b"%0*d" % (STAMP_DIGITS, stamp) + b"x" * (VALUE_BYTES - STAMP_DIGITS)
        producer.produce(source, value, b"-1", partition=0, timestamp=stamp)
        producer.flush(30)
        deadline = time.monotonic() + 300
        while -1 not in arrivals.latency:
            if job_process.process.poll() is not None or time.monotonic() > deadline:
                job_process.stop()
                raise RuntimeError(f"{PYFLINK}: not running:\n{job_process.output()[-3000:]}")
            time.sleep(0.1)
        return job_process

    def rounds(
        self, args: argparse.Namespace, triggers: list[float], log: Callable[[str], None]
    ) -> list[Run]:
        """``args.rounds`` rounds of every way under every trigger, in rotated orders."""
        cells = [
            (trigger, way)
            for trigger in triggers
            for way in WAYS
            if way != PYFLINK or (self.pyflink and trigger > 0)
        ]
        runs = []
        for number in range(args.rounds):
            for trigger, way in rotated(cells, number):
                run = self.run(way, trigger, f"r{number}", args)
                run.round = number
                runs.append(run)
                missing = run.produced - run.seen
                check = f"  MISSING {missing}" if missing else ""
                check += f"  ({run.duplicates} duplicates)" if run.duplicates else ""
                log(
                    f"round {number + 1}/{args.rounds} trigger {_trigger(trigger):>6} {way:34} "
                    + "  ".join(f"{f} {run.figure(f):>6.0f}" for f in FIGURES)
                    + f" ms{check}"
                )
        return runs


class FlinkProcess:
    """The PyFlink job's process (its JVM is a child of it), stopped as a query is."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def output(self) -> str:
        """What the job printed so far."""
        return "".join(self.lines)

    def stop(self) -> None:
        """Kill the job's process group (the Python driver and Flink's JVM)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)
        self._reader.join(10)


def _wait_for_first_trigger(query: Any, way: str, timeout: float = 180.0) -> None:
    """Wait until the query's first trigger has run (on the empty topic: Spark reports the
    first trigger that found no data), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(f"{way}: {query.exception()}")
        if query.recentProgress:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{way}: the query did not reach its first trigger in {timeout:g} s")


def _trigger(seconds: float) -> str:
    return "asap" if seconds == 0 else f"{seconds:g}s"


def per_round(runs: list[Run], trigger: float, way: str, name: str) -> list[float]:
    """The figure ``name`` of ``way`` under ``trigger`` in each round (round order)."""
    mine = sorted((r for r in runs if r.trigger == trigger and r.way == way), key=lambda r: r.round)
    return [r.figure(name) for r in mine if r.latencies]


def ratio_values(runs: list[Run], trigger: float) -> dict[str, list[float]]:
    """Per ratio label, its value in each round under ``trigger``."""
    by_round: dict[int, dict[str, Run]] = {}
    for run in runs:
        if run.trigger == trigger and run.latencies:
            by_round.setdefault(run.round, {})[run.way] = run
    out = {}
    for label, (top, bottom) in RATIOS.items():
        values = [
            r[top].figure("p99") / r[bottom].figure("p99")
            for r in by_round.values()
            if top in r and bottom in r and r[bottom].figure("p99") > 0
        ]
        if values:
            out[label] = values
    return out


def report(runs: list[Run], triggers: list[float]) -> str:
    """Per trigger: each way's figures (median over the rounds, IQR, 95% CI), then the
    ratios of p99 within each round."""
    lines = []
    for trigger in triggers:
        lines.append(f"trigger {_trigger(trigger)}: latency ms, median over rounds (IQR, 95% CI)")
        for way in WAYS:
            mine = [r for r in runs if r.trigger == trigger and r.way == way]
            if not mine:
                continue
            seen = sum(r.seen for r in mine)
            produced = sum(r.produced for r in mine)
            dupes = sum(r.duplicates for r in mine)
            lines.append(
                f"  {way:34} records seen {seen}/{produced}"
                + (f", {dupes} duplicates" if dupes else "")
            )
            for name in FIGURES:
                lines.append(f"    {name:4} {spread(per_round(runs, trigger, way, name))}")
        lines.append("  ratios of p99 within each round (lower is better):")
        goals = targets(trigger)
        for label, values in ratio_values(runs, trigger).items():
            goal = f" (target <= {goals[label]})" if label in goals else ""
            met = ""
            if label in goals:
                met = "  met" if statistics.median(values) <= goals[label] else "  MISSED"
            lines.append(f"    {label + goal}\n        {spread(values)}{met}")
        lines.append("  where the time goes, ms per batch with data (Spark's durationMs), mean:")
        for way in WAYS:
            mine = [r.phases for r in runs if r.trigger == trigger and r.way == way and r.phases]
            if mine:
                means = mean_phases([{"durationMs": p} for p in mine])
                shown = ", ".join(f"{k} {v:.0f}" for k, v in means.items() if v >= 1)
                lines.append(f"    {way:34} {shown}")
    return "\n".join(lines)


def plot(path: str, runs: list[Run], triggers: list[float], title: str) -> str | None:
    """A PNG: per trigger, each way's p50, p99 and max per round; then the p99 ratios per
    round with their targets (dashed). Without matplotlib nothing is written and the reason
    is returned."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    panels = len(triggers) + 1
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8))
    markers = {"p50": "o", "p99": "^", "max": "x"}
    for axis, trigger in zip(axes, triggers, strict=False):
        for index, way in enumerate(WAYS, start=1):
            for offset, name in zip((-0.2, 0.0, 0.2), FIGURES, strict=True):
                values = per_round(runs, trigger, way, name)
                axis.scatter(
                    [index + offset] * len(values),
                    values,
                    marker=markers[name],
                    color=f"C{FIGURES.index(name)}",
                    s=18,
                    label=name if index == 1 else None,
                )
        axis.set_xticks(range(1, len(WAYS) + 1), WAYS, rotation=15, ha="right", fontsize=7)
        axis.set_ylabel("ms from Kafka timestamp to read_committed visibility")
        axis.set_ylim(bottom=0)
        axis.set_title(f"trigger {_trigger(trigger)}: one point per round")
        axis.legend(fontsize=7)
        axis.grid(axis="y", alpha=0.3)
    ratio_axis = axes[-1]
    colour = 0
    for trigger in triggers:
        for label, values in ratio_values(runs, trigger).items():
            if label not in targets(trigger):
                continue
            ratio_axis.plot(
                range(1, len(values) + 1),
                values,
                marker="o",
                color=f"C{colour}",
                label=f"{_trigger(trigger)}: {label}: median {statistics.median(values):.2f}",
            )
            colour += 1
    for goal in sorted({g for t in triggers for g in targets(t).values()}):
        ratio_axis.axhline(goal, color="grey", linestyle="--", linewidth=1)
    ratio_axis.set_xlabel("round")
    ratio_axis.set_ylabel("ratio of p99 latencies (dashed: target)")
    ratio_axis.set_title("p99 ratios per round")
    ratio_axis.legend(fontsize=6)
    ratio_axis.grid(alpha=0.3)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the plot (and the raw figures)."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.latency_bench")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--rate", type=int, default=2000, help="input records per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument(
        "--triggers",
        default="1,0",
        help="trigger intervals in seconds, comma-separated; 0: as fast as possible "
        "(default: %(default)s)",
    )
    parser.add_argument("--plot", default="latency-bench.png", help="PNG to write")
    parser.add_argument("--json", default="", help="write every run's figures here")
    parser.add_argument(
        "--pyflink",
        action="store_true",
        help="add PyFlink's exactly-once SQL job (checkpoints every trigger interval; made "
        "once in a virtual environment of the harness cache)",
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--replot", default="", help="print and plot a --json file again")
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot, args.plot)
    if args.smoke:
        args.rounds, args.rate, args.seconds, args.warmup = 1, 200, 3.0, 2.0
        smoke_run()
    try:
        triggers = [float(t) for t in args.triggers.split(",") if t.strip()]
    except ValueError:
        parser.error("--triggers takes seconds, comma-separated, e.g. 1,0")
    if not triggers or min(triggers) < 0:
        parser.error("--triggers takes at least one interval of 0 seconds or more")
    if args.rounds < 1 or args.rate < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--rounds, --rate and --seconds must be positive, --warmup 0 or more")

    jars = spark_kafka_jars()
    with bench_place("latency") as place:
        server = place.kafka
        kafka = Bench(server, "", 0, 0, place.workdir, jars)
        place.stack.callback(kafka.close)
        print(f"machine: {machine()}")
        print(f"broker: Kafka {server.version} at {server.bootstrap_servers}")
        print(
            f"input: {args.rate} records/s of {VALUE_BYTES} B in {PARTITIONS} partitions for "
            f"{args.warmup:g} s (not measured) + {args.seconds:g} s per run; triggers "
            f"{', '.join(_trigger(t) for t in triggers)}; {args.rounds} rounds"
        )
        pyflink = (pyflink_python(), flink_kafka_jar()) if args.pyflink else None
        bench = Latency(kafka, jars, pyflink)
        place.stack.callback(bench.spark.stop)
        runs = bench.rounds(args, triggers, lambda line: print(line, flush=True))
        print(f"load at the end: {machine()}")
        print(report(runs, triggers))
        problem = plot(args.plot, runs, triggers, _title(args.rate, args.rounds, machine()))
        print(problem or f"plot: {args.plot}")
        if args.json:
            write_runs(args.json, args, runs)
    return 0


def _title(rate: int, rounds: int, where: str) -> str:
    """The plot's title: the input rate, the rounds and the machine."""
    return f"Kafka → Kafka end-to-end latency at {rate} records/s, {rounds} rounds; {where}"


def replot(path: str, plot_path: str) -> int:
    """Print the report of a ``--json`` file again and draw its plot (no broker, no Spark)."""
    with open(path) as fh:
        kept = json.load(fh)
    runs = [Run(**run) for run in kept["runs"]]
    triggers = sorted({run.trigger for run in runs}, reverse=True)
    print(f"runs of {path} (measured on: {kept['machine']})")
    print(report(runs, triggers))
    title = _title(kept["args"]["rate"], kept["args"]["rounds"], kept["machine"])
    problem = plot(plot_path, runs, triggers, title)
    print(problem or f"plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
