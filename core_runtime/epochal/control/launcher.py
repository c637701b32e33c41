"""Driver processes as a supervisor sees them: started cold for a job, or started warm (a
standby of one job, or a driver of a pool that any job with the same session profile can
take) and promoted when needed.

A warm driver has done everything a driver does before it knows its job: JVM, SparkSession,
connector discovery and registration, and a warm-up query through PySpark's workers. Promoting
it costs the query's start and its first batch only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epochal.base import files, logfiles, processes
from epochal.base.logfiles import RotatingLog
from epochal.control.messages import Promotion, read_event
from epochal.startup.session import SessionProfile
from epochal.state import retention
from epochal.state.run_records import RUN_DIR_ENV, forget_run_record

EventHandler = Callable[["DriverProcess", dict[str, Any]], None]


@dataclass
class RunOutcome:
    """How one driver process ended."""

    code: int
    signal: int | None

    @property
    def killed(self) -> bool:
        return self.signal is not None


def _ignore(driver: DriverProcess, event: dict[str, Any]) -> None:
    return None


class DriverProcess:
    """One driver process: its run token, its heartbeats, its events (read from its stdout
    by a thread), its log, and its scratch directory (its ``TMPDIR``, removed once the process
    ended; see :func:`epochal.base.processes.scratch_dir`).

    Args:
        profile: the session it starts.
        log_path: where its output goes.
        run_dir: where it keeps its run records.
        job: ``(epoch, snapshot_dir, name)`` to start bound to a job; None to start warm
            and wait for :meth:`promote`.
        keep_warm: a warm driver that may wait long (a job's standby) warms up again every
            :data:`~epochal.startup.warmup.KEEP_WARM_SECONDS` while it waits, or PySpark
            reaps its idle Python workers after a minute and its first batch forks them
            again (a pool driver, taken within seconds, need not).
        warm_up: a warm driver runs the warm-up query before it reports ready (False: ready
            once its SparkSession is up; its first batch then pays PySpark's first-use costs).
        on_event: called with every event but heartbeats (progress, ready, run).
    """

    def __init__(
        self,
        profile: SessionProfile,
        log_path: str,
        run_dir: str,
        *,
        job: tuple[int, str, str] | None = None,
        on_event: EventHandler = _ignore,
        keep_warm: bool = False,
        warm_up: bool = True,
    ) -> None:
        self.profile = profile
        self.token = processes.new_run_token()
        self.run_dir = run_dir
        self.warm = job is None
        self.on_event = on_event
        self.launched = time.time()
        self._inherited = frozenset(os.environ)  # what the driver's environment started from
        self.ready = threading.Event()
        self.progressed = threading.Event()
        self._cleaning = threading.Event()
        self._heartbeat = time.monotonic()
        self.log_path = log_path
        files.makedirs(os.path.dirname(log_path))
        files.makedirs(run_dir)
        self._log = RotatingLog(log_path, retention.LOG_BYTES, retention.LOG_BACKUPS)
        prune_driver_logs(os.path.dirname(log_path))
        role = ["--standby", *(["--keep-warm"] if keep_warm else [])]
        if not warm_up:
            role.append("--no-warm-up")
        if job is not None:
            epoch, snapshot_dir, name = job
            role = ["--epoch", str(epoch), snapshot_dir, name]
        scratch = processes.scratch_dir(self.token)
        os.makedirs(scratch)
        env = {
            **os.environ,
            **profile.environment(),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": scratch,  # the run's temporary files, removed when it ended
            processes.RUN_TOKEN_ENV: self.token,
            processes.SUPERVISOR_PID_ENV: str(os.getpid()),
            RUN_DIR_ENV: run_dir,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epochal.driver", "--launched", str(self.launched), *role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # copied into the rotating log (the driver dies with us)
            text=True,
            start_new_session=True,
            env=env,
        )
        assert self.proc.stdin is not None  # the profile first: never on the command line
        self.proc.stdin.write(profile.to_json() + "\n")
        self.proc.stdin.flush()
        self._reader = threading.Thread(target=self._read, name="epochal-driver-out", daemon=True)
        self._reader.start()
        self._errors = threading.Thread(
            target=self._copy_errors, name="epochal-driver-err", daemon=True
        )
        self._errors.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = read_event(line)
            if event is None:
                self._log.write(line)
                continue
            self._heartbeat = time.monotonic()
            kind = event.get("type", "progress")
            if kind == "ready":
                self.ready.set()
            elif kind == "progress":
                self.progressed.set()
            if kind != "heartbeat":
                self.on_event(self, event)

    def _copy_errors(self) -> None:
        """The driver's standard error (its JVM's and Python workers' too) into its log."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._log.write(line)

    def heartbeat_age(self) -> float:
        """Seconds since the driver last said anything."""
        return time.monotonic() - self._heartbeat

    def alive(self) -> bool:
        return self.proc.poll() is None

    def promote(self, epoch: int, snapshot_dir: str, job: str) -> None:
        """Bind this warm driver to ``job`` at lease ``epoch``: it starts the job's query.
        The driver's Python takes the supervisor's environment as it is now (a pipeline that
        reads a setting from the environment sees the current one, and no longer sees one the
        supervisor has dropped since the driver was launched); its JVM and workers keep the
        one they started with (connectors get what they need from the run record)."""
        assert self.proc.stdin is not None
        per_driver = {
            processes.RUN_TOKEN_ENV,
            processes.SUPERVISOR_PID_ENV,
            RUN_DIR_ENV,
            *self.profile.environment(),
        }
        env = {k: v for k, v in os.environ.items() if k not in per_driver}
        launch_only = {*per_driver, "TMPDIR", "PYTHONUNBUFFERED"}  # the launch's own settings
        unset = tuple(sorted(k for k in self._inherited - set(os.environ) if k not in launch_only))
        self.proc.stdin.write(Promotion(epoch, snapshot_dir, job, env, unset).to_line())
        self.proc.stdin.flush()
        self.warm = False
        self._heartbeat = time.monotonic()

    def kill(self) -> None:
        """End every process of this driver run (PySpark daemons included) and wait."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            processes.kill_run(self.token)
        self.wait()
        with contextlib.suppress(OSError):
            forget_run_record(self.run_dir, self.token)

    def wait(self, timeout: float | None = None) -> RunOutcome | None:
        """The outcome once the process ended (None if it still runs after ``timeout``)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        joined_by = time.monotonic() + 5  # a process of the run still holding the pipes
        self._reader.join(5)
        self._errors.join(max(0.0, joined_by - time.monotonic()))
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        with contextlib.suppress(OSError):
            self._log.close()
        if not self._cleaning.is_set():  # off the recovery path: the next driver starts now
            self._cleaning.set()
            threading.Thread(target=self._clean_up, name="epochal-driver-clean-up").start()
        if code < 0:
            return RunOutcome(code, -code)
        if code == 137:
            return RunOutcome(code, signal.SIGKILL)
        return RunOutcome(code, None)

    def _clean_up(self) -> None:
        """Once the driver process ended: end what is left of its run (a PySpark daemon or
        worker on its way out) and remove the run's scratch directory, with what a killed
        run leaves there (Spark's local directories, unpacked native libraries)."""
        with contextlib.suppress(TimeoutError):
            processes.kill_run(self.token, timeout=5.0)
        processes.remove_scratch(self.token)


def prune_driver_logs(directory: str, keep: int = retention.DRIVER_LOGS) -> list[str]:
    """Delete the logs of all but the ``keep`` newest drivers in ``directory`` (a log with its
    rotated parts; a pool driver's link too); returns what was deleted."""
    newest_first = sorted(
        (
            name
            for name in _listdir(directory)
            if name.startswith("driver-") and name.endswith(".log")
        ),
        key=lambda name: _mtime(os.path.join(directory, name)),
        reverse=True,
    )
    deleted = []
    for name in newest_first[keep:]:
        for path in logfiles.parts(os.path.join(directory, name)) or [
            os.path.join(directory, name)
        ]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                deleted.append(path)
    return deleted


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _mtime(path: str) -> float:
    try:
        return os.lstat(path).st_mtime
    except FileNotFoundError:
        return 0.0


_DEFAULT_POOL: DriverPool | None = None


def default_pool() -> DriverPool | None:
    """The pool supervisors of this process take warm drivers from when they are given
    none (set by :func:`use_pool`; the conformance kit sets one for a test session)."""
    return _DEFAULT_POOL


def use_pool(pool: DriverPool | None) -> None:
    """Make ``pool`` the default pool of this process (None: no default)."""
    global _DEFAULT_POOL
    _DEFAULT_POOL = pool


def poolable(profile: SessionProfile) -> bool:
    """Whether warm drivers of a pool can serve this profile: a local master (a local
    cluster or a real cluster holds executors that a waiting driver would keep busy)."""
    return profile.master.startswith("local[") or profile.master == "local"


class DriverPool:
    """Warm drivers, ready for any job whose session profile they have.

    ``take(profile)`` hands out a ready driver (the caller owns it from then on, and starts
    a replacement in the pool); a supervisor given a pool promotes a driver from it instead of
    starting one cold. A driver is never handed out twice, and a pool driver that dies while
    waiting is replaced. Drivers are started from the pool's own thread, so they die with it
    (the parent-death signal follows the thread that started them).

    Args:
        size: how many warm drivers to keep per profile.
        directory: where their logs and run records go, taken drivers' too (by default a
            temporary directory, removed by :meth:`close`).
        warm_up: whether its drivers run the warm-up query before they are ready (see
            :class:`DriverProcess`).
    """

    def __init__(self, size: int = 1, directory: str | None = None, warm_up: bool = True) -> None:
        self.size = size
        self.warm_up = warm_up
        self.directory = directory or tempfile.mkdtemp(prefix="epochal-pool-")
        self._own_directory = directory is None
        self._lock = threading.Lock()
        self._warm: dict[SessionProfile, list[DriverProcess]] = {}
        self._wanted: set[SessionProfile] = set()
        self._asked: set[SessionProfile] = set()  # since the last retire_unasked()
        self._wake = threading.Event()
        self._closed = False
        self._started = 0
        self._thread = threading.Thread(target=self._keep_warm, name="epochal-pool", daemon=True)
        self._thread.start()

    def prepare(self, profile: SessionProfile) -> None:
        """Start warming drivers for ``profile`` (before a job needs one)."""
        if not poolable(profile):
            return
        with self._lock:
            self._wanted.add(profile)
            self._asked.add(profile)
        self._wake.set()

    def retire_unasked(self) -> int:
        """Stop keeping drivers for every profile that no job asked for (:meth:`prepare`,
        :meth:`take`) since the last call, and kill their waiting drivers; returns how many.

        A user of the pool that works in phases calls it when one ends (the kit: after each
        test module), so a profile that nothing asks for any more stops costing a JVM per
        waiting driver and a new one each time one dies; a profile asked for again is
        warmed again. A profile asked for in the phase that ended is kept for the next."""
        with self._lock:
            unasked = self._wanted - self._asked
            self._wanted -= unasked
            self._asked.clear()
            drivers = [d for profile in unasked for d in self._warm.pop(profile, [])]
        for driver in drivers:
            driver.kill()
        return len(drivers)

    def waiting(self, profile: SessionProfile) -> int:
        """How many drivers of ``profile`` the pool keeps now (ready or warming)."""
        with self._lock:
            return len(self._warm.get(profile, []))

    def take(self, profile: SessionProfile, wait: float = 0.0) -> DriverProcess | None:
        """A driver of ``profile`` for a job: a ready one; else, after waiting up to ``wait``
        seconds for one to get ready, the one furthest into its warm-up (promoted before it
        is ready, it skips the rest of its warm-up and is still ahead of a cold start);
        None when the pool has none alive."""
        if not poolable(profile):
            return None
        self.prepare(profile)
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                alive = [d for d in self._warm.get(profile, []) if d.alive()]
                ready = [d for d in alive if d.ready.is_set()]
                if ready or (alive and time.monotonic() >= deadline):
                    chosen = (ready or alive)[0]  # in start order: the oldest first
                    self._warm[profile].remove(chosen)
                    self._wake.set()
                    return chosen
                if not alive:
                    return None
            time.sleep(0.05)

    def _keep_warm(self) -> None:
        while not self._closed:
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                for profile in self._wanted:
                    drivers = self._warm.setdefault(profile, [])
                    for dead in [d for d in drivers if not d.alive()]:
                        drivers.remove(dead)
                        dead.kill()
                    while len(drivers) < self.size:
                        self._started += 1
                        drivers.append(
                            DriverProcess(
                                profile,
                                f"{self.directory}/driver-{self._started}.log",
                                f"{self.directory}/runs",
                                warm_up=self.warm_up,
                            )
                        )

    def close(self) -> None:
        """Kill every waiting driver, and remove the pool's own directory if it made one, with
        the logs and run records of every driver it started (drivers taken from it too: close
        the pool once the jobs that took them ended)."""
        with self._lock:
            self._closed = True
            drivers = [d for group in self._warm.values() for d in group]
            self._warm.clear()
        self._wake.set()
        for driver in drivers:
            driver.kill()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
