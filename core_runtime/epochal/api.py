"""The Python API: submit a job, watch it, join it, cancel, suspend and resume it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from epochal.config import JobConfig
from epochal.control.job_requests import request, submit
from epochal.control.launcher import DriverPool
from epochal.control.supervisor import Supervisor
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.jobs import list_jobs as _list_jobs
from epochal.state.manifests import verify_job


class Job:
    """A handle on a job by name; works from any process that sees the snapshot directory."""

    def __init__(self, name: str, snapshot_dir: str = JobConfig.snapshot_dir) -> None:
        self.jobdir = JobDirectory(snapshot_dir, name)
        self.name = name
        self._thread: threading.Thread | None = None
        self._supervisor: Supervisor | None = None
        self._result: JobRecord | None = None
        self._error: BaseException | None = None

    @classmethod
    def submit(
        cls,
        name: str,
        target: str | Callable[..., Any],
        config: JobConfig | None = None,
        *,
        replace: bool = False,
        force: bool = False,
        report: Callable[[str], None] | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        pool: DriverPool | None = None,
    ) -> Job:
        """Submit the job and start supervising it in a background thread of this process.

        ``target`` is ``"module:function"`` (or such a function): it gets a SparkSession and
        returns ``df.writeStream...`` (not started); it is called again on every restart.
        ``pool`` gives warm drivers to start from (see
        :class:`epochal.control.launcher.DriverPool`). With ``replace`` (or over a cancelled
        job) what the old job left in doubt is settled first, or the submit refused unless
        ``force`` (see :func:`epochal.control.job_requests.submit`).
        """
        config = config or JobConfig()
        submit(name, target, config, replace=replace, force=force, report=report)
        job = cls(name, config.snapshot_dir)
        job._start(report, on_progress, pool)
        return job

    def _start(
        self,
        report: Callable[[str], None] | None,
        on_progress: Any = None,
        pool: DriverPool | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"on_progress": on_progress, "pool": pool}
        if report is not None:
            kwargs["report"] = report
        self._supervisor = Supervisor(self.jobdir, **kwargs)

        def supervise() -> None:
            try:
                self._result = self._supervisor.run()  # type: ignore[union-attr]
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=supervise, name=f"epochal-{self.name}", daemon=True)
        self._thread.start()

    def status(self) -> JobRecord:
        """The job's record (status, run, restarts, progress, failure)."""
        return self.jobdir.load()

    def supervising(self) -> bool:
        """Whether the supervisor started here (by :meth:`submit` or :meth:`resume`) still
        runs the job."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> JobRecord:
        """Wait for the supervisor started here to finish; the final record."""
        if self._thread is None:
            raise RuntimeError(f"job {self.name!r} is not supervised by this process")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.name!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self, force: bool = False) -> JobRecord:
        """Stop the job, settle what it left in doubt and delete its snapshots (refused when
        a sink cannot be settled, unless ``force``: see
        :func:`epochal.control.job_requests.request`)."""
        return request(self.jobdir, "cancel", force=force)

    def suspend(self) -> JobRecord:
        """Stop the job, keeping its snapshots so it can resume."""
        return request(self.jobdir, "suspend")

    def resume(
        self, report: Callable[[str], None] | None = None, pool: DriverPool | None = None
    ) -> Job:
        """Supervise a suspended (or orphaned) job again, from its last snapshot. If another
        supervisor still holds the job's lease, wait for it to expire (or to be released)."""
        self._start(report, pool=pool)
        return self

    def verify(self, full: bool = True) -> list[str]:
        """Problems in the job's snapshot data (empty when sound): every entry is read
        (``full=False``: only what a restart reads, as the supervisor does before one)."""
        return verify_job(self.jobdir, full=full)


def list_jobs(snapshot_dir: str = JobConfig.snapshot_dir) -> list[JobRecord]:
    """Every job in a snapshot directory."""
    return _list_jobs(snapshot_dir)
