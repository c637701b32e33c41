"""Where each millisecond of a batch goes: Kafka → Kafka, epochal's ways beside Spark's own pair,
each batch taken apart from three sources that see it.

    python -m integration.bench.batch_timeline                      # 2 and 32 partitions
    python -m integration.bench.batch_timeline --partitions 2 --batch 2000 --batches 8

For each partition count and way, one available-now query copies ``--batches`` batches of
``--batch`` records (the first and the last batch are not measured: the first starts the
Python workers, and in the last Spark's Kafka source waits at the end of the topic); then

* Spark's progress report of each batch gives its trigger's phases (``durationMs``);
* Spark's status API (the session's UI, ``/api/v1``) gives the batch's Spark jobs (their job
  group is the query's run id, their description names the batch), their submission and
  completion, and each task's launch, deserialization, run and end;
* epochal's timeline (``epochal.timeline``, :mod:`epochal.metrics.timeline`) gives each sink
  task's steps in its Python worker and the driver's commit step.

The segments of ``addBatch`` are cut along the batch's critical path: the write job's task that
ended last. Every segment is a difference of two times on this one machine (``local[2]``), so
they add up to ``addBatch``; what no source marks is "the rest of addBatch" (Spark's write
planning before the job, and whatever comes after the commit). Printed as the mean ms per
measured batch, per way and partition count; ``--plot`` draws them as stacked bars.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from epochal.metrics import timeline
from epochal.spark import ordered_kafka
from epochal_sdk.sources import MIN_RECORDS_PER_TASK
from integration.bench import floor_source
from integration.bench.common import SMOKE_HELP, bench_session, machine, rotated, smoke_run
from integration.bench.kafka_bench import (
    AT_LEAST_ONCE,
    BUILTIN,
    EXACTLY_ONCE,
    VALUE_BYTES,
    Bench,
    bench_place,
    kept_producers,
    produce_input,
    spark_kafka_jars,
)

FAST_PATH = "fast path → epochal exactly-once"
"""Spark's JVM Kafka source in one order (``kafka-ordered``) into epochal's Kafka sink."""
FLOOR = "PySpark floor: Python source → Python sink"
"""PySpark's own Python data source path with nothing in it (:mod:`integration.bench.
floor_source`): the records made in memory, counted by the sink; no broker, no epochal."""
WAYS = (EXACTLY_ONCE, FAST_PATH, AT_LEAST_ONCE, BUILTIN, FLOOR)

SPARK_PHASES = ("latestOffset", "walCommit", "queryPlanning", "getBatch", "commitOffsets")
"""Spark's trigger phases outside ``addBatch``, from its progress reports."""
SEGMENTS = (
    ("other Spark jobs", "Spark jobs of the batch before its write job (source planning)"),
    ("scheduling", "write job submitted → its first task launched"),
    ("earlier tasks", "first task launched → the last task launched (tasks queued for a core)"),
    ("task deserialization", "the task's JVM deserialization (Spark's executorDeserializeTime)"),
    ("Python worker hand-off", "task launched and deserialized → sink's write() called"),
    ("sink start", "write() called → the connector's transaction begun (writer opened)"),
    ("first rows", "transaction begun → the first Arrow rows in hand (the upstream read)"),
    ("more rows", "first rows → last rows written, outside the connector's write calls"),
    ("writing", "inside the connector's write calls"),
    ("prepare / flush", "last rows written → transaction prepared (upserts flushed)"),
    ("task's own commit", "prepared → commit message returned (at-least-once commits here)"),
    ("task end", "commit message returned → Spark's task end (result back to the JVM)"),
    ("task run", "Spark's pair: the task's run (executorRunTime) and its end"),
    ("job end", "the last task's end → the write job's completion"),
    ("commit worker start", "write job complete → the driver's commit() called"),
    ("decision", "commit() called → the decision durable"),
    ("phase 2", "decision → every transaction committed"),
    ("commit report", "phase 2 (or commit() called) → the batch's metrics reported"),
    ("rest of addBatch", "what no source marks: write planning before the job, after commit"),
)
"""The parts of a batch's ``addBatch``, in order, with what each one is."""


def _ms(text: str | None) -> float | None:
    """A time of Spark's status API (``2026-12-03T18:30:53.123GMT``) in epoch seconds."""
    if not text:
        return None
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


class StatusApi:
    """The session's Spark status API (its UI's REST endpoint)."""

    def __init__(self, spark: Any) -> None:
        self.base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/"
        self.base += spark.sparkContext.applicationId

    def get(self, path: str) -> Any:
        """One resource of the application, as JSON."""
        with urllib.request.urlopen(f"{self.base}/{path}", timeout=30) as response:
            return json.load(response)

    def jobs_of(self, run_id: str, batches: set[int], timeout: float = 60.0) -> dict[int, list]:
        """The finished Spark jobs of a query run's batches, by batch (oldest first); waits
        until the status store has every batch (its listener runs behind the query)."""
        deadline = time.monotonic() + timeout
        while True:
            found: dict[int, list] = {}
            for job in self.get("jobs"):
                if job.get("jobGroup") != run_id or job.get("status") != "SUCCEEDED":
                    continue
                for line in str(job.get("description", "")).splitlines():
                    if line.startswith("batch = ") and line[8:].strip().isdigit():
                        found.setdefault(int(line[8:].strip()), []).append(job)
            if batches <= set(found) or time.monotonic() > deadline:
                for jobs in found.values():
                    jobs.sort(key=lambda j: _ms(j["submissionTime"]) or 0)
                return found
            time.sleep(0.2)

    def tasks_of(self, job: dict) -> list[dict]:
        """Every successful task of a job's stages."""
        tasks = []
        for stage in job.get("stageIds", []):
            for attempt in self.get(f"stages/{stage}"):
                number = attempt["attemptId"]
                listed = self.get(f"stages/{stage}/{number}/taskList?length=100000")
                tasks.extend(t for t in listed if t.get("status") == "SUCCESS")
        return tasks


@dataclass
class BatchTimeline:
    """One measured batch: its segments (ms) and Spark's phases (ms)."""

    way: str
    partitions: int
    batch: int
    records: int
    tasks: int
    segments: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    fresh_workers: int = 0
    """Tasks of the batch that ran in a Python worker that had run no sink task before."""


def take_apart(
    way: str, partitions: int, progress: dict, jobs: list[dict], tasks: list[dict], marks: dict
) -> BatchTimeline:
    """One batch's segments from its progress report, its Spark jobs and the write job's tasks
    (Spark's view) and epochal's timeline of it (``marks``: {} for Spark's pair)."""
    durations = {k: float(v) for k, v in progress["durationMs"].items()}
    add_batch = durations.get("addBatch", 0.0)
    write_job = jobs[-1]
    submitted, completed = _ms(write_job["submissionTime"]), _ms(write_job["completionTime"])
    assert submitted is not None and completed is not None
    ends = {t["taskId"]: (_ms(t["launchTime"]) or 0) + t["duration"] / 1000 for t in tasks}
    last = max(tasks, key=lambda t: ends[t["taskId"]])
    launched = _ms(last["launchTime"]) or submitted
    deserialize = last["taskMetrics"]["executorDeserializeTime"] / 1000
    ended = ends[last["taskId"]]
    segments: dict[str, float] = {}

    def put(name: str, start: float, end: float) -> None:
        segments[name] = segments.get(name, 0.0) + max(0.0, end - start) * 1000

    earlier = jobs[:-1]
    if earlier:
        segments["other Spark jobs"] = sum(
            ((_ms(j["completionTime"]) or 0) - (_ms(j["submissionTime"]) or 0)) * 1000
            for j in earlier
        )
    first = min(_ms(t["launchTime"]) or submitted for t in tasks)
    put("scheduling", submitted, first)
    put("earlier tasks", first, launched)
    segments["task deserialization"] = deserialize * 1000
    driver = marks.get("driver", {})
    task_marks = _marks_of_last_task(marks.get("tasks", []), ended)
    if task_marks:
        steps = [
            ("Python worker hand-off", "entered"),
            ("sink start", "began"),
            ("first rows", "first_rows"),
            ("more rows", "rows_done"),
            ("prepare / flush", "prepared"),
            ("task's own commit", "returned"),
        ]
        at = launched + deserialize
        for name, mark in steps:
            if mark in task_marks:
                put(name, at, task_marks[mark])
                at = task_marks[mark]
        in_write = task_marks.get("in_write", 0.0) * 1000
        if "more rows" in segments:  # the loop's time: the connector's, and upstream's
            segments["writing"] = min(in_write, segments["more rows"])
            segments["more rows"] -= segments["writing"]
        put("task end", at, ended)
    else:
        put("task run", launched + deserialize, ended)
    put("job end", ended, completed)
    committed = completed
    if driver.get("entered"):
        put("commit worker start", completed, driver["entered"])
        at = driver["entered"]
        for name, mark in (("decision", "decided"), ("phase 2", "completed")):
            if mark in driver:
                put(name, at, driver[mark])
                at = driver[mark]
        put("commit report", at, driver.get("reported", at))
        committed = driver.get("reported", at)
    marked = (completed - submitted) * 1000 + (committed - completed) * 1000
    marked += segments.get("other Spark jobs", 0.0)
    segments["rest of addBatch"] = max(0.0, add_batch - marked)
    return BatchTimeline(
        way,
        partitions,
        int(progress["batchId"]),
        int(progress["numInputRows"]),
        len(tasks),
        segments,
        {k: durations.get(k, 0.0) for k in ("triggerExecution", "addBatch", *SPARK_PHASES)},
        sum(1 for t in marks.get("tasks", []) if t.get("process_tasks") == 1.0),
    )


def _marks_of_last_task(tasks: list[dict], ended: float) -> dict:
    """The marks of the task that returned last before Spark saw the write job's last task
    end (epochal's timeline has no Spark task id: the nearest return before the end)."""
    returned = [t for t in tasks if t.get("returned") and t["returned"] <= ended + 0.002]
    return max(returned, key=lambda t: t["returned"]) if returned else {}


class Timelines(Bench):
    """The ways on one broker and one SparkSession whose status API is on."""

    def start_spark(self) -> None:
        """The session, with its UI's status API on (on a free port) and the ordered source."""
        conf = {
            "spark.sql.streaming.metricsEnabled": "false",
            "spark.ui.enabled": "true",
            "spark.ui.port": "0",
            "spark.jars": ",".join([*self.jars, ordered_kafka.jar()]),
        }
        self.spark = bench_session("epochal-batch-timeline", ["kafka"], **conf)
        self.status = StatusApi(self.spark)
        floor_source.register(self.spark, VALUE_BYTES, MIN_RECORDS_PER_TASK)

    def _plan(
        self, variant: str, source: str, out: str, limit: int, turn: str
    ) -> tuple[Any, str, dict[str, str], str]:
        if variant == FLOOR:
            reader = (
                self.spark.readStream.format(floor_source.FORMAT)
                .option("records", str(self.records))
                .option("perBatch", str(limit))
                .load()
            )
            return reader, floor_source.FORMAT, {}, f"{self.workdir}/cp-floor-{turn}"
        if variant != FAST_PATH:
            reader, fmt, options, checkpoint = super()._plan(variant, source, out, limit, turn)
            if variant != BUILTIN:
                options = {**options, timeline.OPTION: "true"}
            return reader, fmt, options, checkpoint
        reader, _, options, _ = super()._plan(BUILTIN, source, out, limit, turn)
        reader = (
            self.spark.readStream.format(ordered_kafka.FORMAT)
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(limit))
            .option("kafka.isolation.level", "read_committed")
            .load()
            .select("key", "value")
        )
        common = {
            "epochal.snapshotDir": f"{self.workdir}/snap",
            "epochal.job": f"timeline-fast-{turn}",
            "epochal.guarantee": "exactly-once",
            timeline.OPTION: "true",
        }
        options = {**options, **common, "mode": "transactional"}
        return reader, "epochal.kafka", options, f"{self.workdir}/cp-fast-{turn}"

    def measure(self, way: str, source: str, limit: int, turn: str) -> list[BatchTimeline]:
        """One available-now query of ``way``; its batches taken apart, but for the first (it
        starts the Python workers) and the last (Spark's Kafka source waits at the end of
        the topic: see docs/evidence/performance/timeline.md)."""
        out = self.new_topic()
        try:
            query = self.start_query(way, source, out, limit, turn)
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            with_data = [p for p in query.recentProgress if p["numInputRows"] > 0]
            progress = with_data[1:-1] if len(with_data) >= 3 else with_data
            run_id = str(query.runId)
            jobs = self.status.jobs_of(run_id, {int(p["batchId"]) for p in progress})
            job_dir = _job_dir(self.workdir, way, turn)
            kept = {m["batch"]: m for m in timeline.read(job_dir)} if job_dir else {}
            out_list = []
            for report in progress:
                batch = int(report["batchId"])
                if batch not in jobs:
                    continue
                tasks = self.status.tasks_of(jobs[batch][-1])
                out_list.append(
                    take_apart(
                        way, self.partitions, report, jobs[batch], tasks, kept.get(batch, {})
                    )
                )
            return out_list
        finally:
            self.drop_topic(out)


def _job_dir(workdir: str, way: str, turn: str) -> str | None:
    """The job directory of a way's query (epochal's ways; the names ``Bench._plan`` and
    :meth:`Timelines._plan` give)."""
    if way in (BUILTIN, FLOOR):
        return None
    if way == FAST_PATH:
        return f"{workdir}/snap/timeline-fast-{turn}"
    mode = "transactional" if way == EXACTLY_ONCE else "idempotent"
    return f"{workdir}/snap/bench-{mode}-{turn}"


def mean_segments(batches: list[BatchTimeline]) -> dict[str, float]:
    """Mean ms per batch of every segment and phase (a batch that lacks one counts 0)."""
    names = [name for name, _ in SEGMENTS]
    out = {n: statistics.mean(b.segments.get(n, 0.0) for b in batches) for n in names}
    for phase in ("triggerExecution", "addBatch", *SPARK_PHASES):
        out[phase] = statistics.mean(b.phases.get(phase, 0.0) for b in batches)
    return out


def table(results: dict[tuple[int, str], list[BatchTimeline]]) -> str:
    """Mean ms per batch of each segment, a column per (partitions, way)."""
    columns = [key for key, batches in results.items() if batches]
    means = {key: mean_segments(results[key]) for key in columns}
    short = {
        EXACTLY_ONCE: "EO",
        FAST_PATH: "fast EO",
        AT_LEAST_ONCE: "ALO",
        BUILTIN: "Spark",
        FLOOR: "PySpark floor",
    }
    head = " | ".join(f"{p} p {short[w]}" for p, w in columns)
    lines = [f"| ms per batch (mean) | {head} |", "| --- |" + " ---: |" * len(columns)]
    for name in ("triggerExecution", *SPARK_PHASES, "addBatch"):
        label = f"**{name}**" if name in ("triggerExecution", "addBatch") else name
        lines.append(f"| {label} | " + " | ".join(f"{means[k][name]:.0f}" for k in columns) + " |")
    for name, _ in SEGMENTS:
        if any(means[k][name] >= 0.5 for k in columns):
            row = " | ".join(f"{means[k][name]:.0f}" for k in columns)
            lines.append(f"| addBatch: {name} | {row} |")
    tasks = " | ".join(f"{statistics.mean(b.tasks for b in results[k]):.0f}" for k in columns)
    lines.append(f"| tasks of the write job | {tasks} |")
    fresh = " | ".join(
        f"{statistics.mean(b.fresh_workers for b in results[k]):.1f}" for k in columns
    )
    lines.append(f"| tasks in a fresh Python worker | {fresh} |")
    return "\n".join(lines)


def write_plot(path: str, results: dict[tuple[int, str], list[BatchTimeline]], title: str) -> str:
    """Stacked bars of ``addBatch``'s segments per (partitions, way); "" or why none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    columns = [key for key, batches in results.items() if batches]
    means = {key: mean_segments(results[key]) for key in columns}
    names = [n for n, _ in SEGMENTS if any(means[k][n] >= 0.5 for k in columns)]
    figure, axis = plt.subplots(figsize=(13, 0.6 * len(columns) + 3))
    labels = [f"{p} partitions, {w}" for p, w in columns]
    left = [0.0] * len(columns)
    colours = plt.get_cmap("tab20")
    for number, name in enumerate(names):
        widths = [means[k][name] for k in columns]
        axis.barh(labels, widths, left=left, label=name, color=colours(number % 20))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axis.invert_yaxis()
    axis.set_xlabel("ms per batch (mean), addBatch taken apart")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return ""


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the plot."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.batch_timeline")
    parser.add_argument("--partitions", default="2,32", help="partition counts")
    parser.add_argument("--batch", type=int, default=100_000, help="records per batch")
    parser.add_argument("--batches", type=int, default=5, help="batches per query")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--ways", default=",".join(WAYS), help="which ways, by name")
    parser.add_argument("--plot", default="batch-timeline.png", help="PNG to write")
    parser.add_argument("--json", default="", help="write every batch's timeline here")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--replot", default="", help="print and plot a --json file again")
    args = parser.parse_args(argv)
    if args.replot:
        with open(args.replot) as fh:
            again: dict[tuple[int, str], list[BatchTimeline]] = {}
            for kept in json.load(fh):
                batch = BatchTimeline(**kept)
                again.setdefault((batch.partitions, batch.way), []).append(batch)
        print(table(again))
        size = statistics.median(b.records for v in again.values() for b in v)
        problem = write_plot(args.plot, again, f"Kafka → Kafka, {size:.0f} records a batch")
        print(problem or f"plot: {args.plot}")
        return 0
    if args.smoke:
        args.partitions, args.batch, args.batches, args.rounds = "2", 1_000, 3, 1
        smoke_run()
    ways = [w for w in WAYS if w in args.ways.split(",")]
    try:
        jars = spark_kafka_jars()
    except Exception as exc:  # the fast path and Spark's pair need them
        print(f"Spark's Kafka connector not fetched ({exc}): only epochal's own ways")
        jars, ways = [], [w for w in ways if w not in (BUILTIN, FAST_PATH)]
    print(f"machine: {machine()}")
    results: dict[tuple[int, str], list[BatchTimeline]] = {}
    log: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
    with bench_place("timeline") as place:
        spark = None
        for count in [int(c) for c in args.partitions.split(",")]:
            records = args.batch * args.batches
            bench = Timelines(place.kafka, "", records, args.batch, place.workdir, jars, count)
            if spark is None:
                bench.start_spark()
                spark, status = bench.spark, bench.status
                place.stack.callback(spark.stop)
            bench.spark, bench.status = spark, status
            bench.source = bench.new_topic()
            produce_input(bench.bootstrap, bench.source, records, count)
            for way in ways:  # warm: Python workers, imports, connections (not measured)
                try:
                    bench.measure(way, bench.source, args.batch, f"p{count}-warm")
                except Exception as exc:  # the measured rounds say it again if it lasts
                    log(f"{count:>4} partitions, warm-up {way:34} FAILED {type(exc).__name__}")
            for number in range(args.rounds):
                for way in rotated(ways, number):
                    turn = f"p{count}-r{number}"
                    try:
                        batches = bench.measure(way, bench.source, args.batch, turn)
                    except Exception as exc:  # reported; the other ways still measured
                        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}"
                        log(f"{count:>4} partitions, round {number + 1} {way:34} FAILED {why}")
                        continue
                    results.setdefault((count, way), []).extend(batches)
                    mean = statistics.mean([b.phases["addBatch"] for b in batches] or [0.0])
                    line = f"{count:>4} partitions, round {number + 1} {way:34} "
                    line += f"addBatch {mean:.0f} ms"
                    if way in (EXACTLY_ONCE, FAST_PATH):  # the Kafka sink's producers
                        job_dir = _job_dir(place.workdir, way, turn)
                        assert job_dir is not None
                        kept, wrote = kept_producers(job_dir)
                        line += f", a kept Kafka producer in {kept} of {wrote} tasks"
                    log(line)
            bench.drop_topic(bench.source)
    print(table(results))
    title = f"Kafka → Kafka, {args.batch} records a batch, {args.rounds} rounds; {machine()}"
    problem = write_plot(args.plot, results, title)
    print(problem or f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(b) for v in results.values() for b in v], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
