"""A session driver's hold on its job's lease: the driver's JVM (:class:`DriverJvm`), what its
lease keeper holds (:class:`Holding`), read from the driver's session record or taken by
starting the keeper (:func:`hold`). The keeper itself, which takes, renews and releases the
lease, is the process ``python -m epochal.control.lease_keeper``.

The planner workers of the driver read what the keeper holds from a small record on the
driver's machine (:attr:`~epochal.state.layout.JobLayout.sessions`), one per driver JVM.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epochal.base import files, logfiles, processes
from epochal.state import retention
from epochal.state.layout import JobLayout
from epochal.state.lease.record import LEASE_TTL
from epochal_sdk import EpochalError, Guarantee

if TYPE_CHECKING:
    from epochal.state.jobs import JobDirectory

KEEPER_MODULE = "epochal.control.lease_keeper"
"""The lease keeper's module, run as a process of its own."""
START_GRACE_SECONDS = 30.0
"""How long a planner waits, beyond the lease's TTL, for its keeper to take the lease."""


class LeaseNotHeldError(EpochalError):
    """This driver could not take (or lost) its job's lease: another driver runs the job."""


@dataclass(frozen=True)
class Holding:
    """What a driver's keeper holds: the lease epoch and the run it started under it, and
    the job's incarnation (from its record; see :mod:`epochal_sdk.ids`)."""

    epoch: int
    run: int
    owner: str
    keeper: int
    driver: int
    driver_started: int
    incarnation: str = ""


