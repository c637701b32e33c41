"""A scenario of the kit (a job run through a sequence of failures) and what it found
(:class:`Scenario`, :class:`Outcome`), the settings of the kit's Spark drivers, and the helpers
the scenarios' runs share (:func:`wait_for`, :func:`driver_log_tail`, the temporary
directory of their processes). :mod:`epochal.testing.runner` runs a scenario."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from epochal.base.fault_plan import Fault
from epochal.startup.classdata import SHORT_LIVED_JVM
from epochal.state.jobs import JobRecord, JobStatus
from epochal.testing.contract_checks.typed import SESSION_TIME_ZONE
from epochal_sdk import Guarantee

_FAST_JVM = " ".join((*SHORT_LIVED_JVM, "-Xss4m"))
TEST_SPARK_CONF = {
    # short-lived drivers and executors (SHORT_LIVED_JVM)
    "spark.driver.extraJavaOptions": _FAST_JVM,
    "spark.executor.extraJavaOptions": _FAST_JVM,
    "spark.sql.shuffle.partitions": "2",
    # the typed record's timestamps come in a zone of +05:45: a sink that drops or swaps a
    # zone shifts them (epochal.testing.contract_checks.typed)
    "spark.sql.session.timeZone": SESSION_TIME_ZONE,
}

FORMAT = "format"
"""The sink path of a pipeline that writes through the sink's data source."""
FOREACH_BATCH = "foreachBatch"
"""The sink path of a pipeline that writes through the sink's ``foreachBatch`` writer."""
LOCAL = "local[2,4]"
"""Two cores, and a failed task is retried up to 4 times (as on a cluster): a task whose
Python worker is killed runs again as a new attempt, with a new transaction id."""
CLUSTER = "local-cluster[2,1,1024]"
KIT_LEASE_TTL = 8.0
"""The lease time-to-live of the kit's jobs: short, so a zombie scenario waits little; long
enough that a loaded 2-core machine renews it in time."""


@dataclass(frozen=True)
class Scenario:
    """One crash test: a job run through a sequence of failures.

    Attributes:
        kind: ``points``, ``driver-kills``, ``executor-kills``, ``aggregate`` or
            ``real-failures`` (see the module doc).
        guarantee: the job's guarantee.
        mode: the sink mode (``transactional`` or ``idempotent``).
        faults: the failures, in the order they must happen.
        master: the Spark master (``local[2]`` or ``local-cluster[...]``).
        pipeline: ``copy`` (record ID → key and value) or ``aggregate`` (running count and
            sum per group, in Spark state).
        graceful_stop: real-failures and session-failures end with a graceful stop (a
            suspend, a ``query.stop()``) and a last start that finishes the job.
        sink_path: how the pipeline writes to the sink: ``format`` (its data source,
            ``writeStream.format("epochal.<connector>")``) or ``foreachBatch`` (its
            ``foreachBatch`` writer, :func:`epochal.foreach_batch`).
    """

    kind: str
    guarantee: Guarantee
    mode: str
    faults: tuple[Fault, ...]
    master: str = LOCAL
    pipeline: str = "copy"
    graceful_stop: bool = True
    sink_path: str = "format"

    @property
    def plan(self) -> str:
        """The fault plan (a sequence when there is more than one fault)."""
        return " > ".join(f.label for f in self.faults)

    @property
    def id(self) -> str:
        path = "" if self.sink_path == FORMAT else f"{self.sink_path}-"
        return f"{self.kind}-{path}{self.mode}-{self.guarantee.label}"

    @property
    def mode_label(self) -> str:
        """The sink mode as the coverage table shows it, with the write path when it is not
        the data source's (``transactional via foreachBatch``)."""
        return self.mode if self.sink_path == FORMAT else f"{self.mode} via {self.sink_path}"


