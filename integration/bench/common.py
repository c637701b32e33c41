"""What the benchmark commands share: the result type, the available-now runner, the
statistics and plot of repeated, interleaved rounds, and the description of the machine."""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SMOKE_HELP = (
    "run at the smallest size (one round, small batches, no warm-up): checks that the command "
    "works and prints its figures; the figures measure nothing"
)
"""The help of every benchmark's ``--smoke`` flag (what ``integration/test_benchmarks.py``
runs)."""
_driver_java_options = ""


def smoke_run() -> None:
    """Called by a benchmark's ``--smoke``: its session's driver, which measures nothing and
    lives for seconds, gets the short-lived JVM settings (``SHORT_LIVED_JVM``: C1 only, a
    third less CPU); a measuring run keeps the JVM's defaults."""
    from epochal.startup.classdata import SHORT_LIVED_JVM_OPTIONS

    global _driver_java_options
    _driver_java_options = SHORT_LIVED_JVM_OPTIONS


@dataclass
class Result:
    """One benchmark variant's figures."""

    name: str
    records: int
    seconds: float
    batch_ms: list[float]
    note: str = ""
    batch_rows: list[int] | None = None
    phases: dict[str, float] | None = None
    """Mean ms per batch of Spark's phases (latestOffset, addBatch, walCommit, ...)."""

    @property
    def rate(self) -> float:
        """Records per second over the measured time."""
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def steady(self) -> float:
        """The rate without the first batch (which pays the query's start-up)."""
        rows, ms = self.batch_rows or [], self.batch_ms
        if len(rows) < 2:
            return self.rate
        return sum(rows[1:]) / (sum(ms[1:]) / 1000) if sum(ms[1:]) else 0.0


class MeasuredBatches:
    """A query's per-batch latencies (``batch_ms``) and rows (``batch_rows``), set by the
    dataclass that mixes this in; its first batch (the query's start) and its last are not
    measured when there are three or more."""

    batch_ms: list[float]
    batch_rows: list[int]

    def _measured(self) -> slice:
        return slice(1, -1) if len(self.batch_ms) >= 3 else slice(0, None)

    @property
    def measured_ms(self) -> list[float]:
        """Latencies of the measured batches."""
        return self.batch_ms[self._measured()]

    @property
    def steady(self) -> float:
        """Throughput: records per measured batch / their median latency (records/s)."""
        rows, ms = self.batch_rows[self._measured()], self.measured_ms
        return statistics.mean(rows) / (statistics.median(ms) / 1000) if ms else 0.0


def bench_session(app_name: str, connectors: list[str], **conf: str) -> Any:
    """The one SparkSession of a benchmark run (``local[2]``, quiet, ``conf`` added) with
    epochal's ``connectors`` registered; Python workers run this interpreter. It runs on
    epochal's Spark home and local file system, as epochal's drivers do, so the peers measured
    in it (Spark's own connectors, ``foreachBatch``) write their checkpoints the same way."""
    import os
    import sys

    from pyspark.sql import SparkSession

    from epochal.spark.datasource import register
    from epochal.startup.home import use_fast_spark_home
    from epochal.startup.statefiles import session_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    use_fast_spark_home("local[2]")  # what epochal's drivers do
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in session_conf("local[2]").items():  # epochal's local file system, for
        builder = builder.config(key, value)  # every way of the run, the peers' too
    if _driver_java_options:
        builder = builder.config("spark.driver.extraJavaOptions", _driver_java_options)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark, connectors)
    return spark


