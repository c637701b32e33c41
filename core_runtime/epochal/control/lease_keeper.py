"""The job's lease, held by the driver that runs the job's query in its own SparkSession.

Most queries are not started by ``epochal run``: a cluster manager or a platform starts and
restarts their drivers (YARN application attempts, the spark-operator's restart policy,
Databricks and EMR retries, a Spark Connect server kept up by systemd, a restart loop).
There the job fences itself all the same: the first epochal source or sink planned in a
driver takes the job's lease (:mod:`epochal.state.lease.record`) at a new epoch, for that driver's
JVM, and a *lease keeper* process renews it while the JVM lives:

- **taking it**: a live lease of another driver (or supervisor) is waited out, up to its
  TTL; a holder proven dead (same host, its JVM gone) is taken over at once. A holder that
  keeps renewing keeps the job: the new driver's query is refused with a message that names
  the holder. Taking the lease moves the job's state to the new epoch
  (:meth:`~epochal.state.lease.swaps.JobLease.acquire`), so whatever an older driver writes
  through its old paths lands nowhere, and every protocol step of the older driver checks
  the lease's epoch first (:mod:`epochal.state.lease.fence`).
- **the run**: the keeper starts a new run in the job's record (``job.json``: created if
  the job has none) under the new epoch; transaction ids carry that run, and recovery rolls
  back only transactions of earlier runs. Run numbers come from the record, never from a
  clock, so an older driver's run is always below a newer one's.
- **keeping it**: renewed every quarter TTL. A keeper that finds the lease taken over, or
  cannot renew it for half its TTL, kills its driver's JVM (a driver never outlives its
  lease: it stops before anyone may take over). When the JVM ends, the keeper releases the
  lease, so the driver's successor takes over at once, from any host.

A planner starts the keeper and reads what it holds through
:func:`epochal.state.lease.session.hold`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import asdict

from epochal.base import files
from epochal.config import JobConfig
from epochal.state.lease.record import LEASE_TTL, SESSION, new_owner
from epochal.state.lease.session import KEEPER_MODULE, DriverJvm, Holding, write_record
from epochal_sdk import Guarantee
from epochal_sdk.errors import FencedError

POLL_SECONDS = 0.2
"""How often the keeper looks at its driver's JVM."""


