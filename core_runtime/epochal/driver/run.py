"""The runs of a job's query in one driver process.

``python -m epochal.driver`` (:mod:`epochal.driver.__main__`) builds the SparkSession of a
session profile (:mod:`epochal.driver.session`); bound to a job (at once, or when a warm
driver is promoted) it checks the quorum, rebuilds the query from the user's function, points
it at the checkpoint of its lease epoch, runs it and reports progress
(:mod:`epochal.driver.progress`), guarded by :mod:`epochal.driver.guards`.

A restartable failure that leaves the driver healthy (a lost server, a crashed Python worker,
a lost executor) restarts the query *in place*: same JVM, same SparkSession, a new run, as the
job's restart policy (:mod:`epochal.control.restart`) says. Everything else ends the process
with one of the exit codes of :mod:`epochal.control.messages`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from typing import Any

from epochal.base import processes, secrets
from epochal.base.fault_plan import FaultPlan
from epochal.config import JobConfig
from epochal.control import restart
from epochal.control.failures import FENCED, Failure, identify, summary_of
from epochal.control.messages import (
    EXIT_DONE,
    EXIT_FATAL,
    EXIT_FENCED,
    EXIT_RESTARTABLE,
    Promotion,
    emit,
)
from epochal.driver.guards import (
    LeaseWatchdog,
    QueryWatch,
    SourceRunnerWatch,
    Supervision,
    check_quorum,
    jvm_pid,
    self_destruct,
)
from epochal.driver.progress import Phases, ProgressReporter, RunState, make_listener
from epochal.driver.session import (
    PlannerKeeper,
    job_environment,
    load_target,
    session_alive,
    wait_for_idle,
)
from epochal.parts.spark_plan import UnreadablePlanError, judge, part_records, read_query
from epochal.startup.session import SessionProfile, spark_session
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.lease.fence import Fence, checkpoint_location, state_dir
from epochal.state.run_records import RUN_DIR_ENV, write_run_record
from epochal.state.store import SnapshotStore
from epochal_sdk.errors import FencedError


class Driver:
    """One driver process: its session, then (once bound to a job) its lease epoch and the
    runs of the job's query."""

    def __init__(self, supervision: Supervision, profile: SessionProfile) -> None:
        self.supervision = supervision
        self.profile = profile
        self.jobdir: JobDirectory | None = None
        self.record: JobRecord | None = None
        self.epoch = 0
        self.fence = Fence(None, 0)
        self.faults = FaultPlan()
        self.current = RunState()
        self.spark: Any = None
        self.runners = SourceRunnerWatch(None)

    @property
    def state(self) -> str:
        """The state directory of this driver's lease epoch."""
        assert self.jobdir is not None
        return state_dir(self.jobdir.path, self.epoch)

    @property
    def config(self) -> JobConfig:
        """The job's config."""
        assert self.record is not None
        return self.record.job_config

    def main(
        self,
        job: Promotion | None,
        launched: float,
        keep_warm: bool = False,
        warm_up: bool = True,
    ) -> int:
        """Start the session; when ``job`` is None, warm up (unless not ``warm_up``) and wait
        to be promoted (with ``keep_warm``, warming up again every
        :data:`~epochal.startup.warmup.KEEP_WARM_SECONDS` while it waits); then run the job
        until done. Returns the exit code."""
        phases = self.current.phases = Phases(launched)
        try:
            phases.mark("process", since=launched)
            from epochal.spark.datasource import register

            self.spark = spark_session(self.profile)
            phases.mark("session")
            register(self.spark)
            phases.mark("register")
            kind = "cold"
            if job is None:
                from epochal.startup import warmup

                # promoted while it warms up: the job is waiting, so the warm-up stops there
                def promoted() -> bool:
                    return self.supervision.promoted

                skip = promoted() or not warm_up
                took = 0.0 if skip else warmup.warm_up(self.spark, stop_if=promoted)
                emit({"type": "ready", "warmup_s": round(took, 2)})

                def stay_warm() -> None:
                    warmup.keep_warm(self.spark, stop_if=promoted)

                job = self.supervision.wait_for_promotion(
                    stay_warm if keep_warm else None, every=warmup.KEEP_WARM_SECONDS
                )
                job.apply_env(os.environ)  # the supervisor's, as it is now
                kind, launched = "standby", time.time()
                phases = self.current.phases = Phases(launched)
            build = self._bind(job)
            phases.mark("bind")
            return self._runs(build, kind, launched)
        except BaseException as exc:
            text = "".join(traceback.format_exception(exc))
            return self._fail(text)
        finally:
            if self.spark is not None:
                with contextlib.suppress(Exception):
                    self.spark.stop()

    def _bind(self, job: Promotion) -> Any:
        """Become the driver of the job at its lease epoch: its fence, its watchdog, its
        listener; returns the job's build function."""
        self.jobdir = JobDirectory(job.snapshot_dir, job.job)
        self.record = self.jobdir.load()
        wanted = SessionProfile.of(self.record)
        if wanted.master != self.profile.master or wanted.spark_conf != self.profile.spark_conf:
            raise ValueError(
                f"this driver's session ({self.profile.master}) does not fit job {job.job!r} "
                f"({wanted.master}); the supervisor must start a new driver"
            )
        job_environment(self.record, self.jobdir)
        self.epoch = job.epoch
        self.fence = self.jobdir.fence(job.epoch)
        self.faults = FaultPlan.parse(self.record.job_config.faults, self.jobdir.layout.faults)
        LeaseWatchdog(self.jobdir, job.epoch, self.supervision.supervisor_pid).start()
        reporter = ProgressReporter(self.jobdir, self.record, self.state, self.fence, self.current)
        self.spark.streams.addListener(make_listener(reporter, self.faults, self_destruct))
        PlannerKeeper(self.spark).start()
        return load_target(self.record.target)

    def _runs(self, build: Any, kind: str, started: float) -> int:
        assert self.jobdir is not None and self.record is not None
        while True:
            check_quorum(self.spark, self.jobdir, self.fence, self.config)
            self.current.phases.mark("quorum")
            self._begin_run(kind, started)
            query = self._start_query(build)
            self.current.phases.mark("query start")
            outcome = QueryWatch(self.spark, self.jobdir, self.runners).until_ended(
                query,
                lambda: self.current.first_batch_seen,
                available_now=self.config.available_now,
                job=self.record.name,
            )
            seen = time.time()  # the failed query has ended: its run ends here
            if outcome is None:
                return EXIT_DONE
            failure = identify(outcome)
            if failure.failure is Failure.FATAL or not failure.in_place or not self._healthy():
                return self._fail(outcome)
            if not self._restart_in_place(outcome, seen):
                return EXIT_FATAL
            kind, started = "in-place", seen
            self.current.phases = Phases(started)
            self.current.phases.mark("restart")  # the record, the old query's tasks, the backoff

    def _begin_run(self, kind: str, started: float) -> None:
        """A new run: its number, its record (for its data sources), its history entry."""
        assert self.jobdir is not None and self.record is not None
        with self.jobdir.update(self.fence) as current:
            current.run += 1
            current.status = JobStatus.RECOVERING
            current.driver = {
                "pid": os.getpid(),
                "epoch": self.epoch,
                "token": os.environ.get(processes.RUN_TOKEN_ENV),
            }
            standby = None
            if current.supervisor.get("standby_pid") == os.getpid():  # promoted: no standby
                standby = standby_at_promotion(current.supervisor, started)
                current.supervisor = {
                    k: v for k, v in current.supervisor.items() if not k.startswith("standby_")
                }
            previous = current.runs[-1] if current.runs else None
            current.add_run(
                {
                    "run": current.run,
                    "epoch": self.epoch,
                    "kind": kind,
                    "started": started,
                    "failed_at": (previous or {}).get("ended"),
                    "driver_pid": os.getpid(),
                    **({"standby": standby} if standby else {}),
                }
            )
            run, incarnation = current.run, current.incarnation
        config = self.config
        write_run_record(
            os.environ[RUN_DIR_ENV],
            os.environ[processes.RUN_TOKEN_ENV],
            {
                "job": self.record.name,
                "job_dir": self.jobdir.path,
                "guarantee": config.guarantee.label,
                "allow_downgrade": config.allow_downgrade,
                "faults": config.faults,
                "epoch": self.epoch,
                "run": run,
                "incarnation": incarnation,
            },
        )
        with self.current.lock:
            self.current.run, self.current.kind, self.current.started = run, kind, started
            self.current.first_batch_seen = False
            self.current.query_run_id = None
        emit({"type": "run", "run": run, "kind": kind, "epoch": self.epoch})

    def _start_query(self, build: Any) -> Any:
        assert self.record is not None
        from epochal.spark.foreach_batch import writers_made

        made_before, _ = writers_made()
        writer = build(self.spark)
        made, last_writer = writers_made()
        if not hasattr(writer, "start"):
            raise TypeError(
                f"{self.record.target} returned {type(writer).__name__}; it must return "
                "df.writeStream... (a DataStreamWriter, not started)"
            )
        writer = writer.option("checkpointLocation", checkpoint_location(self.state)).queryName(
            self.record.name
        )
        if self.config.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(
                processingTime=f"{int(self.config.snapshot_interval * 1000)} milliseconds"
            )
        epochal_writer = last_writer if made - made_before == 1 else None
        self._judge_sparks_parts(writer, epochal_writer)
        self.runners = SourceRunnerWatch(jvm_pid(self.spark))
        query = writer.start()
        with self.current.lock:
            self.current.query_run_id = str(query.runId)
        return query

    def _judge_sparks_parts(self, writer: Any, epochal_writer: Any = None) -> None:
        """Read the whole query before it starts (:mod:`epochal.parts.spark_plan`) and judge
        every part that is not epochal's (Spark's sources and sinks, ``foreachBatch``, other
        Python data sources) against the job's guarantee: a part that gives less refuses the
        job with a ``GuaranteeError`` (fatal: the job fails, no restart), unless the job
        allows the downgrade. Each such part is recorded in the run's store (``jobs status``
        and the metrics show it) and the job's effective guarantee in its record: the weakest
        of these parts and the job's (epochal's own parts refuse or lower themselves, and
        record what they run with, when Spark plans them). A writer whose plan cannot be read
        here (a Spark Connect writer) is said so in the run's log and started unjudged.
        ``epochal_writer``: the epochal ``foreachBatch`` writer the job's pipeline made
        (:func:`~epochal.spark.foreach_batch.writers_made`): the query's ``foreachBatch``
        sink is that epochal sink, which judges itself at its first batch."""
        assert self.jobdir is not None
        config = self.config
        sink = None
        if epochal_writer is not None:
            sink = (epochal_writer.connector, epochal_writer.options)
        try:
            plan = read_query(writer, sink)
        except UnreadablePlanError as exc:
            sys.stderr.write(f"epochal driver: Spark's own parts are not checked: {exc}\n")
            return
        verdict = judge(plan.parts, config.guarantee, allow_downgrade=config.allow_downgrade)
        store = SnapshotStore(f"{self.state}/store", anchor=self.state)
        for record in part_records(verdict):
            record.write(store)
        with self.jobdir.update(self.fence) as current:
            current.effective_guarantee = verdict.effective.label

    def _healthy(self) -> bool:
        """Whether the JVM and the SparkContext survived (an in-place restart is possible)."""
        return session_alive(self.spark)

    def _restart_in_place(self, text: str, ended: float) -> bool:
        """Count the restart, back off, wait for the old query's tasks; False when the
        job's restart limit is reached (the failure is recorded). ``ended``: when the failed
        query was seen to end."""
        summary = summary_of(text)
        assert self.jobdir is not None
        with self.jobdir.update(self.fence) as current:
            self._end_run(current, summary, ended)
            decision = restart.decide(self.config, current.restarts_in_a_row, summary)
            if not decision.restart:
                current.failure = decision.give_up
                return False
            current.restarts += 1
            current.restarts_in_a_row += 1
            current.status = JobStatus.RESTARTING
            current.failure = summary
        backoff = decision.backoff
        sys.stderr.write(
            f"epochal driver: run failed ({summary}); restarting in place in {backoff:.1f}s\n"
        )
        wait_for_idle(self.spark, 30.0)
        time.sleep(backoff)
        return True

    def _end_run(self, current: JobRecord, outcome: str, ended: float | None = None) -> None:
        entry = current.run_entry(self.current.run)
        if entry is not None:
            entry["ended"] = ended or time.time()
            entry["outcome"] = outcome[:300]

    def _fail(self, text: str) -> int:
        kind = identify(text)
        summary = summary_of(text)
        if kind is FENCED:
            sys.stderr.write(f"epochal: this run was fenced: {summary}\n")
            return EXIT_FENCED
        if self.jobdir is not None and self.record is not None:
            with contextlib.suppress(FencedError), self.jobdir.update(self.fence) as current:
                current.failure = summary
                self._end_run(current, summary)
        sys.stderr.write(
            f"epochal: run failed ({kind.failure.value}: {kind.name}): {secrets.mask(text)}\n"
        )
        return EXIT_RESTARTABLE if kind.failure is Failure.RESTARTABLE else EXIT_FATAL


def standby_at_promotion(supervisor: dict[str, Any], promoted: float) -> dict[str, Any]:
    """What a promoted standby was when its job took it (from the supervisor's part of the
    job record): ready or still warming, how long it had been up, how long its warm-up took."""
    launched = supervisor.get("standby_launched")
    out: dict[str, Any] = {"ready": bool(supervisor.get("standby_ready"))}
    if launched:
        out["up_s"] = round(promoted - float(launched), 1)
    if supervisor.get("standby_warmup_s") is not None:
        out["warmup_s"] = supervisor["standby_warmup_s"]
    return out
