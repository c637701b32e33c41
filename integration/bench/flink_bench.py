"""Exactly-once Kafka → Kafka beside the peer a PySpark team would pick for it: PyFlink.

    python -m integration.bench.flink_bench [--rounds 5] [--records 600000] [--batch 100000]
        [--checkpoint-ms 1000] [--plot flink-bench.png] [--json results.json] [--smoke]

``--smoke``: one round of 6 000 records (2 000 per batch, checkpoints every 200 ms), no
warm-up (a check that the command works, not a measurement).

Two ways copy the same input topic (``records`` records of 100 B in 2 partitions) into a new
topic each, exactly-once, in interleaved rounds (a rotated order):

* ``epochal exactly-once``: ``epochal.kafka`` source (the Python data source) and sink
  (``mode=transactional``), one ``Trigger.AvailableNow`` query of ``batch`` records per batch
  in the benchmark's SparkSession (``local[2]``), as ``kafka_bench`` runs it;
* ``PyFlink exactly-once``: :mod:`integration.bench.flink_job`, a PyFlink SQL job with Flink's
  Kafka SQL connector on both sides, the source bounded at its start offsets, the sink
  ``exactly-once`` (Kafka transactions committed at each checkpoint, every
  ``checkpoint_ms``), parallelism 2, in its own process (PyFlink's local mini cluster):
  apache-flink :data:`PYFLINK_VERSION` from PyPI in a virtual environment of its own, and
  ``flink-sql-connector-kafka`` :data:`FLINK_KAFKA_CONNECTOR` from Maven Central, both kept
  in the harness cache.

Both are timed the same way, from outside: an independent ``read_committed`` reader follows
the output topic, reads what each commit makes visible until nothing more comes for 50 ms, and
notes the time and the count. The *start-up* of a way is the time from its start (the query's
``start()``; the PyFlink process's launch) to the end of its first commit's read, and is
excluded: a way's *throughput* is the records made visible after its first commit divided by
the time from that first commit's read to the last one's. The reader also checks that the
output holds every input record exactly once (by ID). The interval between two commits'
reads is plotted as each way's latency (one point per commit).

The ratio epochal / PyFlink is taken within each round and reported as the median over the
rounds with its spread; the target is 1.5. The broker comes from the harness (or
``EPOCHAL_KAFKA_BOOTSTRAP``). A warm-up round at a tenth of the size runs first (not
measured). The defaults take about 2 minutes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from integration.bench.common import (
    SMOKE_HELP,
    machine,
    ratio_lines,
    rotated,
    smoke_run,
    spread,
    write_plot,
    write_runs,
)
from integration.bench.kafka_bench import (
    _SETTINGS,
    EXACTLY_ONCE,
    PARTITIONS,
    VALUE_BYTES,
    Bench,
    bench_place,
    produce_input,
)

EPOCHAL = "epochal exactly-once"
PYFLINK = "PyFlink exactly-once"
WAYS = (EPOCHAL, PYFLINK)
RATIO = f"{EPOCHAL} / {PYFLINK}"
TARGETS = {RATIO: 1.5}
"""The target, drawn in the plot: epochal's exactly-once copy moves half as many records again
as PyFlink's."""
PYFLINK_VERSION = "2.2.1"
"""apache-flink from PyPI: the newest release with a Kafka SQL connector built for it."""
FLINK_KAFKA_CONNECTOR = "5.0.0-2.2"
"""``org.apache.flink:flink-sql-connector-kafka`` for Flink 2.2 (one jar, Kafka's client
inside)."""
FLINK_JOB = Path(__file__).with_name("flink_job.py")


def pyflink_python() -> str:
    """The interpreter of a virtual environment with apache-flink :data:`PYFLINK_VERSION`
    (made once, in the harness cache: PyFlink pins its own pandas, pyarrow and Beam)."""
    from integration.harness.cache import cache_dir

    venv = cache_dir() / f"pyflink-{PYFLINK_VERSION}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"apache-flink=={PYFLINK_VERSION}"], check=True, timeout=1800)
        (venv / ".complete").write_text(PYFLINK_VERSION + "\n")
    return str(python)