@dataclass
class Outcome:
    """What a scenario found, counted by record ID."""

    record: JobRecord
    expected: int
    seen: int
    lost: list[int] = field(default_factory=list)
    duplicated: dict[int, int] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fired_batches: dict[str, int | None] = field(default_factory=dict)
    """The batch each fired fault recorded in its marker (None for a point that has none)."""
    wrong: dict[int, str] = field(default_factory=dict)
    """Records whose value the sink shows is not the one written: ID → the value seen."""
    wrong_typed: list[str] = field(default_factory=list)
    """Where the typed columns of the records read back differ from those written (the
    copy pipeline with the kit's typed record: a line per wrong value)."""
    metric_committed: float | None = None
    """The sink parts' ``records_committed`` counter at the end (None: none reported)."""
    source_metric_committed: float | None = None
    """The source part's ``records_committed`` counter at the end (None: none reported, as
    for a source of Spark's own). The kit's change of parallelism keeps the source's part id
    (``minRecordsPerTask`` is a tuning option), so a batch replayed across it counts once."""
    ending: JobStatus = JobStatus.COMPLETED
    """How the job was meant to end: ``COMPLETED`` (an available-now run), ``SUSPENDED`` (a
    processing-time run, stopped once it caught up; see :mod:`epochal.testing.runner`)."""

    @property
    def ended_as_meant(self) -> bool:
        """Whether the job ended as it was meant to (:attr:`ending`), not failed."""
        return self.record.status == self.ending

    def __str__(self) -> str:
        wrong = "".join(
            f", wrong value {len(self.wrong)} ({i}: {v!r})" for i, v in list(self.wrong.items())[:1]
        )
        return (
            f"expected {self.expected} records, saw {self.seen}: lost {len(self.lost)} "
            f"{self.lost[:10]}, duplicated {len(self.duplicated)} {list(self.duplicated)[:10]}"
            f"{wrong}; "
            f"restarts {self.record.restarts}, faults fired {self.fired}"
            + (f"; {'; '.join(self.notes)}" if self.notes else "")
        )

    def summary(self) -> str:
        """One line for ``-v`` output: points fired, restarts, lost, duplicated."""
        kinds = Counter(str(r.get("kind")) for r in self.record.runs)
        return (
            f"fired {len(self.fired)} fault(s); runs {self.record.run} "
            f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); restarts "
            f"{self.record.restarts}; lost {len(self.lost)}; duplicated {len(self.duplicated)}"
            + "".join(f"\n      {note}" for note in self.notes)
        )


def scenario_temp_dir(snapshot_dir: str) -> str:
    """The temporary directory of a scenario's processes: ``tmp`` beside its snapshot
    directory (in the test's own directory), made if missing."""
    path = os.path.join(os.path.dirname(os.path.abspath(snapshot_dir)), "tmp")
    os.makedirs(path, exist_ok=True)
    return path


def with_temp_dir(temp_dir: str) -> dict[str, str]:
    """The environment of a process the kit starts (a supervisor, a user's application), with
    ``TMPDIR`` set to ``temp_dir``. The runtime's drivers follow ``TMPDIR``: a supervisor
    gives each driver run a scratch directory in it, and a driver sets its JVM's
    ``java.io.tmpdir`` to it (:func:`epochal.startup.session.follow_tmpdir`), where Spark
    puts its local directories (``blockmgr-*``, ``spark-*``), the session's ``artifacts-*``
    and the native libraries it unpacks (``liblz4-java-*.so``, RocksDB's); its Python
    workers inherit it. A killed process leaves them in the test's directory, not in the
    system's."""
    return {**os.environ, "TMPDIR": temp_dir}


def driver_log_tail(log_dir: str, lines: int = 40) -> str:
    if not os.path.isdir(log_dir):
        return ""
    out = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name), errors="replace") as fh:
            tail = fh.read().splitlines()[-lines:]
        out.append(f"--- {name}\n" + "\n".join(tail))
    return "\n".join(out)


def wait_for(condition: Any, what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")
        time.sleep(0.05)
