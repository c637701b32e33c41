"""The job supervisor: runs a job's driver as a child process, restarts it after restartable
failures from the last snapshot, with backoff and a limit, and keeps a warm standby driver
when asked to.

One supervisor owns a job at a time: it holds the job's lease, renews it while its driver is
healthy (the driver's heartbeats arrive on its stdout), and gives every driver it starts a
new lease epoch, so whatever an earlier driver left behind is fenced
(:mod:`epochal.state.lease.fence`). Before a new driver starts, every process of the previous one
(its JVM and PySpark daemons included) is gone. A supervisor that loses its lease (it was paused
past its TTL and another one took over) kills its drivers and stops without touching the job's
record.

Locally the supervisor outlives the driver, so a killed driver is restarted. If the
supervisor itself dies, its driver dies with it, and ``python -m epochal jobs resume NAME``
(or :meth:`epochal.Job.resume`) picks the job up from any process that sees the snapshot
directory: at once when the old supervisor is known dead (same host), else once its lease
expired.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from epochal.base import files, processes
from epochal.config import JobConfig
from epochal.control import restart
from epochal.control.launcher import DriverPool, DriverProcess, RunOutcome, default_pool, poolable
from epochal.control.messages import EXIT_DONE, EXIT_FENCED, EXIT_RESTARTABLE
from epochal.control.renewal import LeaseRenewal
from epochal.startup.session import SessionProfile
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.lease.record import new_owner
from epochal.state.lease.swaps import LeaseHeldError, LeaseLostError
from epochal.state.locks import JobError
from epochal.state.manifests import verify_job
from epochal_sdk import SnapshotError
from epochal_sdk.errors import FencedError

Reporter = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


class Supervisor(LeaseRenewal):
    """Runs one job until it completes, fails, is cancelled or suspended, or until another
    supervisor takes it over.

    Args:
        jobdir: the job.
        report: where status lines go.
        force: take the lease even while another supervisor's lease is live (an operator
            who knows that supervisor is dead).
        on_progress: called with each progress event of the active driver.
        wait_for_lease: seconds to wait for another supervisor's lease to expire before
            giving up (None: its time-to-live and a little more).
        pool: warm drivers to take a driver from instead of starting one cold (tests and
            hosts that run many jobs of the same profile).
        metrics_port: serve the job's metrics (Prometheus text) at
            ``http://<metrics_host>:<port>/metrics`` while supervising (0: a free port;
            None: no endpoint). The port is bound here, before anything of the job is
            written: a busy port is a ``ConfigError`` at once. See :mod:`epochal.metrics`.
        metrics_host: the address the metrics endpoint listens on.
        metrics_endpoint: a server already bound (:func:`epochal.metrics.endpoint.listen`)
            instead of ``metrics_port`` (the CLI binds it before it writes the job's record).
    """

    def __init__(
        self,
        jobdir: JobDirectory,
        *,
        report: Reporter = _print,
        force: bool = False,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        wait_for_lease: float | None = None,
        pool: DriverPool | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        metrics_endpoint: Any = None,
    ) -> None:
        self.jobdir = jobdir
        self.metrics_port, self.metrics_host = metrics_port, metrics_host
        self.metrics_url: str | None = None
        if metrics_endpoint is None and metrics_port is not None:
            from epochal.metrics.endpoint import listen

            metrics_endpoint = listen(metrics_port, metrics_host)
        self.metrics_endpoint = metrics_endpoint
        self.pool = pool if pool is not None else default_pool()
        self.report = report
        self.force = force
        self.owner = new_owner()
        self.on_progress = on_progress
        self.wait_for_lease = wait_for_lease
        self.epoch = 0
        self.active: DriverProcess | None = None
        self.standby: DriverProcess | None = None
        self.lost = threading.Event()
        self.unrenewable: str | None = None
        """Why the lease can no longer be renewed (a corrupt lease record, a failing write),
        once the renewal gave up: the drivers were stopped and the job ends FAILED."""
        self._renewed_at = time.monotonic()
        self._stop_renewal = threading.Event()
        self._lease_lock = threading.RLock()
        self._launched = 0
        self.config = JobConfig()
        self.profile = SessionProfile(self.config.master)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> JobRecord:
        """Supervise the job to its end; returns the final record."""
        try:
            return self._run()
        finally:
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.server_close()

    def _run(self) -> JobRecord:
        record = self.jobdir.load()
        if not record.target:
            raise JobError(
                f"job {record.name!r} was started by a query in a driver's own SparkSession "
                "(not by `epochal run`), so there is no pipeline function to run here: start "
                "that application again (its restarter does), and it takes the job over"
            )
        self.config = record.job_config
        self.profile = SessionProfile.of(record)
        processes.sweep_scratch()  # what the drivers of a killed supervisor left
        if self.pool is not None:
            self.pool.prepare(self.profile)
        try:
            self.epoch = self._acquire()
        except BaseException:
            if self.standby is not None:
                self.standby.kill()
            raise
        with self.jobdir.update(self._fence()) as current:
            current.supervisor = {"pid": os.getpid(), "host": socket.gethostname()}
        self._renewed_at = time.monotonic()
        renewal = threading.Thread(target=self._renew, name="epochal-lease", daemon=True)
        renewal.start()
        endpoint = self._serve_metrics()
        try:
            if self.unrenewable is not None:
                return self._failed_renewal()
            return self._loop()
        except (LeaseLostError, FencedError):
            if self.unrenewable is not None:
                return self._failed_renewal()
            return self._lost()
        except (SnapshotError, OSError) as exc:  # the lease or the record cannot be used
            self._give_up_renewal(f"the job's lease or record could not be read or written: {exc}")
            return self._failed_renewal()
        finally:
            if endpoint is not None:
                endpoint.shutdown()
            self._stop_renewal.set()
            for driver in (self.active, self.standby):
                if driver is not None:
                    driver.kill()
            if not self.lost.is_set() and self.unrenewable is None:
                self.jobdir.lease.release(self.owner)

    def _serve_metrics(self) -> Any:
        """Start the metrics endpoint, if asked for (bound when this supervisor was made)."""
        if self.metrics_endpoint is None:
            return None
        from epochal.metrics.endpoint import serve

        server = serve(self.jobdir, self.metrics_endpoint)
        host, port = server.server_address[:2]
        self.metrics_url = f"http://{host!s}:{port}/metrics"
        self.report(f"[{self.jobdir.name}] metrics (Prometheus text): {self.metrics_url}")
        return server

    def _acquire(self) -> int:
        deadline = None
        while True:
            try:
                return self.jobdir.lease.acquire(
                    self.owner, ttl=self.config.lease_ttl, force=self.force
                )
            except LeaseHeldError as held:
                if deadline is None:
                    self._warm_while_waiting()
                    limit = self.wait_for_lease
                    deadline = time.monotonic() + (held.wait + 5 if limit is None else limit)
                    self.report(
                        f"[{self.jobdir.name}] waiting up to {held.wait:.0f}s for the lease of "
                        "the job's previous supervisor to expire"
                    )
                if time.monotonic() > deadline:
                    raise
                time.sleep(min(0.5, held.wait))

    def _warm_while_waiting(self) -> None:
        """While the previous supervisor's lease runs out, start this job's driver warm (JVM,
        SparkSession, connectors, a warm-up query): it only gets the job once the lease is
        taken at a new epoch, and a take-over then costs the lease's wait, not the wait plus
        a cold start. Local masters only (on a cluster a waiting driver would hold executors
        while the old run may still have them)."""
        if self.standby is None and self.pool is None and poolable(self.profile):
            self.standby = self._new_driver(job=None)

    def _fence(self) -> Any:
        return self.jobdir.fence(self.epoch)

    def _loop(self) -> JobRecord:
        first = True
        while True:
            record = self.jobdir.load()
            config = record.job_config
            if record.requested == "cancel":
                return self._cancelled()
            if record.run > 0:
                problems = verify_job(self.jobdir)
                if problems:
                    return self._finish(
                        JobStatus.FAILED,
                        f"refusing to restart job {record.name!r}: its snapshot is missing or "
                        f"corrupt: {'; '.join(problems)}. Restore the files, or cancel the job "
                        "to start over.",
                    )
            if not first:
                with self._lease_lock:
                    self.epoch = self.jobdir.lease.advance(
                        self.owner, self.epoch, ttl=config.lease_ttl
                    )
            first = False
            with self.jobdir.update(self._fence()) as current:
                current.status = JobStatus.STARTING if current.run == 0 else JobStatus.RESTARTING
                current.requested = None if current.requested == "suspend" else current.requested
            driver = self._activate(config)
            self.report(
                f"[{record.name}] run {record.run + 1}: driver pid {driver.pid} at lease epoch "
                f"{self.epoch}" + (" (a warm driver, promoted)" if driver.ready.is_set() else "")
            )
            outcome = self._wait(driver, config)
            self._ended(driver, outcome)
            if self.unrenewable is not None:
                return self._failed_renewal()
            if self.lost.is_set():
                raise LeaseLostError(f"job {record.name!r} was taken over")
            record = self.jobdir.load()
            if record.requested == "cancel":
                return self._cancelled()
            if record.requested == "suspend":
                return self._suspended()
            if outcome.code == EXIT_DONE and not outcome.killed:
                return self._finish(JobStatus.COMPLETED, None)
            restartable = outcome.killed or outcome.code in (EXIT_RESTARTABLE, EXIT_FENCED)
            why = (
                f"driver killed by signal {outcome.signal}"
                if outcome.killed
                else (record.failure or f"driver exited with {outcome.code}")
            )
            if not restartable:
                return self._finish(JobStatus.FAILED, why)
            decision = restart.decide(
                config,
                record.restarts_in_a_row,
                why,
                warm_driver=self.standby is not None and self.standby.ready.is_set(),
            )
            if not decision.restart:
                return self._finish(JobStatus.FAILED, decision.give_up)
            backoff = decision.backoff
            with self.jobdir.update(self._fence()) as current:
                current.restarts += 1
                current.restarts_in_a_row += 1
                current.status = JobStatus.RESTARTING
                current.failure = why
            self.report(
                f"[{record.name}] run {record.run} failed ({why}); restarting from the last "
                f"snapshot in {backoff:.1f}s (restart {record.restarts + 1})"
            )
            time.sleep(backoff)

    def _activate(self, config: JobConfig) -> DriverProcess:
        """The next active driver: the standby (even while it warms: it is ahead of a cold
        driver, and a cold one would only compete with it), else one from the pool, else a
        new one."""
        driver = None
        standby, self.standby = self.standby, None
        if standby is not None:
            if standby.alive():  # still warming: promoted now, it cuts its warm-up short
                driver = standby
            else:
                standby.kill()
        if driver is None and self.pool is not None:
            driver = self.pool.take(self.profile)
            if driver is not None:
                driver.on_event = self._on_event
                self._link_log(driver)
        if driver is not None:
            driver.promote(self.epoch, self.jobdir.snapshot_dir, self.jobdir.name)
        else:
            driver = self._new_driver(job=(self.epoch, self.jobdir.snapshot_dir, self.jobdir.name))
        with self._lease_lock:
            self.active = driver
        self._renew_now()
        return driver

    def _new_driver(self, job: tuple[int, str, str] | None) -> DriverProcess:
        self._launched += 1
        suffix = "-standby" if job is None else ""
        return DriverProcess(
            self.profile,
            f"{self.jobdir.logs}/driver-{self._launched}{suffix}.log",
            self.jobdir.run_dir,
            job=job,
            on_event=self._on_event,
            keep_warm=job is None,
        )

    def _link_log(self, driver: DriverProcess) -> None:
        self._launched += 1
        files.makedirs(self.jobdir.logs)
        with contextlib.suppress(OSError):
            os.symlink(driver.log_path, f"{self.jobdir.logs}/driver-{self._launched}-pool.log")

    def _start_standby(self) -> None:
        self.standby = self._new_driver(job=None)
        self._renew_now()
        with contextlib.suppress(Exception), self.jobdir.update(self._fence()) as current:
            current.supervisor = {
                **{k: v for k, v in current.supervisor.items() if not k.startswith("standby_")},
                "standby_pid": self.standby.pid,
                "standby_launched": self.standby.launched,
                "standby_ready": False,
            }

    def _wait(self, driver: DriverProcess, config: JobConfig) -> RunOutcome:
        """Until the active driver ends. A driver that stops answering (no heartbeat for
        half the lease's time-to-live) is killed, as is one whose lease was lost."""
        while True:
            outcome = driver.wait(0.2)
            if outcome is not None:
                return outcome
            if self.lost.is_set() or self.unrenewable is not None:
                driver.kill()
            elif driver.heartbeat_age() > config.lease_ttl / 2:
                self.report(
                    f"[{self.jobdir.name}] driver pid {driver.pid} stopped answering "
                    f"({driver.heartbeat_age():.1f}s without a heartbeat): killing it"
                )
                driver.kill()
            if (
                config.standby
                and self.standby is None
                and driver.progressed.is_set()
                and not self.lost.is_set()
            ):
                self._start_standby()  # warmed while the active driver runs
            if self.standby is not None and not self.standby.alive():
                self.standby.kill()
                self.standby = None

    def _ended(self, driver: DriverProcess, outcome: RunOutcome) -> None:
        """Make sure every process of the driver run is gone; note when the run ended."""
        driver.kill()
        with self._lease_lock:
            self.active = None
        if self.lost.is_set() or self.unrenewable is not None:
            return
        with contextlib.suppress(FencedError), self.jobdir.update(self._fence()) as current:
            entry = current.runs[-1] if current.runs else None
            if entry is not None and not entry.get("ended"):
                entry["ended"] = time.time()
                entry["outcome"] = (
                    f"killed by signal {outcome.signal}"
                    if outcome.killed
                    else f"exit {outcome.code}"
                )
            current.driver = {}

    def _on_event(self, driver: DriverProcess, event: dict[str, Any]) -> None:
        if event.get("type", "progress") == "progress" and driver is self.active:
            if self.on_progress:
                self.on_progress(event)
        elif event.get("type") == "ready" and driver is not self.active:
            with contextlib.suppress(Exception), self.jobdir.update(self._fence()) as current:
                current.supervisor = {
                    **current.supervisor,
                    "standby_pid": driver.pid,
                    "standby_ready": True,
                    "standby_ready_at": time.time(),
                    "standby_warmup_s": event.get("warmup_s"),
                }

    # -- endings ----------------------------------------------------------------------------
    def _cancelled(self) -> JobRecord:
        """The job's driver has ended: settle what the job left in doubt, then delete its
        snapshots. A sink that cannot be settled keeps them (its records and decisions are
        what settling it later needs): the job ends CANCELLED with a failure that lists
        what is left and the command to settle it; a later ``run`` settles it first too."""
        from epochal.parts.settling import settle_before_deleting
        from epochal.state.locks import JobError

        try:
            settle_before_deleting(
                self.jobdir, "cancel the job", False, self.report, retry="cancel it"
            )
        except JobError as exc:
            self.report(f"[{self.jobdir.name}] {exc}")
            return self._finish(JobStatus.CANCELLED, f"snapshots kept: {exc}")
        self.jobdir.delete_snapshots()
        return self._finish(JobStatus.CANCELLED, None)

    def _suspended(self) -> JobRecord:
        """The job's driver has ended on a suspend request and every process of its run is
        gone: settle what the stopped query left in doubt (a batch the stop interrupted may
        have prepared transactions its driver never decided), so that a suspended job holds
        nothing open in its sinks (no staged data, no database locks) while it waits. The
        snapshots stay. A sink that cannot be settled now is reported; the next run's
        recovery settles it before its first batch."""
        from epochal.parts.settling import job_incarnation, settle_sinks

        done, unsettled = settle_sinks(
            self.jobdir.store,
            self.jobdir.name,
            job_incarnation(self.jobdir),
            fence=self._fence().check,
        )
        for _, line in done:
            self.report(f"[{self.jobdir.name}] suspend: settled {line}")
        for sink in unsettled:
            self.report(
                f"[{self.jobdir.name}] suspend: {sink.describe()}; the next run (`jobs resume`) "
                "settles them before its first batch"
            )
        return self._finish(JobStatus.SUSPENDED, None, keep_request=False)

    def _finish(
        self, status: JobStatus, failure: str | None, keep_request: bool = False
    ) -> JobRecord:
        fence = None if status == JobStatus.CANCELLED else self._fence()
        with self.jobdir.update(fence) as current:
            current.status = status
            if failure:
                current.failure = failure
            if not keep_request:
                current.requested = None
            final = current
        tail = f": {failure}" if failure else ""
        self.report(f"[{final.name}] {status.value.lower()}{tail}")
        return final

    def stop_child(self) -> None:
        """Kill the drivers (used when the supervisor itself is interrupted)."""
        for driver in (self.active, self.standby):
            if driver is not None:
                driver.kill()