@dataclass(frozen=True)
class DriverJvm:
    """The driver JVM a process belongs to (a Spark Python worker's nearest Java ancestor;
    a process under no JVM stands for itself), named for good by pid and start time."""

    pid: int
    started: int

    @classmethod
    def current(cls) -> DriverJvm:
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
    else ``EPOCHAL_LEASE_TTL``, else :data:`~epochal.state.lease.record.LEASE_TTL`."""
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
    layout: JobLayout,
    guarantee: Guarantee,
    ttl: float,
    driver: DriverJvm | None = None,
    *,
    query_start: str | None = None,
) -> Holding:
    """The job's lease as this process's driver (``driver``: default, the JVM this process
    runs under) holds it: read from the driver's record, or taken now by a new keeper
    (waiting out a live holder's TTL). Raises :class:`LeaseNotHeldError` when another driver
    keeps the job.

    ``query_start``: the job's query starts now, as the Spark query run of this id (its
    ``runId``; Spark plans its epochal sink, or its ``foreachBatch`` writer has its first
    batch). The first start in a driver JVM runs as the run the keeper began with the
    lease; every later start (the query stopped or failed and was started again in the same
    JVM) begins a new run (:func:`begin_run`), so that its sinks' start-of-run recovery
    settles what the stopped query left prepared, as a new driver's would, and no
    transaction id is used twice. A start is claimed once: the session check and the
    query's writer may both claim the same query run, and only the first does.
    Once the driver lost the lease (:data:`LOST` in its record) every planner of the job
    is refused, but a new start of the query takes the lease again through a new keeper
    (waiting out the holder that took it)."""
    driver = driver or DriverJvm.current()
    files.makedirs(layout.sessions)
    path = record_path(layout, driver)
    with _locked(path + ".lock"):
        found = read_record(path)
        if found is not None and found.get(LOST) and not query_start:
            raise LeaseNotHeldError(str(found[LOST]))
        if (
            found is not None
            and "epoch" in found
            and not found.get(LOST)
            and processes.alive(int(found["keeper"]))
        ):
            return _holding(_claimed(layout, path, found, query_start) if query_start else found)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        prune_ended_sessions(layout)
        keeper = _start_keeper(layout, driver, guarantee, ttl, path)
        deadline = time.monotonic() + ttl + START_GRACE_SECONDS
        while time.monotonic() < deadline:
            found = read_record(path)
            if found is not None:
                if "epoch" in found:
                    return _holding(
                        _claimed(layout, path, found, query_start) if query_start else found
                    )
                raise LeaseNotHeldError(str(found.get("error") or found.get(LOST)))
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


LOST = "lost"
"""In a session record: why the driver may no longer act for the job (its keeper found the
lease taken over or unrenewable, or the keeper died); written by the keeper (or by the
driver's query fence when the keeper died)."""
WATCHER = "watcher"
"""In a session record: the pid of the driver's process whose query fence watches the record
(:mod:`epochal.spark.query_fence`): it stops the job's query when the lease is lost."""
STOPPED = "stopped"
"""In a session record: when the query fence stopped the job's queries after a loss."""
QUERY_STOP_FRACTION = 4
"""A lost lease's query must stop within TTL/4 (:func:`query_stop_bound`)."""


def query_stop_bound(ttl: float) -> float:
    """How long a keeper that lost its lease waits for the driver's query fence to stop the
    job's query before it kills the driver's JVM (the last resort): a quarter of the TTL. A
    keeper gives up after half a TTL unrenewed, so the query is stopped, or the JVM killed,
    within three quarters of the TTL after the last renewal, before the lease can lapse."""
    return ttl / QUERY_STOP_FRACTION


def prune_ended_sessions(layout: JobLayout, keep: int = retention.DRIVER_RECORDS) -> list[str]:
    """Delete the session records (with their lock files and keeper logs) of all but the
    ``keep`` newest drivers of this machine that ended; a live driver's are never deleted.
    Returns the records deleted."""
    host = socket.gethostname()
    ended = []
    for name in os.listdir(layout.sessions) if os.path.isdir(layout.sessions) else []:
        head, _, tail = name.removesuffix(".json").rpartition("-")
        record_host, _, pid = head.rpartition("-")
        if not name.endswith(".json") or record_host != host or not (pid + tail).isdigit():
            continue
        if not DriverJvm(int(pid), int(tail)).alive:
            ended.append((os.path.join(layout.sessions, name), pid))
    deleted = logfiles.keep_newest([path for path, _ in ended], keep)
    for path, pid in ended:
        if path not in deleted:
            continue
        leftovers = [path + ".lock"]
        if not processes.alive(int(pid)):  # a live process of that pid may write the log now
            leftovers += logfiles.parts(f"{layout.logs}/session-{pid}.log")
        for leftover in leftovers:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    return deleted


def record_path(layout: JobLayout, driver: DriverJvm) -> str:
    """The session record of ``driver`` for the job of ``layout`` (what its keeper holds)."""
    return os.path.join(layout.sessions, f"{driver.key}.json")


def update_record(path: str, **fields: Any) -> dict[str, Any] | None:
    """Set ``fields`` in the session record at ``path``, under its lock; the record as
    written, or None when there is none (nothing is written then)."""
    with _locked(path + ".lock"):
        found = read_record(path)
        if found is None:
            return None
        found.update(fields)
        write_record(path, found)
        return found


QUERY_STARTED = "query_started"
"""In a session record: the Spark run id of the start of the job's query that runs as the
record's run (a later start begins a new run); absent before the first start."""


def _claimed(layout: JobLayout, path: str, found: dict[str, Any], query_run: str) -> dict[str, Any]:
    """The session record ``found`` at ``path`` claimed by the start of the job's query run
    ``query_run``: its run, if no start ran as it yet, else a new run (:func:`begin_run`);
    unchanged when this query run claimed it already. Called under the record's lock."""
    from epochal.state.jobs import JobDirectory

    if found.get(QUERY_STARTED) == query_run:
        return found
    if found.get(QUERY_STARTED):
        jobdir = JobDirectory(layout.snapshot_dir, layout.name)
        run = begin_run(
            jobdir,
            int(found["epoch"]),
            DriverJvm(int(found["driver"]), int(found["driver_started"])),
            keeper=int(found["keeper"]),
            previous=int(found["run"]),
        )
        found = {**found, "run": run}
    found = {**found, QUERY_STARTED: query_run}
    write_record(path, found)
    return found


def begin_run(
    jobdir: JobDirectory, epoch: int, driver: DriverJvm, *, keeper: int, previous: int = 0
) -> int:
    """Begin a new run of a session driver's job under lease ``epoch`` in the job's record
    (fenced: a driver that lost the lease begins nothing): its number, the driver and its
    keeper, a history entry; ``previous``, the run of this driver whose query stopped, is
    noted as ended. Returns the new run's number."""
    from epochal.state.jobs import JobStatus
    from epochal.state.lease.record import SESSION

    with jobdir.update(jobdir.fence(epoch)) as current:
        ended = current.run_entry(previous) if previous else None
        if ended is not None and "ended" not in ended:
            ended["ended"] = time.time()
            ended["outcome"] = "its query stopped and was started again in the same driver"
        current.run += 1
        current.status = JobStatus.RUNNING
        checkpoint = current.driver.get("checkpoint")  # noted by the query: kept for verify
        current.driver = {
            "pid": driver.pid,
            "host": socket.gethostname(),
            "epoch": epoch,
            "holder": SESSION,
            "keeper_pid": keeper,
            **({"checkpoint": checkpoint} if checkpoint else {}),
        }
        current.add_run(
            {
                "run": current.run,
                "epoch": epoch,
                "kind": SESSION,
                "started": time.time(),
                "driver_pid": driver.pid,
            }
        )
        return current.run


def _holding(found: dict[str, Any]) -> Holding:
    known = set(Holding.__dataclass_fields__)
    return Holding(**{k: v for k, v in found.items() if k in known})


def restart_keeper(path: str) -> int:
    """Start a keeper again for the holding in the session record at ``path``, whose keeper
    died: it renews the lease at once with the dead keeper's owner and epoch, and keeps it
    (``--resume``; a lease that another holder took meanwhile is lost as usual). The record
    names the new keeper at once. Returns its pid, or 0 when the record holds nothing."""
    with _locked(path + ".lock"):
        found = read_record(path)
        if found is None or "epoch" not in found or found.get(LOST) or "job" not in found:
            return 0
        keeper = _start_keeper(
            JobLayout(str(found["snapshot_dir"]), str(found["job"])),
            DriverJvm(int(found["driver"]), int(found["driver_started"])),
            Guarantee.parse(str(found["guarantee"])),
            float(found["ttl"]),
            path,
            resume=True,
        )
        found.update(keeper=keeper.pid, keeper_restarts=int(found.get("keeper_restarts", 0)) + 1)
        write_record(path, found)
        return keeper.pid


def _start_keeper(
    layout: JobLayout,
    driver: DriverJvm,
    guarantee: Guarantee,
    ttl: float,
    path: str,
    resume: bool = False,
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
        *(["--resume"] if resume else []),
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


def read_record(path: str) -> dict[str, Any] | None:
    """The session record at ``path``, or None when there is none (or it is torn)."""
    try:
        with open(path) as fh:
            return dict(json.load(fh))
    except (FileNotFoundError, ValueError):
        return None


def write_record(path: str, value: dict[str, Any]) -> None:
    """Replace the session record at ``path`` with ``value`` at once (an owner-only file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with os.fdopen(files.create(tmp), "w") as out:
        json.dump(value, out)
    os.replace(tmp, path)
