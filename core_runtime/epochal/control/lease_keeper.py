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
  cannot renew it for half its TTL, marks the driver's session record lost and has the
  driver's query fence (:mod:`epochal.spark.query_fence`) stop the job's query; only when
  the query did not stop within a quarter TTL, or no fence watches the record, it kills the
  driver's JVM (a driver never acts beyond its lease). When the JVM ends, the keeper releases
  the lease, so the driver's successor takes over at once, from any host. A keeper that died
  is started again by the query fence (``--resume``): it goes on with the dead keeper's
  owner and epoch.

A planner starts the keeper and reads what it holds through
:func:`epochal.state.lease.session.hold`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import asdict
from typing import Any

from epochal.base import files, processes
from epochal.config import JobConfig
from epochal.state.lease.record import LEASE_TTL, SESSION, new_owner
from epochal.state.lease.session import (
    KEEPER_MODULE,
    LOST,
    STOPPED,
    WATCHER,
    DriverJvm,
    Holding,
    begin_run,
    query_stop_bound,
    read_record,
    update_record,
    write_record,
)
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
        from epochal.state.jobs import JobRecord

        if not self.jobdir.exists():
            config = JobConfig(
                guarantee=self.guarantee,
                snapshot_dir=self.jobdir.snapshot_dir,
                lease_ttl=self.ttl,
            )
            self.jobdir.fence(self.epoch).check("creating the job record")
            self.jobdir.save(JobRecord.create(self.jobdir.name, "", config.to_dict()))
        self.run = begin_run(self.jobdir, self.epoch, self.driver, keeper=os.getpid())
        incarnation = self.jobdir.load().incarnation
        holding = Holding(
            self.epoch,
            self.run,
            self.owner,
            os.getpid(),
            self.driver.pid,
            self.driver.started,
            incarnation,
        )
        write_record(self.record, {**asdict(holding), **self.arguments()})
        self.say(f"holding the lease at epoch {self.epoch}, run {self.run}")

    def arguments(self) -> dict[str, Any]:
        """What a keeper started again for this holding needs (:func:`~epochal.state.lease.
        session.restart_keeper`), kept in the session record."""
        return {
            "snapshot_dir": self.jobdir.snapshot_dir,
            "job": self.jobdir.name,
            "guarantee": self.guarantee.label,
            "ttl": self.ttl,
        }

    def resume(self) -> int:
        """Go on holding what a keeper of this driver that died held (its session record:
        owner, epoch, run): renew at once, then keep the lease as that keeper would have. A
        lease that another holder took meanwhile is lost."""
        found = read_record(self.record) or {}
        if "epoch" not in found or found.get(LOST):
            return 2
        self.owner, self.epoch, self.run = (
            str(found["owner"]),
            int(found["epoch"]),
            int(found["run"]),
        )
        self.say(f"started again for the holding at epoch {self.epoch}, run {self.run}")
        return self.keep(renew_now=True)

    def keep(self, renew_now: bool = False) -> int:
        """Renew until the driver ends (release) or the lease is lost (stop the driver)."""
        from epochal.state.locks import JobError
        from epochal_sdk import SnapshotError

        last_renewed = time.monotonic()
        next_renewal = last_renewed + (0 if renew_now else self.ttl / 4)
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
        """The driver may no longer act for the job: say so in the session record (every
        planner of the job in the driver is refused from here), and have the driver's query
        fence stop the job's query (:mod:`epochal.spark.query_fence`), so that the driver's
        other queries go on. Only when no fence watches the record, or the query did not
        stop within :func:`~epochal.state.lease.session.query_stop_bound`, the driver's JVM
        is killed (and with it every query it runs): the last resort."""
        lost = f"job {self.jobdir.name!r}: {why}; this driver stopped the job's query"
        record = update_record(self.record, **{LOST: lost})
        if record is None:  # lost before the run began: the planner waiting for it fails
            write_record(self.record, {LOST: lost})
            self.say(f"{why}: no query of the job started in this driver")
            return 3
        watcher = int(record.get(WATCHER) or 0)
        if watcher and processes.alive(watcher) and self.driver.alive:
            bound = query_stop_bound(self.ttl)
            self.say(f"{why}: the driver's query fence stops the job's query (up to {bound:.1f}s)")
            started = time.monotonic()
            while time.monotonic() - started < bound:
                found = read_record(self.record) or {}
                if found.get(STOPPED) or int(found.get("keeper") or 0) != os.getpid():
                    took = time.monotonic() - started
                    self.say(f"the job's query stopped in {took:.2f}s; the driver goes on")
                    return 3
                if not self.driver.alive:
                    return 3
                time.sleep(POLL_SECONDS / 4)
            why = f"{why}, and the job's query did not stop within {bound:.1f}s"
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
        current_run = int((read_record(self.record) or {}).get("run") or self.run)
        with contextlib.suppress(JobError, FencedError, OSError), self.jobdir.update(fence) as run:
            entry = run.run_entry(current_run)
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
    parser.add_argument("--resume", action="store_true", help="go on with a dead keeper's holding")
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
    if args.resume:
        return keeper.resume()
    if not keeper.take():
        return 2
    try:
        keeper.start_run()
    except FencedError as exc:
        return keeper.stop_driver(str(exc))
    return keeper.keep()


if __name__ == "__main__":
    sys.exit(main())
