"""Scale benchmark: what a job's cost does as its topics' partitions grow and as it ages.

    python -m integration.bench.scale_bench [--partitions 2,8,32,128] [--rounds 2]
        [--batches 5] [--batch 100000] [--small 2000] [--ages 100,1000,10000,100000]
        [--only partitions,age] [--plot scale-bench.png] [--json results.json] [--smoke]

``--smoke``: the smallest size (2 and 8 partitions, one round, two ages): a check that the
command works, not a measurement.

**Partitions.** Kafka → Kafka through the throughput benchmark's own queries
(:mod:`integration.bench.kafka_bench`: epochal exactly-once, epochal at-least-once, Spark's
Kafka pair) with every topic of ``N`` partitions, ``--rounds`` interleaved rounds each: the
throughput of ``--batch``-record batches (the median batch, first and last not measured), its
ratio to Spark's pair within each round, and the batch time of a small batch (``--small``
records, as a stream at that many records a second with a 1 s trigger has), which must stay
under the trigger.

**Age.** A map → map exactly-once job under ``epochal run`` (a supervisor in this process),
run for 100 batches; for each age the store gets the manifests an epochal that kept
every one left at that many batches (hard links: fast), then the job is resumed with 20 new
records: the time from ``resume`` to its first committed batch, the files the supervisor's
verification before the restart opened and listed (Python's audit hooks), and the store's
entries once the first batch trimmed them. A young job's restart (100 batches) is the
reference; Spark's own checkpoint keeps 100 batches whatever the age.

The plot (throughput and ratio per partition count; restart time against age) needs
matplotlib; without it the tables are still printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from integration.bench.common import SMOKE_HELP, quantile, rotated, smoke_run, spread
from integration.bench.kafka_bench import (
    AT_LEAST_ONCE,
    BUILTIN,
    EXACTLY_ONCE,
    Bench,
    bench_place,
    machine,
    produce_input,
    spark_kafka_jars,
)

MODULE = "integration.bench.scale_bench"
"""This module by its name: the jobs' drivers import their pipelines from it (``__name__`` is
``__main__`` under ``python -m``)."""
WAYS = (EXACTLY_ONCE, AT_LEAST_ONCE, BUILTIN)
"""The ways measured at each partition count (the throughput benchmark's names)."""
TRIGGER_MS = 1000.0
"""The trigger a small batch must fit in."""


@dataclass
class PartitionFigures:
    """What one partition count measured: per way, the throughput of each round, its ratio to
    Spark's pair in each round, and the small batches' times."""

    partitions: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    small_ms: dict[str, list[float]] = field(default_factory=dict)
    complete: dict[str, bool] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    """Per way, why a round's query failed (it has no figure for that round)."""


def measure_partitions(
    place: Any,
    counts: list[int],
    rounds: int,
    batches: int,
    batch: int,
    small: int,
    jars: list[str],
    log: Callable[[str], None],
) -> list[PartitionFigures]:
    """Every partition count, on one broker and one SparkSession."""
    out = []
    spark = None
    for count in counts:
        records = batches * batch
        bench = Bench(place.kafka, "", records, batch, place.workdir, jars, count)
        bench.spark = spark
        if spark is None:
            bench.start_spark()
            spark = bench.spark
            place.stack.callback(spark.stop)
        bench.source = bench.new_topic()
        produce_input(bench.bootstrap, bench.source, records, count)
        small_topic = bench.new_topic()
        if small:
            produce_input(bench.bootstrap, small_topic, 5 * small, count)
        figures = PartitionFigures(count)
        ways = [w for w in WAYS if w != BUILTIN or jars]
        for number in range(rounds):
            turn: dict[str, float] = {}
            for way in rotated(ways, number):
                try:
                    run = bench.run(way, f"p{count}-r{number}")
                except Exception as exc:  # reported, and the other ways still measured
                    why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    figures.failures.setdefault(way, []).append(why)
                    log(f"{count:>4} partitions, round {number + 1}/{rounds} {way:22} FAILED {why}")
                    continue
                turn[way] = run.steady
                figures.rates.setdefault(way, []).append(run.steady)
                figures.complete[way] = figures.complete.get(way, True) and run.output == records
                line = f"{count:>4} partitions, round {number + 1}/{rounds} {way:22} "
                line += f"{run.steady:>9.0f} rec/s"
                if small:
                    quick = bench.run(way, f"p{count}-s{number}", small_topic, 5 * small, small)
                    figures.small_ms.setdefault(way, []).extend(quick.measured_ms)
                    line += f"; {small}-record batch p50 "
                    line += f"{statistics.median(quick.measured_ms or [0]):.0f} ms"
                log(line + ("" if run.output == records else f"  OUTPUT {run.output} != {records}"))
            if turn.get(BUILTIN):
                for way in (EXACTLY_ONCE, AT_LEAST_ONCE):
                    if turn.get(way):
                        figures.ratios.setdefault(way, []).append(turn[way] / turn[BUILTIN])
        for topic in (bench.source, small_topic):
            bench.drop_topic(topic)
        out.append(figures)
    return out


def partitions_table(figures: list[PartitionFigures]) -> str:
    """Throughput, ratio to Spark's pair and the small batch's time, per partition count."""
    lines = [
        f"{'partitions':>10} {'way':22} {'rec/s (median)':>14} {'/ Spark pair':>13} "
        f"{'small batch p50':>15} {'p90':>6}  output"
    ]
    for f in figures:
        for way, rates in f.rates.items():
            ratio = statistics.median(f.ratios[way]) if f.ratios.get(way) else None
            small = f.small_ms.get(way) or [0.0]
            lines.append(
                f"{f.partitions:>10} {way:22} {statistics.median(rates):>14.0f} "
                f"{'' if ratio is None else f'{ratio:.2f}':>13} "
                f"{quantile(small, 0.5):>12.0f} ms {quantile(small, 0.9):>6.0f}  "
                f"{'every record once' if f.complete.get(way) else 'MISMATCH'}"
            )
    for f in figures:
        for way, whys in f.failures.items():
            lines.append(f"{f.partitions:>10} {way:22} {len(whys)} round(s) failed: {whys[0]}")
    if len(figures) >= 2 and figures[0].ratios.get(EXACTLY_ONCE):
        first = figures[0]
        for f in figures[1:]:
            if f.ratios.get(EXACTLY_ONCE):
                keep = [
                    a / b
                    for a, b in zip(
                        f.ratios[EXACTLY_ONCE], first.ratios[EXACTLY_ONCE], strict=False
                    )
                ]
                lines.append(
                    f"exactly-once / Spark pair at {f.partitions} partitions against "
                    f"{first.partitions}: {spread(keep)} (target >= 0.9)"
                )
    return "\n".join(lines)


# -- age ----------------------------------------------------------------------------------------
AGE_MAP_ENV = "EPOCHAL_SCALE_BENCH_MAP"
"""The map file of the age part's job (its journal ``input``, its map ``output``)."""
AGE_BATCH = 20
"""Records per batch of the age part's job."""


def copy(spark: Any) -> Any:
    """The age part's job: the map journal ``input`` → the map ``output``, exactly-once (two-
    phase commit), :data:`AGE_BATCH` records a batch."""
    path = os.environ[AGE_MAP_ENV]
    return (
        spark.readStream.format("epochal.map")
        .option("path", path)
        .option("map", "input")
        .option("maxRecordsPerBatch", str(AGE_BATCH))
        .load()
        .selectExpr("key", "value")
        .writeStream.format("epochal.map")
        .option("path", path)
        .option("map", "output")
        .option("mode", "transactional")
    )


@dataclass
class AgeFigures:
    """One restart of the job at one age."""

    age: int
    resume_to_first_batch_s: float
    verify_opened: int
    verify_listed: int
    store_entries_before: int
    store_entries_after: int


class _Reads:
    """Files opened and directories listed under a root by one thread of this process (the
    job's supervisor, which verifies the snapshot before a restart), through audit hooks."""

    active: _Reads | None = None

    def __init__(self, root: str, thread: str) -> None:
        self.root, self.thread = root, thread
        self.events: Counter[str] = Counter()

    @staticmethod
    def hook(event: str, args: tuple[Any, ...]) -> None:
        reads = _Reads.active
        if reads is None or event not in ("open", "os.listdir", "os.scandir") or not args:
            return
        if threading.current_thread().name != reads.thread:
            return
        if isinstance(args[0], str) and args[0].startswith(reads.root):
            reads.events["open" if event == "open" else "list"] += 1


def _entries(store: str) -> int:
    return sum(len(names) for _, _, names in os.walk(store))


def measure_age(
    workdir: str, ages: list[int], start_batches: int, log: Callable[[str], None]
) -> list[AgeFigures]:
    """The map → map job restarted at each age (see the module doc)."""
    from epochal import Job, JobConfig, JobStatus
    from epochal.state import manifests
    from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
    from epochal_map import MapStore

    sys.addaudithook(_Reads.hook)
    root = Path(workdir) / "age"
    root.mkdir()
    source = str(root / "map.sqlite")
    with MapStore(source) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(start_batches * AGE_BATCH)])
    os.environ[AGE_MAP_ENV] = source
    config = JobConfig(
        snapshot_dir=str(root / "snapshots"),
        available_now=True,
        restart_backoff=0.2,
        master=LOCAL,
        spark_conf={**TEST_SPARK_CONF},
    )
    job = Job.submit("aged", f"{MODULE}:copy", config, report=lambda line: None)
    if job.join(600).status != JobStatus.COMPLETED:
        raise RuntimeError(f"the job did not complete: {job.status().failure}")
    out = []
    added = start_batches * AGE_BATCH
    for age in ages:
        store = job.jobdir.store
        listing = Path(store.base) / manifests.MANIFESTS
        kept = sorted(listing.iterdir())  # links spread over them: a file has at most 65 000
        batch = int(job.status().progress["batch"])
        # the job's own newest 100 stay; the older ones get the numbers below them (below 0
        # for the oldest: the job ran only ``start_batches`` batches), as many as ``age`` asks
        for old in range(batch - age, batch - 100):
            target = listing / manifests.manifest_key(old).rsplit("/", 1)[1]
            if not target.exists():
                os.link(kept[old % len(kept)], target)
        before = _entries(store.base)
        with MapStore(source) as map_store:
            map_store.append_events(
                "input", [(str(i), f"v{i}") for i in range(added, added + AGE_BATCH)]
            )
        added += AGE_BATCH
        _Reads.active = reads = _Reads(job.jobdir.path, "epochal-aged")
        started = time.monotonic()
        try:
            resumed = Job("aged", job.jobdir.snapshot_dir).resume(report=lambda line: None)
            deadline = started + 600
            while job.status().progress.get("batch", -1) <= batch:
                time.sleep(0.02)
                # the record says COMPLETED (the last run's) until the resumed run starts
                if resumed.status().status == JobStatus.FAILED or time.monotonic() > deadline:
                    raise RuntimeError(f"the resumed job made no batch: {job.status().failure}")
        finally:
            _Reads.active = None
        took = time.monotonic() - started
        resumed.join(600)
        after = _entries(job.jobdir.store.base)  # the resumed run's epoch
        figures = AgeFigures(age, took, reads.events["open"], reads.events["list"], before, after)
        log(
            f"age {age:>7} batches: resume → first batch {took:.2f} s; the restart's reads "
            f"(supervisor, verification included) {reads.events['open']} opened, "
            f"{reads.events['list']} listed; store {before} → {figures.store_entries_after} entries"
        )
        out.append(figures)
    return out


