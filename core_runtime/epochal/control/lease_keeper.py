"""The job's lease, held by the driver that runs the job's query in its own SparkSession.

Most queries are not started by ``epochal run``: a cluster manager or a platform starts and
restarts their drivers (YARN application attempts, the spark-operator's restart policy,
Databricks and EMR retries, a Spark Connect server kept up by systemd, a restart loop).
There the job fences itself all the same: the first epochal source or sink planned in a
driver takes the job's lease (:mod:`epochal.state.lease`) at a new epoch, for that driver's JVM,
and a *lease keeper* process renews it while the JVM lives:

- **taking it**: a live lease of another driver (or supervisor) is waited out, up to its
  TTL; a holder proven dead (same host, its JVM gone) is taken over at once. A holder that
  keeps renewing keeps the job: the new driver's query is refused with a message that names
  the holder. Taking the lease moves the job's state to the new epoch
  (:meth:`~epochal.state.jobs.JobDirectory.acquire_lease`), so whatever an older driver writes
  through its old paths lands nowhere, and every protocol step of the older driver checks
  the lease's epoch first (:mod:`epochal.state.fence`).
- **the run**: the keeper starts a new run in the job's record (``job.json``: created if
  the job has none) under the new epoch; transaction ids carry that run, and recovery rolls
  back only transactions of earlier runs. Run numbers come from the record, never from a
  clock, so an older driver's run is always below a newer one's.
- **keeping it**: renewed every quarter TTL. A keeper that finds the lease taken over, or
  cannot renew it for half its TTL, kills its driver's JVM (a driver never outlives its
  lease: it stops before anyone may take over). When the JVM ends, the keeper releases the
  lease, so the driver's successor takes over at once, from any host.

The planner workers of the driver read what the keeper holds from a small record on the
driver's machine (:attr:`~epochal.state.layout.JobLayout.sessions`), one per driver JVM.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from epochal.config import JobConfig
from epochal.control import processes
from epochal.state import files
from epochal.state.layout import JobLayout
from epochal.state.lease import LEASE_TTL, SESSION, new_owner
from epochal_sdk import EpochalError, Guarantee
from epochal_sdk.errors import FencedError

KEEPER_MODULE = "epochal.control.lease_keeper"
START_GRACE_SECONDS = 30.0
"""How long a planner waits, beyond the lease's TTL, for its keeper to take the lease."""
POLL_SECONDS = 0.2
"""How often the keeper looks at its driver's JVM."""


class LeaseNotHeldError(EpochalError):
    """This driver could not take (or lost) its job's lease: another driver runs the job."""


@dataclass(frozen=True)
class Holding:
    """What a driver's keeper holds: the lease epoch and the run it started under it."""

    epoch: int
    run: int
    owner: str
    keeper: int
    driver: int
    driver_started: int


@dataclass(frozen=True)
class DriverProcess:
    """The driver JVM a process belongs to (a Spark Python worker's nearest Java ancestor;
    a process under no JVM stands for itself), named for good by pid and start time."""

    pid: int
    started: int

    @classmethod
    def current(cls) -> DriverProcess:
        pid = processes.java_ancestor() or os.getpid()
        return cls(pid, processes.start_ticks(pid) or 0)

    @property
    def alive(self) -> bool:
        """Whether this very process still runs (not another that reuses its pid)."""
        return processes.alive(self.pid) and processes.start_ticks(self.pid) == self.started

    @property
    def key(self) -> str:
        return f"{socket.gethostname()}-{self.pid}-{self.started}"


def lease_ttl(options: dict[str, str]) -> float:
    """The TTL a session driver's lease gets: the ``epochal.leaseTtl`` option (seconds),
    else ``EPOCHAL_LEASE_TTL``, else :data:`~epochal.state.lease.LEASE_TTL`."""
    from epochal.config import parse_duration

    text = options.get("epochal.leasettl") or os.environ.get("EPOCHAL_LEASE_TTL")
    ttl = parse_duration(text, "epochal.leaseTtl") if text else LEASE_TTL
    if ttl < 2:
        from epochal_sdk import ConfigError

        raise ConfigError(
            "job",
            "epochal.leaseTtl",
            f"{ttl}s is too short to renew a lease in",
            "Give 2s or more.",
        )
    return ttl


