"""Recovery benchmark: how long a job is down after a failure, by the way it recovers and by
the size of its keyed state.

    python -m integration.bench.recovery [--sizes 1,100,1000] [--repeats 3] [--plot PATH]

A job keeps a running count per key in Spark state (RocksDB state store), each key's state
padded with incompressible characters to give the state size wanted (about 1 MB, 100 MB,
1 GB), reads a journal (the map connector) that a producer appends to all the time, and
writes each key's count to the map sink (exactly-once, upserts). For each state size it is
killed, repeatedly, three ways:

``cold``      the whole driver run and the warm standby are killed: the supervisor starts a
              new driver process (JVM, SparkSession, connectors, state load from the
              checkpoint)
``standby``   the whole driver run is killed: the warm standby is promoted
``in-place``  the driver's streaming source worker is killed (a crashed Python worker): the
              driver restarts the query in its own SparkSession

and two times are measured: kill → the first batch committed after it, and kill → the sink
caught up (its counts add up to every event produced before the kill). Before the job, on the
idle machine, it measures the peer under every cold recovery: plain PySpark, without epochal,
from a new process to the first committed batch of the same query shape with no state to
load (``integration.bench.pyspark_floor``; ``--floor`` times). ``--state-files links,copies``
runs each size twice, the second time with the state store's files copied as Spark does by
itself (``EPOCHAL_STATE_LINKS=off``, see :mod:`epochal.spark.statefiles`): the same kills,
side by side. It prints a table and writes a
PNG plot of recovery time against state size (matplotlib, ``pip install matplotlib``);
docs/performance/recovery.md shows both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from epochal import processes
from epochal.driver import SOURCE_RUNNER_MODULE
from epochal.spark import statefiles

SPEC_ENV = "EPOCHAL_RECOVERY_SPEC"
KINDS = ("cold", "standby", "in-place")
STATE_FILES = ("links", "copies")
"""How the job's state store files move between checkpoint and working directory."""


def incompressible(size: int) -> str:
    """``size`` characters that RocksDB's block compression cannot shrink much (random
    letters and digits, the same on every run): a padding of one repeated character would
    compress to almost nothing, and the state on disk would not have the size asked for."""
    import random
    import string

    letters = string.ascii_letters + string.digits
    return "".join(random.Random(size).choices(letters, k=size))


def pipeline(spark: Any) -> Any:
    """journal (key, value) → count per key, state padded to the wanted size → map sink."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    spec = json.loads(os.environ[SPEC_ENV])
    pad = incompressible(int(spec["pad"]))

    def update(key: tuple[str], frames: Any, state: Any) -> Any:
        import pandas as pd

        count = state.get[0] if state.exists else 0
        for frame in frames:
            count += len(frame)
        state.update((count, pad))
        yield pd.DataFrame({"key": [key[0]], "value": [str(count)]})

    events = (
        spark.readStream.format("epochal.map")
        .option("path", spec["path"])
        .option("map", "events")
        .option("maxRecordsPerBatch", str(spec["per_batch"]))
        .load()
        .selectExpr("key")
    )
    counts = events.groupBy("key").applyInPandasWithState(
        update,
        outputStructType="key string, value string",
        stateStructType="n long, pad string",
        outputMode="append",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )
    return (
        counts.writeStream.format("epochal.map")
        .option("path", spec["path"])
        .option("map", "counts")
        .option("mode", "idempotent")
        .outputMode("append")
    )


@dataclass
class Sample:
    """One kill."""

    kind: str
    size_mb: int
    first_batch_s: float
    caught_up_s: float
    state_files: str = "links"

    @property
    def label(self) -> str:
        """The table's row: the kind, and how state files moved when they were copied."""
        return self.kind if self.state_files == "links" else f"{self.kind}, state files copied"


@dataclass
class Producer:
    """Appends events round-robin over the keys at a steady rate (a thread)."""

    path: str
    keys: int
    rate: float
    produced: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from epochal_map.store import MapStore

        while not self.stop.is_set():
            started = time.monotonic()
            chunk = max(1, int(self.rate / 5))
            events = [(f"k{(self.produced + i) % self.keys}", "e") for i in range(chunk)]
            with MapStore(self.path) as store:
                store.append_events("events", events)
            self.produced += chunk
            self.stop.wait(max(0.0, chunk / self.rate - (time.monotonic() - started)))


