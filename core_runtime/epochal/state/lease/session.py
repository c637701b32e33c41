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
from typing import Any

from epochal.base import files, processes
from epochal.state.layout import JobLayout
from epochal.state.lease.record import LEASE_TTL
from epochal_sdk import EpochalError, Guarantee

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
    layout: JobLayout, guarantee: Guarantee, ttl: float, driver: DriverJvm | None = None
) -> Holding:
    """The job's lease as this process's driver (``driver``: default, the JVM this process
    runs under) holds it: read from the driver's record, or taken now by a new keeper
    (waiting out a live holder's TTL). Raises :class:`LeaseNotHeldError` when another driver
    keeps the job."""
    driver = driver or DriverJvm.current()
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
    layout: JobLayout, driver: DriverJvm, guarantee: Guarantee, ttl: float, path: str
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


def write_record(path: str, value: dict[str, Any]) -> None:
    """Replace the session record at ``path`` with ``value`` at once (an owner-only file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with os.fdopen(files.create(tmp), "w") as out:
        json.dump(value, out)
    os.replace(tmp, path)