def age_table(figures: list[AgeFigures]) -> str:
    """The restarts by age, against the youngest."""
    lines = [
        f"{'age (batches)':>13} {'resume→first batch':>18} {'/ youngest':>10} "
        f"{'files opened':>12} {'listed':>6} {'store entries before→after':>27}"
    ]
    base = figures[0].resume_to_first_batch_s if figures else 0.0
    for f in figures:
        lines.append(
            f"{f.age:>13} {f.resume_to_first_batch_s:>16.2f} s "
            f"{f.resume_to_first_batch_s / base if base else 0:>10.2f} {f.verify_opened:>12} "
            f"{f.verify_listed:>6} {f.store_entries_before:>13} → {f.store_entries_after}"
        )
    return "\n".join(lines)


# -- several jobs -----------------------------------------------------------------------------
JOBS_ENV = "EPOCHAL_SCALE_BENCH_JOBS"
"""A JSON file: per job name, its Kafka bootstrap, input and output topic (the jobs part)."""
JOB_BATCH = 20_000
"""Records per batch of the jobs part's queries."""


def kafka_copy(spark: Any) -> Any:
    """The jobs part's supervised job: its input topic → its output topic, exactly-once, the
    topics named for the job in :data:`JOBS_ENV`'s file."""
    import json

    from epochal.parts.job_context import JobContext

    job = json.loads(Path(os.environ[JOBS_ENV]).read_text())[JobContext.current().job]
    return (
        spark.readStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("subscribe", job["source"])
        .option("maxRecordsPerBatch", str(JOB_BATCH))
        .load()
        .select("key", "value")
        .writeStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("topic", job["out"])
        .option("mode", "transactional")
    )


