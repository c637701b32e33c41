"""JobContext: who is running (job, run, lease epoch, guarantee, store) as seen by the
connector adapters.

Under ``epochal run`` each driver run has a token and a directory of run records in its
environment, which its JVM and every Python worker inherit; the run's record
(:func:`~epochal.state.run_records.read_run_record`) says which job it runs, at which lease
epoch, as which run. A data source reads it when it is created, so a driver that restarts its
query in place, or a warm driver (a standby, a driver of a pool) that learns its job only when
it is promoted, hands the right values to its data sources without a new JVM. The data source
captures the context on the driver and carries it, pickled, to the executors.

A query started without ``epochal run`` gives the job through options (``epochal.job``,
``epochal.snapshotDir``, ``epochal.guarantee``) or the environment, and its driver holds the
job's lease itself (:mod:`epochal.state.lease.session`): the same fence, run numbers from the
job's record. Exactly-once without a snapshot directory is refused: there is no lease to
hold, so nothing would stop a second driver of the same job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from epochal.base.fault_plan import FaultPlan
from epochal.base.processes import RUN_TOKEN_ENV
from epochal.config import timeline_enabled
from epochal.state.layout import FAULTS, JobLayout
from epochal.state.lease import session as session_lease
from epochal.state.lease.fence import Fence, state_dir
from epochal.state.lease.session import DriverJvm
from epochal.state.run_records import RUN_DIR_ENV, read_run_record
from epochal.state.store import SnapshotStore
from epochal_sdk import ConfigError, Guarantee
from epochal_sdk.errors import FencedError

ENV_JOB = "EPOCHAL_JOB"
ENV_JOB_DIR = "EPOCHAL_JOB_DIR"
ENV_GUARANTEE = "EPOCHAL_GUARANTEE"
ENV_ALLOW_DOWNGRADE = "EPOCHAL_ALLOW_DOWNGRADE"
ENV_FAULTS = "EPOCHAL_FAULTS"


@dataclass(frozen=True)
class JobContext:
    """What a connector adapter needs to know about the job it runs in."""

    job: str = "default"
    job_dir: str | None = None
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    allow_downgrade: bool = False
    run: int = 0
    lease_epoch: int = 0
    faults: FaultPlan = field(default_factory=FaultPlan)
    supervised: bool = False
    spark_checkpoint: str | None = None
    """Spark's checkpoint of a query started without ``epochal run``, when its options say
    where it is (``epochal.checkpointLocation``)."""
    incarnation: str = ""
    """The job's incarnation (its record's; see :mod:`epochal_sdk.ids`), known once the run
    holds the lease ("" for a job recorded without one, or a run without a lease)."""
    timeline: bool = False
    """Whether the job's sinks note a timeline of each batch (:mod:`epochal.metrics.timeline`:
    the option ``epochal.timeline``, or ``EPOCHAL_TIMELINE=1`` in the driver's environment)."""

    @classmethod
    def current(cls, options: Mapping[str, str] | None = None) -> JobContext:
        """The context of the driver run this process belongs to (its run record), or for a
        query started without ``epochal run``, the one its options and environment give."""
        record = cls._run_record()
        if record is not None:
            directory: str | None = str(record["job_dir"])
            return cls(
                job=str(record["job"]),
                job_dir=directory,
                guarantee=Guarantee.parse(record["guarantee"]),
                allow_downgrade=bool(record.get("allow_downgrade")),
                run=int(record["run"]),
                lease_epoch=int(record["epoch"]),
                incarnation=str(record.get("incarnation", "")),
                faults=FaultPlan.parse(record.get("faults", ""), f"{directory}/{FAULTS}"),
                supervised=True,
                timeline=timeline_enabled(options),
            )
        opts = {k.lower(): v for k, v in (options or {}).items()}
        env = os.environ
        job = opts.get("epochal.job") or env.get(ENV_JOB) or "default"
        directory = env.get(ENV_JOB_DIR)
        if opts.get("epochal.snapshotdir"):
            try:
                directory = JobLayout(opts["epochal.snapshotdir"], job).path
            except ValueError as exc:
                raise ConfigError(
                    f"job {job!r}", "epochal.job", str(exc), "Give another job name."
                ) from None
        guarantee = Guarantee.parse(
            opts.get("epochal.guarantee") or env.get(ENV_GUARANTEE) or "exactly-once"
        )
        faults_text = opts.get("epochal.faults") or env.get(ENV_FAULTS, "")
        marker_dir = f"{directory}/{FAULTS}" if directory else None
        return cls(
            job=job,
            job_dir=directory,
            guarantee=guarantee,
            allow_downgrade=(env.get(ENV_ALLOW_DOWNGRADE) == "1")
            or opts.get("epochal.allowdowngrade", "").lower() == "true",
            faults=FaultPlan.parse(faults_text, marker_dir),
            spark_checkpoint=opts.get("epochal.checkpointlocation") or None,
            timeline=timeline_enabled(opts),
        )

    def holding_the_lease(
        self,
        options: Mapping[str, str] | None = None,
        driver: DriverJvm | None = None,
        *,
        query_start: str | None = None,
    ) -> JobContext:
        """This context with the job's lease held by this process's driver (``driver``:
        default, the JVM this process runs under; a query started without ``epochal run``):
        its lease epoch and run. A supervised run holds it already; a query without a
        snapshot directory holds none, which only less than exactly-once may do.
        ``query_start``: the job's query starts now, as the Spark query run of this id; a
        start after the first in this driver begins a new run
        (:func:`~epochal.state.lease.session.hold`)."""
        if self.supervised:
            return self
        if not self.job_dir:
            if self.guarantee == Guarantee.EXACTLY_ONCE:
                raise ConfigError(
                    f"job {self.job!r}",
                    "epochal.snapshotDir",
                    "an exactly-once query holds its job's lease (the fence that keeps a "
                    "second driver of the job from acting) in the job's snapshot directory, "
                    "and none is given",
                    "Set .option('epochal.snapshotDir', <directory>) (and "
                    "'epochal.job') on the query, or lower it with "
                    ".option('epochal.guarantee', 'at-least-once')",
                )
            return self
        opts = {k.lower(): v for k, v in (options or {}).items()}
        snapshot_dir, _, name = self.job_dir.rstrip("/").rpartition("/")
        holding = session_lease.hold(
            JobLayout(snapshot_dir, name),
            self.guarantee,
            session_lease.lease_ttl(opts),
            driver,
            query_start=query_start,
        )
        return replace(
            self, run=holding.run, lease_epoch=holding.epoch, incarnation=holding.incarnation
        )

    @staticmethod
    def _run_record() -> dict | None:
        token, run_dir = os.environ.get(RUN_TOKEN_ENV), os.environ.get(RUN_DIR_ENV)
        if not token or not run_dir:
            return None
        record = read_run_record(run_dir, token)
        if record is None:
            raise FencedError(
                f"driver run {token}: its run record is gone from {run_dir}: the run ended or "
                "was taken over, so nothing of it may start now"
            )
        return record

    @property
    def fence(self) -> Fence:
        """The fencing check of this run (inactive only for a run that holds no lease)."""
        return Fence(self.job_dir if self.lease_epoch > 0 else None, self.lease_epoch)

    def check_fence(self, doing: str) -> None:
        """Raise ``FencedError`` if another driver owns the job now."""
        self.fence.check(doing)

    @property
    def state_dir(self) -> str | None:
        """Where this run's state lives: the directory of its lease epoch (the job directory
        itself for a run that holds no lease)."""
        if not self.job_dir:
            return None
        if self.lease_epoch > 0:
            return state_dir(self.job_dir, self.lease_epoch)
        return self.job_dir

    def store(self, needed_by: str) -> SnapshotStore:
        """The run's snapshot store; a clear error if the query runs without one. Under a
        lease it is anchored to the epoch's directory: a fenced run cannot write."""
        directory = self.state_dir
        if not directory:
            raise ConfigError(
                needed_by,
                "epochal.snapshotDir",
                "there is no snapshot store to keep this connector's part of the snapshot",
                "Run the query with `epochal run` / epochal.Job, "
                "or set .option('epochal.snapshotDir', <directory>)",
            )
        anchor = directory if self.fence.active else None
        return SnapshotStore(f"{directory}/store", anchor=anchor)

    @property
    def checkpoint(self) -> str | None:
        """Spark's checkpoint of this run, when it is epochal's to know: supervised, or given
        to a query started without ``epochal run`` as ``epochal.checkpointLocation`` (an
        acknowledging source then settles its last batch at the end of an available-now run
        instead of at the next run's start)."""
        if self.supervised and self.state_dir:
            return f"{self.state_dir}/checkpoint"
        return self.spark_checkpoint

    def reach(self, point: str, batch: int | None = None) -> None:
        """A protocol step: fire the crash point if the fault plan names it."""
        self.faults.reach(point, batch)