class Keeper:
    """Takes the job's lease for one driver JVM, starts its run, renews the lease while the
    JVM lives, stops the JVM when the lease is lost, releases it when the JVM ended."""

    def __init__(
        self,
        snapshot_dir: str,
        name: str,
        driver: DriverJvm,
        guarantee: Guarantee,
        ttl: float,
        record: str,
    ) -> None:
        from epochal.state.jobs import JobDirectory

        self.jobdir = JobDirectory(snapshot_dir, name)
        self.driver, self.guarantee, self.ttl, self.record = driver, guarantee, ttl, record
        self.owner = f"session-{new_owner()}"
        self.epoch = 0
        self.run = 0

    def say(self, message: str) -> None:
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} epochal lease keeper: {message}\n")
        sys.stderr.flush()

    def take(self) -> bool:
        """Take the lease (waiting out a live holder); False when it was not to be had."""
        from epochal.state.lease.swaps import LeaseHeldError
        from epochal.state.locks import JobError

        deadline = None
        while True:
            if not self.driver.alive:
                return False
            try:
                self.epoch = self.jobdir.lease.acquire(
                    self.owner, ttl=self.ttl, holder=SESSION, pid=self.driver.pid
                )
                return True
            except LeaseHeldError as held:
                if deadline is None:
                    deadline = time.monotonic() + held.wait + 2
                    self.say(f"waiting up to {held.wait:.0f}s: {held}")
                if time.monotonic() > deadline:
                    write_record(
                        self.record,
                        {
                            "error": f"job {self.jobdir.name!r} is run by "
                            f"{held.lease.describe() if held.lease else 'another driver'}. "
                            "It keeps the "
                            "job's lease, so this driver may not run the job (two drivers "
                            "of one job would both act). Stop the other driver first; one "
                            "that died without releasing the lease is taken over once its "
                            "lease expired."
                        },
                    )
                    return False
                time.sleep(min(0.5, max(0.05, held.wait)))
            except JobError as exc:  # no lease can be held there at all
                write_record(self.record, {"error": str(exc)})
                return False

    def start_run(self) -> None:
        """A new run of the job under this epoch, in the job's record (made if missing)."""
        from epochal.state.jobs import JobRecord, JobStatus

        fence = self.jobdir.fence(self.epoch)
        driver = {
            "pid": self.driver.pid,
            "host": socket.gethostname(),
            "epoch": self.epoch,
            "holder": SESSION,
            "keeper_pid": os.getpid(),
        }
        if not self.jobdir.exists():
            config = JobConfig(
                guarantee=self.guarantee,
                snapshot_dir=self.jobdir.snapshot_dir,
                lease_ttl=self.ttl,
            )
            fence.check("creating the job record")
            self.jobdir.save(JobRecord.create(self.jobdir.name, "", config.to_dict()))
        with self.jobdir.update(fence) as current:
            current.run += 1
            current.status = JobStatus.RUNNING
            current.driver = driver
            current.add_run(
                {
                    "run": current.run,
                    "epoch": self.epoch,
                    "kind": SESSION,
                    "started": time.time(),
                    "driver_pid": self.driver.pid,
                }
            )
            self.run = current.run
            incarnation = current.incarnation
        holding = Holding(
            self.epoch,
            self.run,
            self.owner,
            os.getpid(),
            self.driver.pid,
            self.driver.started,
            incarnation,
        )
        write_record(self.record, asdict(holding))
        self.say(f"holding the lease at epoch {self.epoch}, run {self.run}")

    def keep(self) -> int:
        """Renew until the driver ends (release) or the lease is lost (stop the driver)."""
        from epochal.state.locks import JobError
        from epochal_sdk import SnapshotError

        last_renewed = time.monotonic()
        next_renewal = last_renewed + self.ttl / 4
        while True:
            if not self.driver.alive:
                self.ended("its driver ended")
                return 0
            now = time.monotonic()
            if now >= next_renewal:
                try:
                    if not self.jobdir.lease.renew(self.owner, self.epoch, ttl=self.ttl):
                        return self.stop_driver("another driver took the job's lease over")
                    last_renewed = now
                except (JobError, SnapshotError, OSError) as exc:
                    self.say(f"the lease was not renewed: {exc}")
                except Exception as exc:  # anything else: said, and counted the same way
                    self.say(f"the lease was not renewed: {type(exc).__name__}: {exc}")
                next_renewal = now + self.ttl / 4
                if now - last_renewed > self.ttl / 2:
                    return self.stop_driver(
                        f"the lease could not be renewed for {now - last_renewed:.1f}s "
                        f"(limit {self.ttl / 2:.1f}s)"
                    )
            time.sleep(POLL_SECONDS)

    def stop_driver(self, why: str) -> int:
        """The driver may no longer act: kill its JVM (and with it every query it runs)."""
        write_record(self.record, {"lost": f"job {self.jobdir.name!r}: {why}; this driver stopped"})
        self.say(f"{why}: killing the driver's JVM (pid {self.driver.pid})")
        if self.driver.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.driver.pid, signal.SIGKILL)
        return 3

    def ended(self, why: str) -> None:
        """The driver ended: give the lease up (its successor takes over at once), note how
        the run ended, forget the driver's record."""
        from epochal.state.locks import JobError

        fence = self.jobdir.fence(self.epoch)
        with contextlib.suppress(JobError, FencedError, OSError), self.jobdir.update(fence) as run:
            entry = run.run_entry(self.run)
            if entry is not None:
                entry["ended"] = time.time()
                entry["outcome"] = why
        with contextlib.suppress(JobError, OSError):
            self.jobdir.lease.release(self.owner)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.record)
        self.say(f"{why}: lease released")


def main(argv: list[str] | None = None) -> int:
    """``python -m epochal.control.lease_keeper SNAPSHOT_DIR JOB --driver PID ...`` (started by
    :func:`hold`)."""
    parser = argparse.ArgumentParser(prog=f"python -m {KEEPER_MODULE}")
    parser.add_argument("snapshot_dir")
    parser.add_argument("job")
    parser.add_argument("--driver", type=int, required=True)
    parser.add_argument("--driver-started", type=int, required=True)
    parser.add_argument("--guarantee", default="exactly-once")
    parser.add_argument("--ttl", type=float, default=LEASE_TTL)
    parser.add_argument("--record", required=True)
    args = parser.parse_args(argv)
    files.private_process()
    keeper = Keeper(
        args.snapshot_dir,
        args.job,
        DriverJvm(args.driver, args.driver_started),
        Guarantee.parse(args.guarantee),
        args.ttl,
        args.record,
    )
    if not keeper.take():
        return 2
    try:
        keeper.start_run()
    except FencedError as exc:
        return keeper.stop_driver(str(exc))
    return keeper.keep()


if __name__ == "__main__":
    sys.exit(main())