def flink_kafka_jar() -> str:
    """Flink's Kafka SQL connector jar (fetched once with Maven from Maven Central into the
    harness cache)."""
    from integration.harness.cache import cache_dir

    entry = cache_dir() / f"flink-sql-connector-kafka-{FLINK_KAFKA_CONNECTOR}"
    jar = entry / f"flink-sql-connector-kafka-{FLINK_KAFKA_CONNECTOR}.jar"
    if not (entry / ".complete").exists():
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        (entry / "settings.xml").write_text(_SETTINGS)
        subprocess.run(
            [
                "mvn",
                "-B",
                "-q",
                "-s",
                "settings.xml",
                f"-Dmaven.repo.local={cache_dir() / 'm2'}",
                "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
                f"-Dartifact=org.apache.flink:flink-sql-connector-kafka:{FLINK_KAFKA_CONNECTOR}",
                f"-DoutputDirectory={entry}",
            ],
            cwd=entry,
            check=True,
            timeout=900,
        )
        (entry / ".complete").write_text(FLINK_KAFKA_CONNECTOR + "\n")
    return str(jar)


class OutputReader(threading.Thread):
    """An independent ``read_committed`` reader of one output topic: after each commit it
    reads everything visible, then notes (time, records so far); it counts every ID."""

    def __init__(self, bootstrap: str, topic: str, expected: int, timeout: float) -> None:
        super().__init__(daemon=True)
        self.topic, self.expected, self.timeout = topic, expected, timeout
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.reads: list[tuple[float, int]] = []
        """(time.monotonic() at the end of a read, records read so far), one per commit."""
        self.ids: Counter[int] = Counter()
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        count = 0
        try:
            while count < self.expected and not self._stopping.is_set():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.topic}: {count} of {self.expected} records")
                got = self._read(0.05)
                while got:  # what a commit made visible arrives in a few reads: take them all
                    count += got
                    got = self._read(0.05)
                if count and (not self.reads or self.reads[-1][1] < count):
                    self.reads.append((time.monotonic(), count))
        except BaseException as exc:  # reported by finish()
            self.error = exc
        finally:
            self.consumer.close()

    def _read(self, timeout: float) -> int:
        messages = self.consumer.consume(10_000, timeout=timeout)
        for message in messages:
            if message.error() is not None:
                raise RuntimeError(message.error())
            self.ids[int(message.value()[:10])] += 1
        return len(messages)

    def finish(self) -> None:
        """Wait for the reader (it stops once it read the expected count, or at its
        timeout); raise what it met."""
        self.join(self.timeout + 30)
        if self.is_alive():
            self._stopping.set()
            self.join(30)
        if self.error is not None:
            raise RuntimeError(f"the output reader failed: {self.error}") from self.error

    def stop(self) -> None:
        """Stop following (the way failed)."""
        self._stopping.set()
        self.join(30)


@dataclass
class Run:
    """One way in one round."""

    way: str
    round: int
    records: int
    started: float
    reads: list[tuple[float, int]]
    lost: int
    duplicates: int
    in_query_rate: float = 0.0
    """epochal: Spark's own figure (records per measured batch / median batch time)."""
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def startup_s(self) -> float:
        """From the way's start to the end of its first commit's read."""
        return self.reads[0][0] - self.started if self.reads else 0.0

    @property
    def one_commit(self) -> bool:
        """Whether everything became visible in one commit (no figure after start-up)."""
        return len(self.reads) < 2

    @property
    def rate(self) -> float:
        """Records made visible after the first commit / the time from its read to the
        last one's (everything from the start when there was one commit only)."""
        if not self.reads:
            return 0.0
        if self.one_commit:
            seconds = self.reads[-1][0] - self.started
            return self.reads[-1][1] / seconds if seconds > 0 else 0.0
        (first, n0), (last, n1) = self.reads[0], self.reads[-1]
        return (n1 - n0) / (last - first) if last > first else 0.0

    @property
    def commit_intervals_ms(self) -> list[float]:
        """The time between two commits' reads."""
        times = [t for t, _ in self.reads]
        return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


