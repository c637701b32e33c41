"""Recovery benchmark: how long a job is down after a failure, by the way it recovers and by
the size of its keyed state.

    python -m integration.bench.recovery [--sizes 1,100,1000] [--repeats 3] [--plot PATH]
        [--smoke]

``--smoke``: one in-place kill of a job with 1 MB of state in 1 000 keys and one run of the
peer (a check that the command works, not a measurement).

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
itself (``EPOCHAL_STATE_LINKS=off``, see :mod:`epochal.startup.statefiles`): the same kills,
side by side. It prints a table and writes a
PNG plot of recovery time against state size (matplotlib, ``pip install matplotlib``);
docs/evidence/performance/recovery.md shows both.

The kills above come once the standby has finished warming up, on a quiet machine, with
small batches: the best case. Two options measure what a user meets, in rows of their own
in the same table and plot:

``--workloads demo``  the job of ``python -m epochal demo`` (its pipeline, producer and
                      settings: full batches that take seconds), each kill on a new job
                      ``--kill-after`` seconds after its start (default 30: the demo's first
                      crash point), whether its standby is ready or not; the peer runs the
                      demo's query in the same conditions (a row of its own)
``--neighbour``       a second, independent Spark streaming job on the same cores through the
                      kills (:mod:`integration.bench.neighbour`); ``off,on`` for both

``--phases`` takes every recovery apart with the drivers' Spark event logs
(:mod:`integration.bench.recovery_phases`).
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
import textwrap
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from epochal.base import processes
from epochal.driver.guards import SOURCE_RUNNER_MODULE
from epochal.startup import statefiles
from integration.bench.common import SMOKE_HELP

SPEC_ENV = "EPOCHAL_RECOVERY_SPEC"
KINDS = ("cold", "standby", "in-place")
FLOOR_KIND = "plain PySpark, new process, no state"
"""The peer's row (no kill: :mod:`integration.bench.pyspark_floor`)."""
ROW_KINDS = (*KINDS, FLOOR_KIND)
"""The table's and the plot's rows: the kills, then the peer."""
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


@dataclass(frozen=True)
class Scenario:
    """The conditions of a series of kills: the job's workload, when each kill comes, a
    second Spark job on the machine or not, and how state store files move."""

    workload: str = "counts"
    kill_after: float | None = None
    """None: kill a running job ``--idle`` s after its standby is ready (one job, killed in
    turn); else kill a new job this many seconds after its start (the standby may be warming)."""
    neighbour: bool = False
    state_files: str = "links"

    @property
    def qualifiers(self) -> list[str]:
        """What the table's and the plot's labels add to the kind."""
        words = []
        if self.workload == "demo":
            words.append("demo job")
        if self.kill_after is not None:
            words.append(f"killed {self.kill_after:g} s after start")
        if self.neighbour:
            words.append("second Spark job running")
        if self.state_files == "copies":
            words.append("state files copied")
        return words


@dataclass
class Sample:
    """One kill."""

    kind: str
    size_mb: int
    first_batch_s: float
    caught_up_s: float | None
    state_files: str = "links"
    workload: str = "counts"
    kill_after: float | None = None
    neighbour: bool = False
    standby_ready: bool | None = None
    """Whether the job's warm standby had finished warming up at the kill."""
    job_age_s: float | None = None
    """Seconds from the job's start (its submission) to the kill."""

    @property
    def scenario(self) -> Scenario:
        """The conditions this kill was made in."""
        return Scenario(self.workload, self.kill_after, self.neighbour, self.state_files)

    @property
    def label(self) -> str:
        """The table's row: the kind, and the conditions that differ from the idle default."""
        return ", ".join([self.kind, *self.scenario.qualifiers])

    @property
    def column(self) -> str:
        """The table's column: the state size, or the demo's job (its own, small state)."""
        return DEMO_COLUMN if self.workload == "demo" else f"{self.size_mb} MB"


DEMO_COLUMN = "demo job"


