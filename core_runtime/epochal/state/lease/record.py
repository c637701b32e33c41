"""The job's lease as one type: who holds a job, at which epoch, until when.

A job's lease (``<job>/lease.json``, see :class:`~epochal.state.layout.JobLayout`) names its one
holder: a supervisor (``epochal run``) or a driver that started the job's query itself in a
plain SparkSession (under YARN, Kubernetes, a restart loop, a Spark Connect server: see
:mod:`epochal.control.lease_keeper`). Every take-over writes a greater *epoch*, the fencing token
that every protocol step checks (:mod:`epochal.state.lease.fence`). The holder renews the lease; a
new holder waits until it expired (its TTL after the last renewal), or takes it at once when it
can prove the old holder dead (same host, its process gone).

This module owns the record's format; :class:`~epochal.state.lease.swaps.JobLease` swaps it (under a
lock on a local file system, with a compare-and-swap on an object store).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any

from epochal.base import processes

LEASE_TTL = 20.0
"""Default lease time-to-live (seconds); a job's ``lease_ttl`` setting overrides it."""

SUPERVISOR = "supervisor"
"""A lease held by ``epochal run`` (the supervisor renews it for its drivers)."""
SESSION = "session"
"""A lease held by a driver that started the job's query in its own SparkSession."""


@dataclass(frozen=True)
class Lease:
    """One state of a job's lease.

    Args:
        owner: the holder's id (a supervisor's, or a session driver's).
        epoch: the fencing token: greater with every take-over and every new driver.
        state: the epoch whose state directory is the job's state now (it lags ``epoch``
            only while a take-over moves the state).
        ttl: seconds the lease lasts after ``renewed``.
        pid: the holder's process (a supervisor, or a session driver's JVM).
        host: the holder's host name.
        renewed: when it was last renewed (``time.time()``); 0 once released.
        tokens: run tokens of the holder's driver runs (a new holder on this host ends them).
        holder: :data:`SUPERVISOR` or :data:`SESSION`.
        pid_started: the holder process's start time in clock ticks since boot (so a reused
            pid is not taken for the holder); 0 when unknown.
        machine: where ``pid`` means something (:func:`machine_id`: the kernel's boot and
            the pid namespace), so that two containers with one host name (a restarted
            driver pod) never take each other's pids for their own.
    """

    owner: str
    epoch: int
    state: int
    ttl: float = LEASE_TTL
    pid: int = 0
    host: str = ""
    renewed: float = 0.0
    tokens: tuple[str, ...] = ()
    holder: str = SUPERVISOR
    pid_started: int = 0
    machine: str = ""
    released: float | None = None

    @classmethod
    def new(
        cls,
        owner: str,
        epoch: int,
        ttl: float,
        *,
        state: int,
        tokens: list[str] | tuple[str, ...] = (),
        holder: str = SUPERVISOR,
        pid: int | None = None,
    ) -> Lease:
        """A lease held from now by ``owner`` in the process ``pid`` (default: this one)."""
        pid = os.getpid() if pid is None else pid
        return cls(
            owner=owner,
            epoch=epoch,
            state=state,
            ttl=ttl,
            pid=pid,
            host=socket.gethostname(),
            renewed=time.time(),
            tokens=tuple(tokens),
            holder=holder,
            pid_started=processes.start_ticks(pid) or 0,
            machine=machine_id(),
        )

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Lease:
        """The lease from its stored record."""
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["tokens"] = tuple(values.get("tokens") or ())
        values.setdefault("state", int(data["epoch"]))
        return cls(**values)

    def to_record(self) -> dict[str, Any]:
        """The stored record (JSON-ready)."""
        out = asdict(self)
        out["tokens"] = list(self.tokens)
        if out["released"] is None:
            del out["released"]
        return out

    def renewed_now(self, ttl: float, tokens: list[str] | None = None) -> Lease:
        """The same holding, renewed now (naming ``tokens`` when given)."""
        return replace(
            self,
            ttl=ttl,
            renewed=time.time(),
            tokens=tuple(tokens) if tokens is not None else self.tokens,
        )

    def released_now(self) -> Lease:
        """The lease given up: the epoch stays (fencing tokens keep growing), nobody holds it."""
        return replace(self, renewed=0.0, tokens=(), released=time.time())

    def age(self, now: float | None = None) -> float:
        """Seconds since the last renewal."""
        return (time.time() if now is None else now) - self.renewed

    def held_by(self, owner: str, epoch: int) -> bool:
        """Whether ``owner`` holds this lease at ``epoch``."""
        return self.owner == owner and self.epoch == epoch

    def holder_dead(self) -> bool:
        """Whether the holder is known to be gone: it ran on this host and its process is not
        alive (or its pid now names another process). From another host nothing is known:
        the lease must expire."""
        if self.host != socket.gethostname() or self.machine != machine_id():
            return False
        if not processes.alive(self.pid):
            return True
        started = processes.start_ticks(self.pid)
        return bool(self.pid_started) and started is not None and started != self.pid_started

    def takeover_wait(self) -> float:
        """Seconds a new holder must still wait before taking this lease (0: now)."""
        remaining = self.ttl - self.age()
        if remaining <= 0 or self.holder_dead():
            return 0.0
        return remaining

    @property
    def live(self) -> bool:
        """Whether someone holds the job now (renewed within its TTL and not known dead)."""
        return self.takeover_wait() > 0

    def describe(self) -> str:
        """For messages of a refused holder: who holds it, where, since when."""
        what = "another supervisor" if self.holder == SUPERVISOR else "another driver's own session"
        return (
            f"{what} (pid {self.pid} on {self.host}, lease epoch {self.epoch}, renewed "
            f"{self.age():.0f}s ago, ttl {self.ttl:.0f}s)"
        )


def machine_id() -> str:
    """Where a pid names a process: the kernel's boot id and this process's pid namespace
    (containers on one node share the boot, not the namespace); "" where /proc has
    neither."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def new_owner() -> str:
    """A fresh lease owner id."""
    return uuid.uuid4().hex