class Bench:
    """One state size: a job with a standby, killed the three ways in turn."""

    def __init__(
        self, size_mb: int, args: argparse.Namespace, directory: str, state_files: str = "links"
    ) -> None:
        from epochal_map.store import MapStore

        self.size_mb, self.args, self.state_files = size_mb, args, state_files
        self.keys = args.keys
        self.pad = max(1, size_mb * 1_000_000 // self.keys)
        self.directory = f"{directory}/{size_mb}mb-{state_files}"
        os.makedirs(self.directory)
        self.path = f"{self.directory}/map.sqlite"
        with MapStore(self.path) as store:  # every key once: the state exists from batch 0
            store.append_events("events", [(f"k{i}", "e") for i in range(self.keys)])
        self.producer = Producer(self.path, self.keys, args.rate, produced=self.keys)
        os.environ[SPEC_ENV] = json.dumps(
            {"path": self.path, "pad": self.pad, "per_batch": args.per_batch}
        )

    def run(self) -> list[Sample]:
        from epochal.api import Job
        from epochal.config import JobConfig

        config = JobConfig(
            guarantee="exactly-once",
            snapshot_interval=1.0,
            snapshot_dir=f"{self.directory}/snapshots",
            standby=True,
            restart_backoff=0.0,
            max_restarts=50,
            spark_conf={
                "spark.sql.shuffle.partitions": "2",
                **dict(setting.split("=", 1) for setting in self.args.spark_conf),
            },
        )
        if self.state_files == "copies":  # the supervisor and its drivers inherit it
            os.environ[statefiles.SWITCH_ENV] = "off"
        else:
            os.environ.pop(statefiles.SWITCH_ENV, None)
        self.job = Job.submit(
            "recovery", "integration.bench.recovery:pipeline", config, report=lambda line: None
        )
        thread = threading.Thread(target=self.producer.run, daemon=True)
        try:
            self._wait(lambda: self._caught_up(self.keys), "the state to be built", 3600)
            thread.start()
            samples = []
            for turn in range(self.args.repeats):
                for kind in self.args.kinds:
                    self._wait(self._standby_ready, "a warm standby", 600)
                    time.sleep(self.args.idle)  # the job's steady pace; the standby waits
                    sample = self._kill(kind)
                    samples.append(sample)
                    self.say(
                        f"{self.size_mb:>5} MB  {sample.label:<9} first batch "
                        f"{sample.first_batch_s:6.2f}s  caught up {sample.caught_up_s:6.2f}s"
                        f"  (round {turn + 1})"
                    )
            return samples
        finally:
            self.producer.stop.set()
            self.job.cancel()
            with contextlib.suppress(Exception):
                self.job.join(120)

    def _kill(self, kind: str) -> Sample:
        record = self.job.status()
        token = str(record.driver.get("token") or "")
        produced = self.producer.produced
        killed_at = time.time()
        if kind == "in-place":
            runners = [
                p
                for p in processes.processes_of(token)
                if SOURCE_RUNNER_MODULE in processes.command_line(p)
            ]
            os.kill(runners[0], signal.SIGKILL)
        else:
            if kind == "cold":
                standby = (record.supervisor or {}).get("standby_pid")
                lease = self.job.jobdir.lease()
                for other in lease.tokens if lease else ():
                    if other != token:
                        processes.signal_run(str(other), signal.SIGKILL)
                if standby:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(standby), signal.SIGKILL)
            processes.kill_run(token)
        first = self._wait(lambda: self._new_run_committed(killed_at), "a new run's batch", 600)
        self._wait(lambda: self._caught_up(produced), "the sink to catch up", 600)
        caught_up = time.time()
        self.say(self._breakdown(killed_at))
        return Sample(
            kind, self.size_mb, first - killed_at, caught_up - killed_at, self.state_files
        )

    def _breakdown(self, killed_at: float) -> str:
        """Where the recovery went: when the failed run ended (the failure was seen), when
        the new run started, and its phases (seconds each) up to its first batch."""
        runs = self.job.status().runs
        new = next((r for r in runs if float(r.get("started", 0.0)) > killed_at), {})
        ended = [float(r["ended"]) for r in runs if r.get("ended") and r is not new]
        seen = min((e for e in ended if e >= killed_at), default=None)
        steps = [f"failure seen +{seen - killed_at:.2f}s" if seen else "failure seen ?"]
        if new:
            steps.append(f"new run +{float(new['started']) - killed_at:.2f}s")
            steps += [f"{name} {spent:.2f}" for name, spent in (new.get("phases") or {}).items()]
            spark = new.get("first_batch_spark_ms") or {}
            if spark:
                steps.append(
                    f"its {new.get('first_batch_rows')} rows: "
                    + " ".join(f"{k} {v}" for k, v in spark.items() if v >= 20)
                )
        return "        " + ", ".join(steps)

    def _new_run_committed(self, moment: float) -> float | None:
        """When the first run started after ``moment`` committed its first batch."""
        for run in reversed(self.job.status().runs):
            if float(run.get("started", 0.0)) > moment and run.get("first_batch_at"):
                return float(run["first_batch_at"])
        return None

    def _standby_ready(self) -> bool:
        record = self.job.status()
        pid = (record.supervisor or {}).get("standby_pid")
        return bool(pid) and record.status.value == "RUNNING" and processes.alive(int(pid))

    def _caught_up(self, produced: int) -> bool:
        from epochal_map.store import MapStore

        with MapStore(self.path) as store:
            counts = store.entries("counts")
        return sum(int(v) for v in counts.values()) >= produced

    def _wait(self, condition: Any, what: str, seconds: float) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            value = condition()
            if value:
                return value
            record = self.job.status()
            if record.status.finished:
                raise RuntimeError(f"the job ended ({record.status.value}: {record.failure})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.05)

    @staticmethod
    def say(line: str) -> None:
        print(line, flush=True)


FLOOR_LABEL = "plain PySpark, new process, no state"
"""The peer's row: :mod:`integration.bench.pyspark_floor`."""


def pyspark_floor(times: int, keys: int) -> list[float]:
    """Seconds from a new process's launch to plain PySpark's first committed batch of the
    benchmark's query shape (see :mod:`integration.bench.pyspark_floor`), ``times`` times."""
    totals = []
    for turn in range(times):
        launched = time.time()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "integration.bench.pyspark_floor",
                f"--launched={launched}",
                f"--keys={keys}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the PySpark floor run failed:\n{done.stderr[-3000:]}")
        steps = json.loads(lines[-1])
        totals.append(float(steps["total"]))
        print(
            f"  floor  {FLOOR_LABEL}: first batch {steps['total']:6.2f}s  (round {turn + 1}; "
            + ", ".join(f"{k} {v:.2f}" for k, v in steps.items() if k != "total")
            + ")",
            flush=True,
        )
    return totals