SPARK_PAIR_APP = """
import json, sys
from pyspark.sql import SparkSession
bootstrap, source, out, checkpoint, jars = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2]").appName("pair")
         .config("spark.jars", jars).config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", source).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", sys.argv[6])
         .option("kafka.isolation.level", "read_committed").load().select("key", "value")
         .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", out).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
query.awaitTermination()
print(json.dumps([p["durationMs"]["triggerExecution"] for p in query.recentProgress
                  if p["numInputRows"] > 0]))
"""
"""The peer of the jobs part's drivers of their own: Spark's Kafka pair as an application."""


@dataclass
class JobsFigures:
    """N jobs at once, one way: their records per second together, and their batches' p50."""

    way: str
    jobs: int
    records_per_s: float
    batch_p50_ms: float
    complete: bool


def measure_jobs(
    place: Any, counts: list[int], records: int, jars: list[str], log: Callable[[str], None]
) -> list[JobsFigures]:
    """For each N: N exactly-once jobs, each with its own supervised driver, beside N Spark
    pair applications; and N exactly-once queries on one driver beside N Spark pair queries
    on one driver. Every job copies its own topic of ``records`` records."""
    import json
    import subprocess

    from epochal import Job, JobConfig, JobStatus
    from epochal.testing.scenarios import LOCAL

    bench = Bench(place.kafka, "", records, JOB_BATCH, place.workdir, jars, 2)
    bench.start_spark()
    place.stack.callback(bench.spark.stop)
    script = Path(place.workdir) / "pair_app.py"
    script.write_text(SPARK_PAIR_APP)
    out: list[JobsFigures] = []

    def topics(n: int) -> list[tuple[str, str]]:
        pairs = []
        for _ in range(n):
            source = bench.new_topic()
            produce_input(bench.bootstrap, source, records, 2)
            pairs.append((source, bench.new_topic()))
        return pairs

    def done(way: str, n: int, seconds: float, ms: list[float], pairs: list[tuple[str, str]]):
        from integration.bench.kafka_bench import count_output

        complete = all(count_output(bench.bootstrap, o) == records for _, o in pairs)
        figures = JobsFigures(way, n, n * records / seconds, statistics.median(ms or [0]), complete)
        out.append(figures)
        log(
            f"{n} x {way:38} {figures.records_per_s:>9.0f} rec/s together, batch p50 "
            f"{figures.batch_p50_ms:.0f} ms" + ("" if complete else "  OUTPUT MISMATCH")
        )
        for source, target in pairs:
            bench.drop_topic(source)
            bench.drop_topic(target)

    for n in counts:
        # drivers of their own: supervised epochal jobs
        pairs = topics(n)
        spec = Path(place.workdir) / f"jobs-{n}.json"
        names = [f"scale-{n}-{i}" for i in range(n)]
        spec.write_text(
            json.dumps(
                {
                    name: {"bootstrap": bench.bootstrap, "source": s, "out": o}
                    for name, (s, o) in zip(names, pairs, strict=True)
                }
            )
        )
        os.environ[JOBS_ENV] = str(spec)
        config = JobConfig(
            snapshot_dir=f"{place.workdir}/jobs-snap-{n}", available_now=True, master=LOCAL
        )
        started = time.monotonic()
        jobs = [
            Job.submit(name, f"{MODULE}:kafka_copy", config, report=lambda line: None)
            for name in names
        ]
        records_ms: list[float] = []
        for job in jobs:
            record = job.join(1800)
            if record.status != JobStatus.COMPLETED:
                raise RuntimeError(f"job {record.name}: {record.status} {record.failure}")
        took = time.monotonic() - started
        for job in jobs:
            records_ms += [float(job.status().progress.get("duration_ms", 0))]
        done("epochal exactly-once, a driver each", n, took, records_ms, pairs)
        # drivers of their own: Spark's pair as applications
        if jars:
            pairs = topics(n)
            started = time.monotonic()
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        str(script),
                        bench.bootstrap,
                        s,
                        o,
                        f"{place.workdir}/pair-{n}-{i}",
                        ",".join(jars),
                        str(JOB_BATCH),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                for i, (s, o) in enumerate(pairs)
            ]
            ms = []
            for proc in procs:
                stdout, _ = proc.communicate(1800)
                ms += json.loads(stdout.strip().splitlines()[-1])
            done("Spark pair, a driver each", n, time.monotonic() - started, ms, pairs)
        # one driver: N queries in one session
        for way in (EXACTLY_ONCE, BUILTIN):
            if way == BUILTIN and not jars:
                continue
            pairs = topics(n)
            started = time.monotonic()
            queries = [
                bench.start_query(way, s, o, JOB_BATCH, f"one-{n}-{i}")
                for i, (s, o) in enumerate(pairs)
            ]
            ms = []
            for query in queries:
                query.awaitTermination()
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                ms += [
                    float(p["durationMs"]["triggerExecution"])
                    for p in query.recentProgress
                    if p["numInputRows"] > 0
                ]
            done(f"{way}, one driver", n, time.monotonic() - started, ms, pairs)
    return out