def counts_events(start: int, count: int, keys: int) -> list[tuple[str, str]]:
    """The counts job's events: round-robin over its keys."""
    return [(f"k{(start + i) % keys}", "e") for i in range(count)]


def demo_events(start: int, count: int, keys: int) -> list[tuple[str, str]]:
    """The demo's events: (id, user), ids counting up, users round-robin (``epochal demo``)."""
    return [(str(i), f"user-{i % keys:02d}") for i in range(start, start + count)]


@dataclass
class Producer:
    """Appends events at a steady rate (a thread), ``chunk`` at a time."""

    path: str
    keys: int
    rate: float
    produced: int = 0
    chunk: int = 0
    """Events per append (0: a fifth of a second's worth)."""
    make: Any = counts_events
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from epochal_map.store import MapStore

        while not self.stop.is_set():
            started = time.monotonic()
            chunk = self.chunk or max(1, int(self.rate / 5))
            events = self.make(self.produced, chunk, self.keys)
            with MapStore(self.path) as store:
                store.append_events("events", events)
            self.produced += chunk
            self.stop.wait(max(0.0, chunk / self.rate - (time.monotonic() - started)))


DEMO_RESTART_BACKOFF = 0.5
"""The demo's job settings that differ from the counts job's (``epochal demo``: a restart
backoff of 0.5 s; Spark settings: none, so the driver's 4 shuffle partitions)..."""
DEMO_CHUNK, DEMO_RATE, DEMO_FIRST_EVENTS = 100, 250.0, 200
"""...and its producer: 100 events every 0.4 s, after 200 events written before the start."""
DEMO_KILL_AFTER = 30.0
"""Seconds from the start to the kill of the demo workload, unless ``--kill-after`` says:
the demo's first crash point (batch 8) fires about 30 s after its start."""