def run_available_now(reader: Any, fmt: str, options: dict[str, str], checkpoint: str) -> list:
    """Run one ``Trigger.AvailableNow`` query to its end and return the progress reports of
    its batches that had data (the figures come from Spark's own ``triggerExecution``)."""
    query = (
        reader.writeStream.format(fmt)
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def mean_phases(progress: Sequence[Any]) -> dict[str, float]:
    """Mean ms per batch of each of Spark's ``durationMs`` phases over the progress reports
    ``progress`` (``triggerExecution``, their sum, left out); a phase a report lacks counts 0."""
    names = sorted({k for p in progress for k in p["durationMs"]} - {"triggerExecution"})
    return {k: statistics.mean(float(p["durationMs"].get(k, 0)) for p in progress) for k in names}


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linear between order statistics."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rotated(items: Sequence[Any], turn: int) -> list[Any]:
    """``items`` starting at ``turn`` (modulo its length): each round of an interleaved
    benchmark runs the variants in another order, so that no variant always runs first,
    last or after the same neighbour."""
    shift = turn % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


@dataclass(frozen=True)
class Spread:
    """A figure measured once per round: the median over the rounds, the interquartile range
    of the rounds, and a bootstrap confidence interval of the median."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    rounds: int

    def __str__(self) -> str:
        return (
            f"{self.median:.3f} (IQR {self.q1:.3f}-{self.q3:.3f}, "
            f"95% CI {self.low:.3f}-{self.high:.3f}, {self.rounds} rounds)"
        )


def spread(
    values: Sequence[float],
    *,
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    resamples: int = 4000,
    confidence: float = 0.95,
    seed: int = 20261122,
) -> Spread:
    """The :class:`Spread` of per-round ``values``: the percentile bootstrap (resampling whole
    rounds with replacement, a fixed seed) gives the interval of ``statistic``."""
    if not values:
        return Spread(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    generator = random.Random(seed)
    draws = sorted(statistic([generator.choice(values) for _ in values]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return Spread(
        statistic(values),
        quantile(values, 0.25),
        quantile(values, 0.75),
        quantile(draws, tail),
        quantile(draws, 1 - tail),
        len(values),
    )


def ratio_lines(
    ratios: dict[str, Sequence[float]], targets: dict[str, float], width: int = 52
) -> list[str]:
    """One printed line per ratio: its label (with its target, if any) and the
    :class:`Spread` of its per-round values."""
    lines = []
    for label, values in ratios.items():
        goal = f" (target >= {targets[label]})" if label in targets else ""
        lines.append(f"  {label + goal:<{width}} {spread(values)}")
    return lines


def epochal_options(snapshot_dir: str, guarantee: str, job: str) -> dict[str, str]:
    """The ``epochal.*`` options of one benchmark query: its own job (so no state is shared
    between queries) with the guarantee asked for."""
    return {"epochal.snapshotDir": snapshot_dir, "epochal.guarantee": guarantee, "epochal.job": job}


def write_plot(
    path: str,
    title: str,
    rates: dict[str, list[float]],
    latencies: dict[str, list[float]],
    *,
    ratios: dict[str, list[float]] | None = None,
    targets: dict[str, float] | None = None,
    rate_label: str = "records/s per round",
    latency_label: str = "ms per batch",
    differences: dict[str, list[float]] | None = None,
) -> str | None:
    """A PNG: each variant's per-round throughput (box and points), its per-batch latency
    (box and points) and, if given, ratios per round and differences in ms per round (a
    panel each, one line per figure, with their ``targets`` as dashed lines). Needs
    matplotlib (``pip install matplotlib``); without it nothing is written and the reason is
    returned."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    names = [n for n in rates if rates[n]]
    panels = 2 + bool(ratios) + bool(differences)
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8))
    jitter = random.Random(1)
    for axis, data, label in (
        (axes[0], rates, rate_label),
        (axes[1], latencies, latency_label),
    ):
        series = [data.get(n, []) for n in names]
        axis.boxplot(series, showfliers=False, widths=0.5)
        for index, values in enumerate(series, start=1):
            xs = [index + jitter.uniform(-0.15, 0.15) for _ in values]
            axis.scatter(xs, values, s=9, alpha=0.55, zorder=3)
        axis.set_xticks(range(1, len(names) + 1), names, rotation=15, ha="right")
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.grid(axis="y", alpha=0.3)
    axes[0].set_title("throughput (one point per round)")
    axes[1].set_title(f"latency (one point per {latency_label.removeprefix('ms per ')})")
    panel = 2
    for figures, ylabel, heading, corner in (
        (ratios, "ratio of throughputs (dashed: target)", "ratios per round", "lower left"),
        (differences, "ms (dashed: target)", "differences per round", "upper left"),
    ):
        if figures:
            _per_round(axes[panel], figures, targets or {}, ylabel, heading, corner)
            panel += 1
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


def _per_round(
    axis: Any,
    figures: dict[str, list[float]],
    targets: dict[str, float],
    ylabel: str,
    heading: str,
    corner: str,
) -> None:
    """One line per figure over the rounds, its target (if any) dashed in the same colour."""
    for index, (label, values) in enumerate(figures.items()):
        color = f"C{index}"
        median = statistics.median(values) if values else 0.0
        axis.plot(
            range(1, len(values) + 1),
            values,
            marker="o",
            color=color,
            label=f"{label}: median {median:.2f}",
        )
        if label in targets:
            axis.axhline(targets[label], color=color, linestyle="--", linewidth=1)
    axis.set_xlabel("round")
    axis.set_ylabel(ylabel)
    axis.set_title(heading)
    axis.legend(fontsize=7, loc=corner)
    axis.grid(alpha=0.3)


def machine() -> str:
    """A one-line description of this machine: OS, CPUs, memory, Python, load."""
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    memory = 0
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
        with open("/proc/meminfo") as fh:
            memory = int(fh.readline().split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return (
        f"{platform.platform()}, {os.cpu_count()} CPU(s) {cpu}, {memory} MiB, Python "
        f"{platform.python_version()}, load {load:.1f}"
    )


def write_runs(path: str, args: Any, runs: Sequence[Any], **extra: Any) -> None:
    """A benchmark's ``--json`` file: the machine, the arguments and every run (dataclasses),
    and whatever ``extra`` adds."""
    record = {"machine": machine(), "args": vars(args), "runs": [asdict(r) for r in runs]}
    Path(path).write_text(json.dumps({**record, **extra}, indent=1))