def jobs_table(figures: list[JobsFigures]) -> str:
    """Several jobs at once, by way."""
    lines = [f"{'jobs':>4} {'way':40} {'rec/s together':>14} {'batch p50':>9}  output"]
    for f in figures:
        lines.append(
            f"{f.jobs:>4} {f.way:40} {f.records_per_s:>14.0f} {f.batch_p50_ms:>6.0f} ms  "
            f"{'every record once' if f.complete else 'MISMATCH'}"
        )
    return "\n".join(lines)


# -- memory over a long run ---------------------------------------------------------------------
@dataclass
class MemorySample:
    """The memory of a job's processes at one batch."""

    batch: int
    heap_used_mb: float
    """The driver JVM's heap in use right after a full collection (``jcmd GC.run``)."""
    jvm_rss_mb: float
    """The driver JVM's memory (proportional set size)."""
    python_rss_mb: float
    """The driver's Python and the Python workers together (proportional set sizes)."""


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children.get(current, [])
    return out


def _rss_mb(pid: int) -> float:
    """The process's proportional set size (its share of the pages it shares with others:
    the sum over processes is the memory they use together), else its resident set."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) / 1024
        except OSError:
            continue
    return 0.0


def _is_java(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/exe").resolve().name == "java"
    except OSError:
        return False


def sample_memory(root: int, batch: int) -> MemorySample | None:
    """The memory of the process tree under ``root`` (a driver's): its JVM's heap after a
    full collection, the JVM's and the Python processes' resident sets."""
    import shutil
    import subprocess

    tree = _tree(root)
    jvms = [p for p in tree if _is_java(p)]
    if not jvms:
        return None
    jcmd = shutil.which("jcmd") or str(
        Path(os.path.realpath(shutil.which("java") or "java")).parent / "jcmd"
    )
    subprocess.run([jcmd, str(jvms[0]), "GC.run"], capture_output=True, timeout=120)
    info = subprocess.run(
        [jcmd, str(jvms[0]), "GC.heap_info"], capture_output=True, text=True, timeout=120
    ).stdout
    used = 0.0
    for line in info.splitlines():
        parts = line.replace(",", " ").split()
        if "used" in parts:
            value = parts[parts.index("used") + 1]
            if value.endswith("K") and value[:-1].isdigit():
                used = int(value[:-1]) / 1024
                break
    return MemorySample(
        batch,
        used,
        sum(_rss_mb(p) for p in jvms),
        sum(_rss_mb(p) for p in tree if p not in jvms),
    )


def measure_memory(
    workdir: str, batches: int, every: int, log: Callable[[str], None]
) -> list[MemorySample]:
    """A map → map exactly-once job under ``epochal run`` for ``batches`` batches of
    :data:`AGE_BATCH` records as fast as it goes, its driver's memory sampled every ``every``
    batches (and at the first)."""
    from epochal import Job, JobConfig, JobStatus
    from epochal.testing.scenarios import LOCAL
    from epochal_map import MapStore

    root = Path(workdir) / "memory"
    root.mkdir()
    source = str(root / "map.sqlite")
    with MapStore(source) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(batches * AGE_BATCH)])
    os.environ[AGE_MAP_ENV] = source
    config = JobConfig(snapshot_dir=str(root / "snapshots"), available_now=True, master=LOCAL)
    job = Job.submit("long", f"{MODULE}:copy", config, report=lambda line: None)
    samples: list[MemorySample] = []
    next_at = 1
    while True:
        status = job.status()
        if status.status.finished:
            break
        batch = int(status.progress.get("batch", -1))
        pid = int(status.driver.get("pid") or 0)
        if batch >= next_at and pid:
            sample = sample_memory(pid, batch)
            if sample is not None:
                samples.append(sample)
                log(
                    f"batch {batch:>6}: heap after GC {sample.heap_used_mb:.0f} MB, JVM PSS "
                    f"{sample.jvm_rss_mb:.0f} MB, Python PSS {sample.python_rss_mb:.0f} MB"
                )
            next_at = every if next_at == 1 else next_at + every
        time.sleep(1)
    record = job.join(600)
    if record.status != JobStatus.COMPLETED:
        raise RuntimeError(f"the long job ended {record.status}: {record.failure}")
    return samples


def memory_table(samples: list[MemorySample]) -> str:
    """The samples, and the last against the one at a tenth of the run."""
    lines = [f"{'batch':>7} {'heap after GC':>13} {'JVM PSS':>8} {'Python PSS':>10}"]
    for s in samples:
        lines.append(
            f"{s.batch:>7} {s.heap_used_mb:>10.0f} MB {s.jvm_rss_mb:>5.0f} MB "
            f"{s.python_rss_mb:>7.0f} MB"
        )
    if len(samples) >= 2:
        last = samples[-1]
        tenth = min(samples[:-1], key=lambda s: abs(s.batch - last.batch / 10))
        for name in ("heap_used_mb", "jvm_rss_mb", "python_rss_mb"):
            a, b = getattr(last, name), getattr(tenth, name)
            lines.append(
                f"{name} at batch {last.batch} / at batch {tenth.batch}: "
                f"{a / b if b else 0:.2f} (target <= 1.1)"
            )
    return "\n".join(lines)


def write_plot(path: str, figures: dict[str, Any]) -> str:
    """One panel per figure: throughput, its ratio to Spark's pair and the small batch's time
    by partitions; restart time by age; several jobs; memory over the long run. '' when
    written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    partitions: list[PartitionFigures] = figures.get("partitions", [])
    if partitions:
        counts = [f.partitions for f in partitions]
        panels = (
            (axes[0][0], WAYS, lambda f, w: f.rates.get(w), "records/s", "throughput"),
            (
                axes[0][1],
                (EXACTLY_ONCE, AT_LEAST_ONCE),
                lambda f, w: f.ratios.get(w),
                "ratio",
                "against Spark's pair (same round)",
            ),
            (axes[0][2], WAYS, lambda f, w: f.small_ms.get(w), "ms", "a small batch's time"),
        )
        for axis, ways, values_of, unit, title in panels:
            for way in ways:
                values = [
                    statistics.median(values_of(f, way)) if values_of(f, way) else None
                    for f in partitions
                ]
                if any(v is not None for v in values):
                    axis.plot(counts, values, marker="o", label=way)
            axis.set(xscale="log", xlabel="Kafka partitions", ylabel=unit, title=title)
            axis.set_xticks(counts, [str(c) for c in counts])
            axis.set_ylim(bottom=0)
            axis.legend(fontsize=8)
        axes[0][1].axhline(1.0, color="grey", lw=0.8)
        axes[0][2].axhline(TRIGGER_MS, color="grey", lw=0.8, ls="--")
    ages: list[AgeFigures] = figures.get("ages", [])
    if ages:
        axes[1][0].plot([f.age for f in ages], [f.resume_to_first_batch_s for f in ages], "o-")
        axes[1][0].set(xscale="log", xlabel="job age (batches)", ylabel="s")
        axes[1][0].set(title="resume → first committed batch")
        axes[1][0].set_ylim(bottom=0)
    jobs: list[JobsFigures] = figures.get("jobs", [])
    for way in sorted({f.way for f in jobs}):
        mine = [f for f in jobs if f.way == way]
        axes[1][1].plot([f.jobs for f in mine], [f.records_per_s for f in mine], "o-", label=way)
    if jobs:
        axes[1][1].set(xlabel="jobs at once", ylabel="records/s together", title="several jobs")
        axes[1][1].set_ylim(bottom=0)
        axes[1][1].legend(fontsize=8)
    memory: list[MemorySample] = figures.get("memory", [])
    if memory:
        batches = [m.batch for m in memory]
        for name, label in (
            ("heap_used_mb", "JVM heap after GC"),
            ("jvm_rss_mb", "JVM PSS"),
            ("python_rss_mb", "Python PSS"),
        ):
            axes[1][2].plot(batches, [getattr(m, name) for m in memory], "o-", label=label)
        axes[1][2].set(xlabel="batch", ylabel="MB", title="a job's memory over a long run")
        axes[1][2].set_ylim(bottom=0)
        axes[1][2].legend(fontsize=8)
    fig.suptitle(f"epochal scale benchmark; {machine()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return ""


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, print their tables, write the plot."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.scale_bench")
    parser.add_argument("--partitions", default="2,8,32,128", help="partition counts")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per count")
    parser.add_argument("--batches", type=int, default=5, help="batches per query")
    parser.add_argument("--batch", type=int, default=100_000, help="records per batch")
    parser.add_argument(
        "--small", type=int, default=2_000, help="records of a small batch (0: none)"
    )
    parser.add_argument("--ages", default="100,1000,10000,100000", help="job ages (batches)")
    parser.add_argument("--start-batches", type=int, default=100, help="the aged job's first run")
    parser.add_argument("--jobs", default="1,2,4,8", help="how many jobs at once")
    parser.add_argument("--job-records", type=int, default=100_000, help="records per job")
    parser.add_argument("--memory-batches", type=int, default=10_000, help="the long run")
    parser.add_argument("--only", default="partitions,age,jobs,memory", help="parts to run")
    parser.add_argument("--no-builtin", action="store_true", help="skip Spark's connector")
    parser.add_argument("--plot", default="scale-bench.png", help="PNG to write")
    parser.add_argument("--json", default="", help="write the figures here")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:  # every part once, at its smallest
        args.partitions, args.rounds, args.batches, args.batch = "2,4", 1, 3, 1_000
        args.small, args.ages, args.start_batches = 0, "3,300", 3
        args.jobs, args.job_records, args.memory_batches = "1", JOB_BATCH, 10
        smoke_run()
    parts = set(args.only.split(","))
    jars: list[str] = []
    if parts & {"partitions", "jobs"} and not args.no_builtin:
        try:
            jars = spark_kafka_jars()
        except Exception as exc:  # report, run the rest
            print(f"Spark's Kafka pair skipped: jars not fetched: {exc}")
    print(f"machine: {machine()}")
    figures: dict[str, Any] = {}
    with bench_place("scale") as place:
        if "partitions" in parts:
            counts = [int(c) for c in args.partitions.split(",")]
            print(
                f"partitions: {args.batches} batches of {args.batch} records per query, "
                f"{args.rounds} rounds, small batches of {args.small}"
            )
            figures["partitions"] = measure_partitions(
                place, counts, args.rounds, args.batches, args.batch, args.small, jars, print
            )
            print(partitions_table(figures["partitions"]))
        if "age" in parts:
            ages = [int(a) for a in args.ages.split(",")]
            figures["ages"] = measure_age(place.workdir, ages, args.start_batches, print)
            print(age_table(figures["ages"]))
        if "jobs" in parts:
            counts = [int(c) for c in args.jobs.split(",")]
            print(f"jobs: each copies {args.job_records} records, {JOB_BATCH} a batch")
            figures["jobs"] = measure_jobs(place, counts, args.job_records, jars, print)
            print(jobs_table(figures["jobs"]))
        if "memory" in parts:
            every = max(10, args.memory_batches // 10)
            figures["memory"] = measure_memory(place.workdir, args.memory_batches, every, print)
            print(memory_table(figures["memory"]))
    print(f"load at the end: {machine()}")
    problem = write_plot(args.plot, figures)
    print(problem or f"plot: {args.plot}")
    if args.json:
        import json

        Path(args.json).write_text(
            json.dumps({k: [asdict(f) for f in v] for k, v in figures.items()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