def table(samples: list[Sample], floor: list[float] | None = None) -> str:
    """The p50 per kind and state size, and the peer's (the same for every size)."""
    sizes = sorted({s.size_mb for s in samples})
    lines = [
        "| recovery | "
        + " | ".join(f"{size} MB: first batch / caught up" for size in sizes)
        + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for label in _labels(samples):
        cells = []
        for size in sizes:
            chosen = [s for s in samples if s.label == label and s.size_mb == size]
            if not chosen:
                cells.append("-")
                continue
            first = statistics.median(s.first_batch_s for s in chosen)
            caught = statistics.median(s.caught_up_s for s in chosen)
            cells.append(f"{first:.1f} s / {caught:.1f} s (n={len(chosen)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if floor:
        cell = f"{statistics.median(floor):.1f} s / - (n={len(floor)})"
        lines.append(f"| {FLOOR_LABEL} | " + " | ".join([cell] * len(sizes)) + " |")
    return "\n".join(lines)


def _labels(samples: list[Sample]) -> list[str]:
    """Every kind (measured or not), then each kind measured with state files copied."""
    copied = {s.kind for s in samples if s.state_files == "copies"}
    return [*KINDS, *(Sample(k, 0, 0, 0, "copies").label for k in KINDS if k in copied)]


def plot(samples: list[Sample], path: str, floor: list[float] | None = None) -> str:
    """A PNG of recovery time (p50, kill → first batch and → caught up) per state size, with
    the peer's first batch as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: pip install matplotlib"
    sizes = sorted({s.size_mb for s in samples})
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, attr, title in (
        (axes[0], "first_batch_s", "kill → first committed batch"),
        (axes[1], "caught_up_s", "kill → output caught up"),
    ):
        markers = dict(zip(KINDS, ("o", "s", "^"), strict=True))
        colours = dict(zip(KINDS, ("C0", "C1", "C2"), strict=True))
        for label in _labels(samples):
            chosen = [s for s in samples if s.label == label]
            points = [
                (size, [getattr(s, attr) for s in chosen if s.size_mb == size]) for size in sizes
            ]
            points = [(size, statistics.median(values)) for size, values in points if values]
            if points:
                kind = chosen[0].kind
                axis.plot(
                    *zip(*points, strict=True),
                    marker=markers[kind],
                    color=colours[kind],
                    linestyle=":" if chosen[0].state_files == "copies" else "-",
                    label=label,
                )
        if floor and attr == "first_batch_s":
            axis.axhline(statistics.median(floor), color="grey", linestyle="--", label=FLOOR_LABEL)
        axis.set_xscale("log")
        axis.set_xlabel("keyed state (MB, log scale)")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("seconds (p50)")
    axes[0].legend(fontsize="small")
    axes[1].legend()
    figure.suptitle("epochal recovery time by way of recovery and state size (2 cores)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _choices(what: str, allowed: tuple[str, ...]) -> Any:
    """An argparse type: a comma-separated list of ``allowed`` names, in the order given."""

    def parse(text: str) -> list[str]:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        unknown = sorted(set(chosen) - set(allowed))
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {unknown or text!r}: choose from {', '.join(allowed)}"
            )
        return chosen

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.bench.recovery")
    parser.add_argument(
        "--sizes", default="1,100,1000", help="state sizes in MB (default: %(default)s)"
    )
    parser.add_argument(
        "--keys", type=int, default=20_000, help="keys in the state (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="kills per kind and size (default: %(default)s)"
    )
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        type=_choices("kill kind(s)", KINDS),
        help="the kills to make, in turn (default: %(default)s)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=2.0,
        help="seconds from a ready standby to the kill (default: %(default)s; more than 70 "
        "measures a standby that waited past PySpark's reaping of idle Python workers)",
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="events per second (default: %(default)s)"
    )
    parser.add_argument(
        "--per-batch", type=int, default=5000, help="read limit (default: %(default)s)"
    )
    parser.add_argument(
        "--plot", default="docs/performance/recovery.png", help="PNG path (default: %(default)s)"
    )
    parser.add_argument(
        "--floor",
        type=int,
        help="runs of the plain-PySpark peer before the job (default: --repeats; 0: none)",
    )
    parser.add_argument(
        "--state-files",
        default="links",
        type=_choices("state files mode(s)", STATE_FILES),
        help="links (epochal's default), copies (Spark's own), or links,copies to run each "
        "size both ways, side by side (default: %(default)s)",
    )
    parser.add_argument("--json", help="write the samples as JSON here")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the job, e.g. spark.eventLog.enabled=true (repeatable)",
    )
    args = parser.parse_args(argv)
    if any("=" not in setting for setting in args.spark_conf):
        parser.error("--spark-conf takes KEY=VALUE, e.g. spark.eventLog.enabled=true")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    directory = tempfile.mkdtemp(prefix="epochal-recovery-")
    samples: list[Sample] = []
    floor = pyspark_floor(args.repeats if args.floor is None else args.floor, args.keys)
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for state_files in args.state_files:
                samples += Bench(size, args, directory, state_files).run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print(table(samples, floor))
    print(plot(samples, args.plot, floor))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"samples": [s.__dict__ for s in samples], "floor": floor}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