class FlinkBench:
    """Both ways on one broker: epochal's in one SparkSession, PyFlink's in a process each."""

    def __init__(self, bench: Bench, python: str, jar: str, checkpoint_ms: int) -> None:
        self.bench, self.python, self.jar = bench, python, jar
        self.checkpoint_ms = checkpoint_ms
        self.flink_logs: list[str] = []

    def run(self, way: str, turn: str, source: str, records: int, batch: int) -> Run:
        """Copy ``source`` (``records`` records) into a new topic the way ``way``."""
        out = self.bench.new_topic()
        reader = OutputReader(self.bench.bootstrap, out, records, timeout=600)
        reader.start()
        started = time.monotonic()
        in_query, phases = 0.0, {}
        try:
            if way == EPOCHAL:
                result = self.bench.query(EXACTLY_ONCE, source, out, batch, f"flink-{turn}")
                in_query, phases = result.steady, dict(result.phases or {})
            else:
                self._flink(source, out, turn)
        except BaseException:
            reader.stop()
            raise
        reader.finish()
        self.bench.drop_topic(out)
        seen = reader.ids
        lost = sum(1 for i in range(records) if i not in seen)
        duplicates = sum(n - 1 for n in seen.values() if n > 1)
        return Run(way, -1, records, started, reader.reads, lost, duplicates, in_query, phases)

    def _flink(self, source: str, out: str, turn: str) -> None:
        spec = {
            "bootstrap": self.bench.bootstrap,
            "source": source,
            "sink": out,
            "jars": [self.jar],
            "parallelism": PARTITIONS,
            "checkpoint_ms": self.checkpoint_ms,
            "transactional_id_prefix": f"flink-bench-{turn}-{uuid.uuid4().hex[:8]}",
        }
        done = subprocess.run(
            [self.python, str(FLINK_JOB), json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=900,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")},
        )
        if done.returncode != 0 or "finished" not in done.stdout:
            raise RuntimeError(
                f"the PyFlink job failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-4000:]}"
            )

    def rounds(
        self, count: int, source: str, records: int, batch: int, log: Callable[[str], None]
    ) -> list[Run]:
        """``count`` interleaved rounds over ``source``."""
        runs = []
        for number in range(count):
            for way in rotated(WAYS, number):
                run = self.run(way, f"r{number}", source, records, batch)
                run.round = number
                runs.append(run)
                check = "" if run.lost == run.duplicates == 0 else "  NOT EVERY RECORD ONCE"
                one = "  (one commit: start-up included)" if run.one_commit else ""
                log(
                    f"round {number + 1:>2}/{count} {way:22} {run.rate:>9.0f} rec/s after "
                    f"start-up {run.startup_s:5.1f}s, {len(run.reads)} commits, lost "
                    f"{run.lost}, duplicates {run.duplicates}{check}{one}"
                )
        return runs


def report(runs: list[Run], checkpoint_ms: int, batch: int) -> tuple[str, dict[str, list[float]]]:
    """The table (medians with their spread) and the per-round ratios."""
    by_way = {way: [r for r in runs if r.way == way] for way in WAYS}
    ratios: dict[str, list[float]] = {RATIO: []}
    for number in sorted({r.round for r in runs}):
        pair = {r.way: r for r in runs if r.round == number}
        if len(pair) == 2 and pair[PYFLINK].rate:
            ratios[RATIO].append(pair[EPOCHAL].rate / pair[PYFLINK].rate)
    lines = [
        f"{'way':24} {'rec/s after start-up':>22} {'start-up s':>11} {'commits':>8}"
        f" {'lost':>5} {'dup':>5}"
    ]
    for way, mine in by_way.items():
        rates = [r.rate for r in mine]
        lines.append(
            f"{way:24} {statistics.median(rates or [0]):>22.0f}"
            f" {statistics.median([r.startup_s for r in mine] or [0]):>11.1f}"
            f" {statistics.median([len(r.reads) for r in mine] or [0]):>8.0f}"
            f" {sum(r.lost for r in mine):>5} {sum(r.duplicates for r in mine):>5}"
        )
    epochal = by_way[EPOCHAL]
    lines.append(
        f"  (epochal: {batch} records per batch; Spark's own figure for its measured batches "
        f"{statistics.median([r.in_query_rate for r in epochal] or [0]):.0f} rec/s. PyFlink: "
        f"a checkpoint every {checkpoint_ms} ms, parallelism {PARTITIONS})"
    )
    lines.append("ratios (median over rounds):")
    lines.extend(ratio_lines(ratios, TARGETS))
    held = spread(ratios[RATIO]).median >= TARGETS[RATIO]
    lines.append(f"  target {RATIO} >= {TARGETS[RATIO]}: {'met' if held else 'MISSED'}")
    every = all(r.lost == r.duplicates == 0 for r in runs)
    lines.append(
        "every output holds every record once"
        if every
        else "OUTPUT DOES NOT HOLD EVERY RECORD ONCE"
    )
    return "\n".join(lines), ratios


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write the plot (and the raw figures)."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.flink_bench")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--records", type=int, default=600_000, help="input records")
    parser.add_argument("--batch", type=int, default=100_000, help="epochal: records per batch")
    parser.add_argument(
        "--checkpoint-ms", type=int, default=1000, help="PyFlink: checkpoint interval"
    )
    parser.add_argument("--plot", default="flink-bench.png", help="PNG to write")
    parser.add_argument("--json", default="", help="write every run's figures here")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.records, args.batch, args.checkpoint_ms = 1, 6_000, 2_000, 200
        smoke_run()

    python, jar = pyflink_python(), flink_kafka_jar()
    with bench_place("flink") as place:
        server = place.kafka
        print(f"machine: {machine()}")
        print(f"broker: Kafka {server.version} at {server.bootstrap_servers}")
        print(
            f"peer: apache-flink {PYFLINK_VERSION}, flink-sql-connector-kafka "
            f"{FLINK_KAFKA_CONNECTOR}"
        )
        bench = Bench(server, "", args.records, args.batch, place.workdir, [])
        place.stack.callback(bench.close)
        source = bench.new_topic()
        produce_input(server.bootstrap_servers, source, args.records)
        print(
            f"input: {args.records} records of {VALUE_BYTES} B in {PARTITIONS} partitions; "
            f"{args.rounds} rounds; start-up (to the end of the first commit's read) excluded"
        )
        bench.start_spark()
        peer = FlinkBench(bench, python, jar, args.checkpoint_ms)
        if not args.smoke:
            small = bench.new_topic()
            warm = max(args.records // 10, 3 * args.batch // 10)
            produce_input(server.bootstrap_servers, small, warm)
            for way in WAYS:
                peer.run(way, "warm", small, warm, args.batch // 10)
            bench.drop_topic(small)
        runs = peer.rounds(
            args.rounds, source, args.records, args.batch, lambda line: print(line, flush=True)
        )
        text, ratios = report(runs, args.checkpoint_ms, args.batch)
        print(f"load at the end: {machine()}")
        print(text)
        intervals = {
            w: [t for r in runs if r.way == w for t in r.commit_intervals_ms] for w in WAYS
        }
        title = (
            f"Kafka → Kafka exactly-once, epochal ({args.batch}/batch) and PyFlink "
            f"({args.checkpoint_ms} ms checkpoints), {args.rounds} rounds; {machine()}"
        )
        problem = write_plot(
            args.plot,
            title,
            {way: [r.rate for r in runs if r.way == way] for way in WAYS},
            intervals,
            ratios=ratios,
            targets=TARGETS,
            rate_label="records/s after start-up, per round",
            latency_label="ms per commit",
        )
        print(problem or f"plot: {args.plot}")
        if args.json:
            write_runs(args.json, args, runs, ratio=asdict(spread(ratios[RATIO])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