def hold(
    layout: JobLayout, guarantee: Guarantee, ttl: float, driver: DriverProcess | None = None
) -> Holding:
    """The job's lease as this process's driver (``driver``: default, the JVM this process
    runs under) holds it: read from the driver's record, or taken now by a new keeper
    (waiting out a live holder's TTL). Raises :class:`LeaseNotHeldError` when another driver
    keeps the job."""
    driver = driver or DriverProcess.current()
    files.makedirs(layout.sessions)
    path = os.path.join(layout.sessions, f"{driver.key}.json")
    with _locked(path + ".lock"):
        found = _read(path)
        if found is not None and "epoch" in found and processes.alive(int(found["keeper"])):
            return _holding(found)
        if found is not None and found.get("lost"):
            raise LeaseNotHeldError(str(found["lost"]))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        keeper = _start_keeper(layout, driver, guarantee, ttl, path)
        deadline = time.monotonic() + ttl + START_GRACE_SECONDS
        while time.monotonic() < deadline:
            found = _read(path)
            if found is not None:
                if "epoch" in found:
                    return _holding(found)
                raise LeaseNotHeldError(str(found.get("error") or found.get("lost")))
            if keeper.poll() is not None:
                raise LeaseNotHeldError(
                    f"job {layout.name!r}: the lease keeper ended ({keeper.returncode}) "
                    f"without taking the lease; see {layout.logs}/session-{driver.pid}.log"
                )
            time.sleep(0.05)
        keeper.kill()
        raise LeaseNotHeldError(
            f"job {layout.name!r}: the job's lease was not taken within {ttl:.0f}s + "
            f"{START_GRACE_SECONDS:.0f}s; see {layout.logs}/session-{driver.pid}.log"
        )


def _holding(found: dict[str, Any]) -> Holding:
    known = set(Holding.__dataclass_fields__)
    return Holding(**{k: v for k, v in found.items() if k in known})


def _start_keeper(
    layout: JobLayout, driver: DriverProcess, guarantee: Guarantee, ttl: float, path: str
) -> subprocess.Popen[bytes]:
    files.makedirs(layout.logs)
    log = files.open_private(os.path.join(layout.logs, f"session-{driver.pid}.log"), "ab")
    argv = [
        sys.executable,
        "-m",
        KEEPER_MODULE,
        layout.snapshot_dir,
        layout.name,
        "--driver",
        str(driver.pid),
        "--driver-started",
        str(driver.started),
        "--guarantee",
        guarantee.label,
        "--ttl",
        str(ttl),
        "--record",
        path,
    ]
    with log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


@contextlib.contextmanager
def _locked(path: str) -> Any:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, files.FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return dict(json.load(fh))
    except (FileNotFoundError, ValueError):
        return None


def _write(path: str, value: dict[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with os.fdopen(files.create(tmp), "w") as out:
        json.dump(value, out)
    os.replace(tmp, path)


# -- the keeper ----------------------------------------------------------------------------
class Keeper:
    """Takes the job's lease for one driver JVM, starts its run, renews the lease while the
    JVM lives, stops the JVM when the lease is lost, releases it when the JVM ended."""

    def __init__(
        self,
        snapshot_dir: str,
        name: str,
        driver: DriverProcess,
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
        from epochal.state.jobs import JobError, LeaseHeldError

        deadline = None
        while True:
            if not self.driver.alive:
                return False
            try:
                self.epoch = self.jobdir.acquire_lease(
                    self.owner, ttl=self.ttl, holder=SESSION, pid=self.driver.pid
                )
                return True
            except LeaseHeldError as held:
                if deadline is None:
                    deadline = time.monotonic() + held.wait + 2
                    self.say(f"waiting up to {held.wait:.0f}s: {held}")
                if time.monotonic() > deadline:
                    _write(
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
                _write(self.record, {"error": str(exc)})
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
            self.jobdir.save(JobRecord(name=self.jobdir.name, target="", config=config.to_dict()))
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
        holding = Holding(
            self.epoch, self.run, self.owner, os.getpid(), self.driver.pid, self.driver.started
        )
        _write(self.record, asdict(holding))
        self.say(f"holding the lease at epoch {self.epoch}, run {self.run}")

    def keep(self) -> int:
        """Renew until the driver ends (release) or the lease is lost (stop the driver)."""
        from epochal.state.jobs import JobError
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
                    if not self.jobdir.renew_lease(self.owner, self.epoch, ttl=self.ttl):
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
        _write(self.record, {"lost": f"job {self.jobdir.name!r}: {why}; this driver stopped"})
        self.say(f"{why}: killing the driver's JVM (pid {self.driver.pid})")
        if self.driver.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.driver.pid, signal.SIGKILL)
        return 3

    def ended(self, why: str) -> None:
        """The driver ended: give the lease up (its successor takes over at once), note how
        the run ended, forget the driver's record."""
        from epochal.state.jobs import JobError

        fence = self.jobdir.fence(self.epoch)
        with contextlib.suppress(JobError, FencedError, OSError), self.jobdir.update(fence) as run:
            entry = run.run_entry(self.run)
            if entry is not None:
                entry["ended"] = time.time()
                entry["outcome"] = why
        with contextlib.suppress(JobError, OSError):
            self.jobdir.release_lease(self.owner)
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
        DriverProcess(args.driver, args.driver_started),
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
