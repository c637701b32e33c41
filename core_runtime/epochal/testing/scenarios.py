"""Running one scenario of the kit: a job run through a sequence of failures, then counted by
record ID through the sink's independent reader (:func:`run_case`)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochal.api import Job
from epochal.base.fault_plan import Fault, FaultPlan
from epochal.config import JobConfig
from epochal.control.launcher import DriverPool
from epochal.pipelines import SPEC_FILE
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.testing.points import RESTARTER_KINDS
from epochal_sdk import Guarantee

if TYPE_CHECKING:
    from epochal.testing.suite import SinkUnderTest, SourceUnderTest

_FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m -XX:-UsePerfData"
TEST_SPARK_CONF = {
    # Short-lived test drivers: C1 only and the serial GC start faster and use less CPU on a
    # small machine; production jobs keep the JVM defaults. No perf data: a JVM writes it to
    # /tmp/hsperfdata_<user> whatever its temporary directory, and a killed one leaves it.
    "spark.driver.extraJavaOptions": _FAST_JVM,
    "spark.executor.extraJavaOptions": _FAST_JVM,
    "spark.sql.shuffle.partitions": "2",
}

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
    """

    kind: str
    guarantee: Guarantee
    mode: str
    faults: tuple[Fault, ...]
    master: str = LOCAL
    pipeline: str = "copy"

    @property
    def plan(self) -> str:
        """The fault plan (a sequence when there is more than one fault)."""
        return " > ".join(f.label for f in self.faults)

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.mode}-{self.guarantee.label}"


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

    def __str__(self) -> str:
        return (
            f"expected {self.expected} records, saw {self.seen}: lost {len(self.lost)} "
            f"{self.lost[:10]}, duplicated {len(self.duplicated)} {list(self.duplicated)[:10]}; "
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
    ``java.io.tmpdir`` to it (:func:`epochal.driver.session.follow_tmpdir`), where Spark
    puts its local directories (``blockmgr-*``, ``spark-*``), the session's ``artifacts-*``
    and the native libraries it unpacks (``liblz4-java-*.so``, RocksDB's); its Python
    workers inherit it. A killed process leaves them in the test's directory, not in the
    system's."""
    return {**os.environ, "TMPDIR": temp_dir}


def run_case(
    scenario: Scenario,
    source: SourceUnderTest,
    sink: SinkUnderTest,
    snapshot_dir: str,
    *,
    records: int = 400,
    per_batch: int = 100,
    groups: int = 10,
    pool: DriverPool | None = None,
) -> Outcome:
    """Run one scenario and count what the sink shows, by record ID. The processes it starts
    keep their temporary files in :func:`scenario_temp_dir` (see :func:`with_temp_dir`)."""
    batches = len(scenario.faults) + 3
    if scenario.kind in RESTARTER_KINDS:
        batches += 20  # room for the take-overs and the random kills (~5-10 batches)
    ids = list(range(max(records, per_batch * batches)))
    source.produce(ids)
    spec = {
        "source": source.connector,
        "source_format": source.format,
        "source_options": {**source.options(), "maxRecordsPerBatch": str(per_batch)},
        "sink": sink.connector,
        "sink_options": sink.options(scenario.mode),
        "id_expr": source.id_expr,
        "groups": groups,
        "route_by_key": source.route_by_key,
    }
    config = JobConfig(
        guarantee=scenario.guarantee,
        available_now=True,
        master=scenario.master,
        snapshot_dir=snapshot_dir,
        faults=scenario.plan,
        restart_backoff=0.2,
        max_restart_backoff=0.4,  # the faults are planned: no server to wait for
        max_restarts=len(scenario.faults) + 5,
        spark_conf=dict(TEST_SPARK_CONF),
        lease_ttl=KIT_LEASE_TTL,
    )
    name = f"conformance-{uuid.uuid4().hex[:8]}"
    jobdir = JobDirectory(snapshot_dir, name)
    os.makedirs(jobdir.path, exist_ok=True)
    with open(f"{jobdir.path}/{SPEC_FILE}", "w") as fh:
        json.dump(spec, fh)
    notes: list[str] = []
    if scenario.kind == "real-failures":
        from epochal.testing.real_failures import RealFailures

        record = RealFailures(
            jobdir, scenario, config, seed=name, temp_dir=scenario_temp_dir(snapshot_dir)
        ).run(notes)
    elif scenario.kind == "session-failures":
        from epochal.testing.session_failures import SessionFailures

        record = SessionFailures(
            jobdir, scenario, spec, seed=name, temp_dir=scenario_temp_dir(snapshot_dir)
        ).run(notes)
    else:
        lines: list[str] = []
        use_pool = pool if scenario.master == LOCAL else None
        job = Job.submit(
            name,
            f"epochal.pipelines:{scenario.pipeline}",
            config,
            report=lines.append,
            pool=use_pool,
        )
        record = job.join(timeout=600)
        if record.status != JobStatus.COMPLETED:
            record.failure = (
                f"{record.failure}\nsupervisor: {lines}\n{driver_log_tail(jobdir.logs)}"
            )
    plan = FaultPlan.parse(scenario.plan, f"{jobdir.path}/faults")
    fired = plan.fired()
    fired_batches = {label: plan.marker_info(label).get("batch") for label in fired}
    committed = sink.committed(scenario.mode)
    if scenario.pipeline == "aggregate":
        return _count_groups(record, ids, committed, groups, fired)
    seen = [int(key) for key, _ in committed]
    counts = Counter(seen)
    return Outcome(
        record=record,
        expected=len(ids),
        seen=len(seen),
        lost=sorted(set(ids) - set(counts)),
        duplicated={i: n for i, n in counts.items() if n > 1},
        fired=fired,
        notes=notes,
        fired_batches=fired_batches,
    )


def _count_groups(
    record: JobRecord,
    ids: list[int],
    committed: list[tuple[str, str]],
    groups: int,
    fired: list[str],
) -> Outcome:
    """For the aggregate pipeline: the last value of each group is ``count:sum``."""
    final: dict[str, str] = {}
    for key, value in committed:
        final[key] = value
    lost: list[int] = []
    duplicated: dict[int, int] = {}
    for group in range(groups):
        members = [i for i in ids if i % groups == group]
        count, _, total = final.get(str(group), "0:0").partition(":")
        extra = int(count) - len(members)
        if extra < 0 or int(total) < sum(members):
            lost.append(group)
        elif extra > 0 or int(total) > sum(members):
            duplicated[group] = extra
    return Outcome(record, len(ids), len(ids), lost, duplicated, fired)


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