class Bench:
    """One state size and scenario: a job (or, with ``kill_after``, a new job per kill) with
    a standby, killed the ways asked for in turn."""

    def __init__(
        self,
        size_mb: int,
        args: argparse.Namespace,
        directory: str,
        scenario: Scenario | None = None,
    ) -> None:
        self.size_mb, self.args = size_mb, args
        self.scenario = scenario or Scenario()
        self.state_files = self.scenario.state_files
        self.demo = self.scenario.workload == "demo"
        self.keys = args.keys
        self.pad = max(1, size_mb * 1_000_000 // self.keys)
        name = "demo" if self.demo else f"{size_mb}mb"
        extra = "-".join(self.scenario.qualifiers).replace(" ", "_")
        self.directory = f"{directory}/{name}-{self.state_files}" + (f"-{extra}" if extra else "")
        os.makedirs(self.directory)
        self.events = f"{self.directory}/events" if args.phases else None

    # -- one job ------------------------------------------------------------------------
    def _prepare(self, directory: str) -> None:
        """A new journal (and sink) for a job in ``directory``, and its producer."""
        from epochal_map.store import MapStore

        os.makedirs(directory, exist_ok=True)
        self.path = f"{directory}/map.sqlite"
        self.snapshots = f"{directory}/snapshots"
        if self.demo:
            from epochal.ops.demo import MAP_ENV, USERS

            first = demo_events(0, DEMO_FIRST_EVENTS, USERS)
            self.producer = Producer(
                self.path, USERS, DEMO_RATE, len(first), DEMO_CHUNK, demo_events
            )
            os.environ[MAP_ENV] = self.path
        else:  # every key once: the state exists from batch 0
            first = counts_events(0, self.keys, self.keys)
            self.producer = Producer(self.path, self.keys, self.args.rate, produced=self.keys)
            os.environ[SPEC_ENV] = json.dumps(
                {"path": self.path, "pad": self.pad, "per_batch": self.args.per_batch}
            )
        with MapStore(self.path) as store:
            store.append_events("events", first)

    def _submit(self) -> None:
        from epochal.api import Job
        from epochal.config import JobConfig

        spark_conf = dict(setting.split("=", 1) for setting in self.args.spark_conf)
        if self.events:
            from integration.bench.recovery_phases import event_log_conf

            spark_conf.update(event_log_conf(self.events))
        if not self.demo:
            from integration.bench.pyspark_floor import COUNTS_SHUFFLE_PARTITIONS

            spark_conf = {"spark.sql.shuffle.partitions": COUNTS_SHUFFLE_PARTITIONS, **spark_conf}
        config = JobConfig(
            guarantee="exactly-once",
            snapshot_interval=1.0,
            snapshot_dir=self.snapshots,
            standby=True,
            restart_backoff=DEMO_RESTART_BACKOFF if self.demo else 0.0,
            max_restarts=50,
            spark_conf=spark_conf,
        )
        if self.state_files == "copies":  # the supervisor and its drivers inherit it
            os.environ[statefiles.SWITCH_ENV] = "off"
        else:
            os.environ.pop(statefiles.SWITCH_ENV, None)
        target = "epochal.ops.demo:pipeline" if self.demo else "integration.bench.recovery:pipeline"
        self.started = time.time()
        self.job = Job.submit("recovery", target, config, report=lambda line: None)

    def _stop(self, thread: threading.Thread | None) -> None:
        self.producer.stop.set()
        if thread is not None:
            thread.join(10)
        self.job.cancel()
        with contextlib.suppress(Exception):
            self.job.join(120)

    def run(self) -> list[Sample]:
        """The kills of this size and scenario (``--repeats`` rounds of ``--kinds``)."""
        if self.scenario.kill_after is None:
            return self._run_idle()
        return self._run_new_jobs(self.scenario.kill_after)

    def _run_idle(self) -> list[Sample]:
        """One job; each kill ``--idle`` s after its standby is ready."""
        self._prepare(self.directory)
        self._submit()
        thread = threading.Thread(target=self.producer.run, daemon=True)
        try:
            if not self.demo:
                self._wait(lambda: self._caught_up(self.keys), "the state to be built", 3600)
            thread.start()
            samples = []
            for turn in range(self.args.repeats):
                for kind in self.args.kinds:
                    self._wait(self._standby_ready, "a warm standby", 600)
                    time.sleep(self.args.idle)  # the job's steady pace; the standby waits
                    samples.append(self._kill(kind, turn))
            return samples
        finally:
            self._stop(thread)

    def _run_new_jobs(self, kill_after: float) -> list[Sample]:
        """A new job per kill, killed ``kill_after`` s after its start (once it committed a
        batch): the standby may still be warming, as in the demo."""
        samples = []
        for turn in range(self.args.repeats):
            for kind in self.args.kinds:
                self._prepare(f"{self.directory}/job-{turn}-{kind}")
                self._submit()
                thread = threading.Thread(target=self.producer.run, daemon=True)
                thread.start()
                try:
                    self._wait(self._committed, "the job's first batch", 600)
                    time.sleep(max(0.0, self.started + kill_after - time.time()))
                    samples.append(self._kill(kind, turn))
                finally:
                    self._stop(thread)
        return samples

    def _kill(self, kind: str, turn: int) -> Sample:
        record = self.job.status()
        token = str(record.driver.get("token") or "")
        produced = self.producer.produced
        ready = self._standby_ready()
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
                lease = self.job.jobdir.lease.read()
                for other in lease.tokens if lease else ():
                    if other != token:
                        processes.signal_run(str(other), signal.SIGKILL)
                if standby:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(standby), signal.SIGKILL)
            processes.kill_run(token)
        first = self._wait(lambda: self._new_run_committed(killed_at), "a new run's batch", 600)
        caught_up: float | None = None
        if not self.demo:  # the demo's producer outruns its job: it never catches up
            self._wait(lambda: self._caught_up(produced), "the sink to catch up", 600)
            caught_up = time.time() - killed_at
        sample = Sample(
            kind,
            self.size_mb,
            first - killed_at,
            caught_up,
            self.state_files,
            self.scenario.workload,
            self.scenario.kill_after,
            self.scenario.neighbour,
            ready,
            killed_at - self.started,
        )
        where = DEMO_COLUMN if self.demo else f"{self.size_mb:>5} MB"
        self.say(
            f"{where}  {sample.label:<9} first batch {sample.first_batch_s:6.2f}s  caught up "
            + (f"{caught_up:6.2f}s" if caught_up is not None else "     -")
            + f"  (round {turn + 1}; job {sample.job_age_s:.0f} s old, standby "
            + ("ready" if ready else "NOT ready")
            + ")"
        )
        self.say(self._breakdown(killed_at))
        return sample

    def _breakdown(self, killed_at: float) -> str:
        """Where the recovery went: when the failed run ended (the failure was seen), when
        the new run started, and its phases (seconds each) up to its first batch; with
        ``--phases``, the first batch taken apart with the drivers' event logs (see
        :mod:`integration.bench.recovery_phases`)."""
        record = self.job.status()
        runs = record.runs
        if self.events:
            from integration.bench import recovery_phases

            deadline = time.monotonic() + 5  # Spark's event log may lag the job record
            while True:
                found = recovery_phases.recoveries(
                    runs, recovery_phases.read_event_logs(self.events), [killed_at], record.name
                )
                mine = [r for r in found if r.killed_at == killed_at]
                split = mine and any(label.endswith("recorded") for label, _ in mine[-1].steps)
                if split or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if mine:
                return "\n".join(
                    "        " + line for line in recovery_phases.render(mine[-1]).splitlines()
                )
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

    def _committed(self) -> bool:
        """Whether the job's run committed a batch."""
        return any(run.get("first_batch_at") for run in self.job.status().runs)

    def _new_run_committed(self, moment: float) -> float | None:
        """When the first run started after ``moment`` committed its first batch."""
        for run in reversed(self.job.status().runs):
            if float(run.get("started", 0.0)) > moment and run.get("first_batch_at"):
                return float(run["first_batch_at"])
        return None

    def _standby_ready(self) -> bool:
        """Whether the job's standby has finished warming up (the supervisor's record of it)."""
        record = self.job.status()
        supervisor = record.supervisor or {}
        pid = supervisor.get("standby_pid")
        return (
            bool(pid)
            and bool(supervisor.get("standby_ready"))
            and record.status.value == "RUNNING"
            and processes.alive(int(pid))
        )

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


