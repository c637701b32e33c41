"""The job supervisor: runs a job's driver as a child process and restarts it after
restartable failures, from the last snapshot, with backoff and a limit.

Locally the supervisor outlives the driver, so a killed driver is restarted. On a cluster the
cluster manager restarts the driver (standalone ``--supervise``, a Kubernetes restart policy)
and ``epochal resume NAME`` (or :func:`resume`) picks the job up by name from its record.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epochal.config import JobConfig
from epochal.failures import EXIT_DONE, EXIT_RESTARTABLE
from epochal.jobs import (
    PROGRESS_PREFIX,
    JobDirectory,
    JobError,
    JobRecord,
    JobStatus,
    new_owner,
)
from epochal.verify import verify_job

Reporter = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass
class RunOutcome:
    """How one driver run ended."""

    code: int
    signal: int | None

    @property
    def killed(self) -> bool:
        return self.signal is not None


def _target_name(target: str | Callable[..., Any]) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise JobError(
            f"{target!r} cannot be imported by the driver process: pass 'module:function' "
            "for a function defined at the top level of an importable module"
        )
    return f"{module}:{qualname}"


def submit(
    name: str,
    target: str | Callable[..., Any],
    config: JobConfig | None = None,
    *,
    replace: bool = False,
) -> JobDirectory:
    """Create (or, with ``replace``, re-create) the record of a job without running it."""
    config = config or JobConfig()
    jobdir = JobDirectory(config.snapshot_dir, name)
    target_name = _target_name(target)
    if jobdir.exists():
        existing = jobdir.load()
        if replace or existing.status == JobStatus.CANCELLED:
            jobdir.delete_snapshots()
        elif existing.target != target_name or existing.config != config.to_dict():
            raise JobError(
                f"job {name!r} already exists with another target or config; resume it with "
                "`epochal resume`, cancel it first, or submit under another name"
            )
        else:
            return jobdir
    record = JobRecord(
        name=name,
        target=target_name,
        config=config.to_dict(),
        python_path=[os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)][:20]],
    )
    jobdir.save(record)
    return jobdir


class Supervisor:
    """Runs one job until it completes, fails, is cancelled or suspended."""

    def __init__(
        self,
        jobdir: JobDirectory,
        *,
        report: Reporter = _print,
        force: bool = False,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.jobdir = jobdir
        self.report = report
        self.force = force
        self.owner = new_owner()
        self.on_progress = on_progress
        self.child: subprocess.Popen[str] | None = None
        self._stop_renewal = threading.Event()

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> JobRecord:
        """Supervise the job to its end; returns the final record."""
        epoch = self.jobdir.acquire_lease(self.owner, force=self.force)
        renewal = threading.Thread(target=self._renew, args=(epoch,), daemon=True)
        renewal.start()
        try:
            return self._loop()
        finally:
            self._stop_renewal.set()
            self.jobdir.release_lease(self.owner)

    def _loop(self) -> JobRecord:
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
                        "to start over from scratch.",
                    )
            with self.jobdir.update() as current:
                current.run += 1
                current.status = JobStatus.STARTING if current.run == 1 else JobStatus.RESTARTING
                current.requested = None if current.requested == "suspend" else current.requested
                run_number = current.run
            self.report(f"[{record.name}] run {run_number}: starting driver")
            outcome = self._run_driver(run_number)
            record = self.jobdir.load()
            if record.requested == "cancel":
                return self._cancelled()
            if record.requested == "suspend":
                return self._finish(JobStatus.SUSPENDED, None, keep_request=False)
            if outcome.code == EXIT_DONE and not outcome.killed:
                return self._finish(JobStatus.COMPLETED, None)
            restartable = outcome.killed or outcome.code == EXIT_RESTARTABLE
            why = (
                f"driver killed by signal {outcome.signal}"
                if outcome.killed
                else (record.failure or f"driver exited with {outcome.code}")
            )
            if not restartable:
                return self._finish(JobStatus.FAILED, why)
            if not config.auto_restart:
                return self._finish(JobStatus.FAILED, f"{why} (automatic restart is off)")
            if record.restarts_in_a_row >= config.max_restarts:
                return self._finish(
                    JobStatus.FAILED,
                    f"{why}; gave up after {record.restarts_in_a_row} restarts in a row without "
                    "progress (max_restarts)",
                )
            backoff = min(
                config.max_restart_backoff, config.restart_backoff * 2**record.restarts_in_a_row
            )
            with self.jobdir.update() as current:
                current.restarts += 1
                current.restarts_in_a_row += 1
                current.status = JobStatus.RESTARTING
                current.failure = why
            self.report(
                f"[{record.name}] run {run_number} failed ({why}); restarting from the last "
                f"snapshot in {backoff:.1f}s (restart {record.restarts + 1})"
            )
            time.sleep(backoff)

    def _run_driver(self, run_number: int) -> RunOutcome:
        os.makedirs(self.jobdir.logs, exist_ok=True)
        log_path = f"{self.jobdir.logs}/driver-{run_number}.log"
        with open(log_path, "w") as log_file:
            self.child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "epochal.driver",
                    self.jobdir.snapshot_dir,
                    self.jobdir.name,
                ],
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            assert self.child.stdout is not None
            for line in self.child.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    if self.on_progress:
                        self.on_progress(json.loads(line[len(PROGRESS_PREFIX) :]))
                else:
                    log_file.write(line)
            code = self.child.wait()
        self._kill_leftovers()
        if code < 0:
            return RunOutcome(code, -code)
        if code == 137:
            return RunOutcome(code, signal.SIGKILL)
        return RunOutcome(code, None)

    def _kill_leftovers(self) -> None:
        """The driver's JVM and workers share its process group: end them all."""
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signal.SIGKILL)

    def _renew(self, epoch: int) -> None:
        while not self._stop_renewal.wait(5.0):
            if not self.jobdir.renew_lease(self.owner, epoch):
                self.report(f"[{self.jobdir.name}] lease lost: another supervisor took the job")
                if self.child is not None:
                    self._kill_leftovers()
                return

    def _cancelled(self) -> JobRecord:
        self.jobdir.delete_snapshots()
        return self._finish(JobStatus.CANCELLED, None)

    def _finish(
        self, status: JobStatus, failure: str | None, keep_request: bool = False
    ) -> JobRecord:
        with self.jobdir.update() as current:
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
        """Kill the current driver (used when the supervisor itself is interrupted)."""
        self._kill_leftovers()


def request(jobdir: JobDirectory, what: str) -> JobRecord:
    """Ask the job to cancel or suspend. If no supervisor runs it, do it here."""
    with jobdir.update() as record:
        if record.status.finished and what != "cancel":
            raise JobError(f"job {record.name!r} is {record.status.value}; nothing to {what}")
        record.requested = what
        live = _lease_live(jobdir)
        if not live:
            if what == "cancel":
                record.status = JobStatus.CANCELLED
            elif what == "suspend":
                record.status = JobStatus.SUSPENDED
            record.requested = None
    if not live and what == "cancel":
        jobdir.delete_snapshots()
    return jobdir.load()


def _lease_live(jobdir: JobDirectory) -> bool:
    from epochal.jobs import LEASE_TTL

    lease = jobdir.lease()
    return bool(lease) and time.time() - float(lease["renewed"]) < LEASE_TTL