def pyspark_floor(times: int, keys: int, shape: str = "counts") -> list[float]:
    """Seconds from a new process's launch to plain PySpark's first committed batch of the
    benchmark's query shape, or the demo job's (``shape``; see
    :mod:`integration.bench.pyspark_floor`), ``times`` times."""
    totals = []
    for turn in range(times):
        launched = time.time()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "integration.bench.pyspark_floor",
                f"--launched={launched}",
                f"--shape={shape}",
                *([f"--keys={keys}"] if shape == "counts" else []),
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
            f"  floor  {FLOOR_KIND} ({shape}): first batch {steps['total']:6.2f}s  "
            f"(round {turn + 1}; "
            + ", ".join(f"{k} {v:.2f}" for k, v in steps.items() if k != "total")
            + ")",
            flush=True,
        )
    return totals


def demo_floor(times: int, scenario: Scenario) -> list[Sample]:
    """The demo job's peer, ``times`` times, in ``scenario``'s conditions (a second Spark job
    or not): plain PySpark's first committed batch of the demo's query in a new process."""
    return [
        Sample(FLOOR_KIND, 0, total, None, workload="demo", neighbour=scenario.neighbour)
        for total in pyspark_floor(times, 0, "demo")
    ]


def _columns(samples: list[Sample]) -> list[str]:
    """The table's columns: the state sizes measured, then the demo's job if it was."""
    sizes = sorted({s.size_mb for s in samples if s.workload != "demo"})
    demo = [DEMO_COLUMN] if any(s.workload == "demo" for s in samples) else []
    return [f"{size} MB" for size in sizes] + demo


def table(samples: list[Sample], floor: list[float] | None = None) -> str:
    """The p50 per row (kind and conditions) and column (state size, or the demo's job),
    and the peer's row (see :func:`spread` for every sample)."""
    columns = _columns(samples)
    lines = [
        "| recovery | " + " | ".join(f"{c}: first batch / caught up" for c in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for label in _labels(samples):
        cells = []
        for column in columns:
            chosen = [s for s in samples if s.label == label and s.column == column]
            if not chosen:
                cells.append("-")
                continue
            firsts = [s.first_batch_s for s in chosen]
            caught = [s.caught_up_s for s in chosen if s.caught_up_s is not None]
            cell = f"{statistics.median(firsts):.1f} s / " + (
                f"{statistics.median(caught):.1f} s" if caught else "-"
            )
            cells.append(f"{cell} (n={len(chosen)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if floor:
        cell = f"{statistics.median(floor):.1f} s / - (n={len(floor)})"
        sized = [c for c in columns if c != DEMO_COLUMN]
        lines.append(
            f"| {FLOOR_KIND} | " + " | ".join(cell if c in sized else "-" for c in columns) + " |"
        )
    return "\n".join(lines)


def spread(samples: list[Sample]) -> str:
    """Every sample of each row and column, first batch / caught up (seconds), in the order
    measured, with whether a promoted standby was ready at the kill."""
    lines = []
    for label in _labels(samples):
        for column in _columns(samples):
            chosen = [s for s in samples if s.label == label and s.column == column]
            if chosen:
                values = ", ".join(
                    f"{s.first_batch_s:.2f}"
                    + (f"/{s.caught_up_s:.2f}" if s.caught_up_s is not None else "")
                    + (
                        " (standby warming)"
                        if s.kind == "standby" and s.standby_ready is False
                        else ""
                    )
                    for s in chosen
                )
                lines.append(f"  {label} ({column}): {values}")
    return "\n".join(lines)


def _labels(samples: list[Sample]) -> list[str]:
    """Every kind of the default conditions (measured or not, when the counts job was), then
    the rows of every other scenario in the order measured, each in the order of
    :data:`ROW_KINDS`."""
    labels = list(KINDS) if any(s.workload == "counts" for s in samples) else []
    for sample in samples:
        scenario = sample.scenario
        if scenario == Scenario():
            continue
        for kind in ROW_KINDS:
            label = ", ".join([kind, *scenario.qualifiers])
            measured = any(s.label == label for s in samples)
            if measured and label not in labels:
                labels.append(label)
    return labels


MARKERS = dict(zip(ROW_KINDS, ("o", "s", "^", "x"), strict=True))
COLOURS = dict(zip(ROW_KINDS, ("C0", "C1", "C2", "grey"), strict=True))


def plot(samples: list[Sample], path: str, floor: list[float] | None = None) -> str:
    """A PNG of recovery time (p50, kill → first batch and → caught up) per state size, with
    the peer's first batch as a line; when other conditions were measured (the demo's job,
    kills soon after a start, a second Spark job), a third panel with every row's kill →
    first batch side by side (p50 bars, the samples' range as whiskers)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: pip install matplotlib"
    sized = [s for s in samples if s.workload != "demo"]
    others = any(s.scenario not in (Scenario(), Scenario(state_files="copies")) for s in samples)
    sizes = sorted({s.size_mb for s in sized})
    if not sized:  # the demo's job only: its conditions alone
        figure, axis = plt.subplots(1, 1, figsize=(11, 1.5 + 0.35 * len(set(_labels(samples)))))
        _conditions_panel(axis, samples)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        return path
    if others:
        rows = len([label for label in _labels(samples) if any(s.label == label for s in samples)])
        figure = plt.figure(figsize=(13, 4.2 + 0.3 * rows + 1.0), layout="constrained")
        grid = figure.add_gridspec(2, 2, height_ratios=[4.2, 0.3 * rows + 1.0])
        axes = [figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])]
        axes[1].sharey(axes[0])
    else:
        figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, attr, title in (
        (axes[0], "first_batch_s", "kill → first committed batch"),
        (axes[1], "caught_up_s", "kill → output caught up"),
    ):
        for label in _labels(sized):
            chosen = [s for s in sized if s.label == label]
            points = [
                (size, [v for s in chosen if s.size_mb == size and (v := getattr(s, attr))])
                for size in sizes
            ]
            points = [(size, statistics.median(values)) for size, values in points if values]
            if points:
                first = chosen[0]
                axis.plot(
                    *zip(*points, strict=True),
                    marker=MARKERS[first.kind],
                    color=COLOURS[first.kind],
                    linestyle=_line_style(first.scenario),
                    label=label,
                )
        if floor and attr == "first_batch_s":
            axis.axhline(statistics.median(floor), color="grey", linestyle="--", label=FLOOR_KIND)
        axis.set_xscale("log")
        axis.set_xlabel("keyed state (MB, log scale)")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("seconds (p50)")
    axes[0].legend(fontsize="x-small")
    axes[1].legend(fontsize="x-small")
    if others:
        _conditions_panel(figure.add_subplot(grid[1, :]), samples)
    figure.suptitle("epochal recovery time by way of recovery, state size and conditions (2 cores)")
    if not others:
        figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _line_style(scenario: Scenario) -> str:
    """Solid for the default conditions, dotted for copied state files, dashed with a second
    Spark job, dash-dotted for kills soon after a start."""
    if scenario.state_files == "copies":
        return ":"
    if scenario.neighbour:
        return "--"
    return "-." if scenario.kill_after is not None else "-"


def _conditions_panel(axis: Any, samples: list[Sample]) -> None:
    """Bars: kill → first committed batch (p50, whiskers: the samples' range) of every row,
    at the smallest state size (or the demo's job), grouped by kind."""
    columns = _columns(samples)
    bars = []
    for label in _labels(samples):
        chosen = [s for s in samples if s.label == label]
        if not chosen:
            continue
        column = next(c for c in columns if any(s.column == c for s in chosen))
        values = [s.first_batch_s for s in chosen if s.column == column]
        bars.append((f"{label} ({column})", chosen[0].kind, values))
    bars.sort(key=lambda bar: ROW_KINDS.index(bar[1]))
    bars.reverse()  # the first row at the top
    medians = [statistics.median(values) for *_, values in bars]
    axis.barh(
        range(len(bars)),
        medians,
        color=[COLOURS[kind] for _, kind, _ in bars],
        xerr=[
            [m - min(v) for m, (*_, v) in zip(medians, bars, strict=True)],
            [max(v) - m for m, (*_, v) in zip(medians, bars, strict=True)],
        ],
        capsize=3,
    )
    names = [textwrap.fill(name, 48) for name, _, _ in bars]
    axis.set_yticks(range(len(bars)), names, fontsize="small")
    axis.set_xlabel("kill → first committed batch, seconds (p50; whiskers: min-max)")
    axis.set_title("kill → first committed batch by conditions (at the smallest state size)")
    axis.grid(True, axis="x", alpha=0.3)


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


WORKLOADS = ("counts", "demo")
"""``counts``: the padded keyed count of this module (sized by ``--sizes``); ``demo``: the
job of ``python -m epochal demo`` (its pipeline, producer and settings)."""
NEIGHBOUR = ("off", "on")


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """Every scenario the options ask for, in the order they run."""
    found = []
    for neighbour in args.neighbour:
        for workload in args.workloads:
            kill_after = args.kill_after
            if kill_after is None and workload == "demo":
                kill_after = DEMO_KILL_AFTER
            for state_files in args.state_files:
                found.append(Scenario(workload, kill_after, neighbour == "on", state_files))
    return found


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
        "--workloads",
        "--workload",
        default="counts",
        type=_choices("workload(s)", WORKLOADS),
        help="counts (this benchmark's padded keyed count, at each of --sizes), demo (the job "
        "of `python -m epochal demo`: its pipeline, producer and settings), or counts,demo "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--kill-after",
        type=float,
        metavar="SECONDS",
        help="kill a new job SECONDS after its start (once it committed a batch), whether its "
        f"standby is ready or not, instead of --idle after the standby is ready (default: "
        f"{DEMO_KILL_AFTER:g} for the demo workload, --idle for counts; given, it applies to both)",
    )
    parser.add_argument(
        "--neighbour",
        nargs="?",
        const=["on"],
        default=["off"],
        type=_choices("neighbour setting(s)", NEIGHBOUR),
        help="run a second, independent Spark streaming job (plain PySpark, "
        "integration.bench.neighbour) on the machine through the kills: --neighbour (on), "
        "or off,on for both side by side (default: off)",
    )
    parser.add_argument(
        "--neighbour-rate",
        type=int,
        default=4000,
        help="rows per second of the neighbour's rate source (default: %(default)s)",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="give the job's drivers a Spark event log and print each recovery taken apart "
        "(integration.bench.recovery_phases; default: off)",
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="events per second (default: %(default)s)"
    )
    parser.add_argument(
        "--per-batch", type=int, default=5000, help="read limit (default: %(default)s)"
    )
    parser.add_argument(
        "--plot",
        default="docs/evidence/performance/recovery.png",
        help="PNG path (default: %(default)s)",
    )
    parser.add_argument(
        "--floor",
        type=int,
        help="runs of the plain-PySpark peer: of the counts job's shape before the jobs, of the "
        "demo job's in each of its scenarios' conditions (default: --repeats; 0: none)",
    )
    parser.add_argument(
        "--state-files",
        default="links",
        type=_choices("state files mode(s)", STATE_FILES),
        help="links (epochal's default), copies (Spark's own), or links,copies to run each "
        "size both ways, side by side (default: %(default)s)",
    )
    parser.add_argument("--json", help="write the samples as JSON here")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the job, e.g. spark.eventLog.enabled=true (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.keys, args.repeats, args.kinds, args.floor = "1", 1_000, 1, ["in-place"], 1
    if any("=" not in setting for setting in args.spark_conf):
        parser.error("--spark-conf takes KEY=VALUE, e.g. spark.eventLog.enabled=true")
    if args.kill_after is not None and args.kill_after < 0:
        parser.error("--kill-after takes seconds from the job's start: 0 or more")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    directory = tempfile.mkdtemp(prefix="epochal-recovery-")
    samples: list[Sample] = []
    if args.floor is None:
        args.floor = args.repeats
    # the peer of the counts job's shape, in its size columns, once on the quiet machine; the
    # demo job's peer in each of its scenarios' conditions (below)
    floor = pyspark_floor(args.floor if "counts" in args.workloads else 0, args.keys)
    floored: set[bool] = set()
    try:
        for scenario in scenarios(args):
            with _neighbour(scenario, args, directory) as neighbour:
                sizes = [0] if scenario.workload == "demo" else args.sizes.split(",")
                for size in (int(s) for s in sizes):
                    samples += Bench(size, args, directory, scenario).run()
                if scenario.workload == "demo" and scenario.neighbour not in floored:
                    floored.add(scenario.neighbour)  # once per condition: it has no state files
                    samples += demo_floor(args.floor, scenario)
            if neighbour is not None:
                print("  " + neighbour.describe(), flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print(table(samples, floor))
    print("samples (kill → first batch / caught up, s):")
    print(spread(samples))
    print(plot(samples, args.plot, floor))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"samples": [s.__dict__ for s in samples], "floor": floor}, fh, indent=2)
    return 0


@contextlib.contextmanager
def _neighbour(scenario: Scenario, args: argparse.Namespace, directory: str) -> Any:
    """The scenario's second Spark job (started before its job, stopped after), or None."""
    if not scenario.neighbour:
        yield None
        return
    from integration.bench.neighbour import Neighbour

    log = os.path.join(directory, f"neighbour-{len(os.listdir(directory))}.log")
    with Neighbour(args.neighbour_rate, 500, log) as neighbour:
        yield neighbour


if __name__ == "__main__":
    sys.exit(main())
