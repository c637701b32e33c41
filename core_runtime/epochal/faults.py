"""Fault injection: named crash points at every protocol step that kill the process hard.

A plan is a comma-separated list of ``point[@batch]`` items, e.g.
``"sink.after_prepare@2, sink.after_decision@4"``. Each item fires once per job: the first
process that reaches it creates a marker in the snapshot store and then dies with SIGKILL, so
the restarted job runs past it. Driver points kill the whole driver (its process group:
the Python driver, its JVM and their workers); executor points kill the executor JVM when there
is one (``local-cluster``/a cluster) and the Python worker otherwise.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

from epochal_sdk import ConfigError

DRIVER_POINTS = {
    "source.after_plan": "replayable source: offsets of a batch planned, not yet in the offset log",
    "source.after_commit": "replayable source: commit(end) reached (batch in the commit log)",
    "ack_source.after_store": "acknowledging source: batch stored, not yet planned",
    "ack_source.before_ack": "acknowledging source: snapshot complete, nothing acknowledged yet",
    "ack_source.after_ack": "acknowledging source: acknowledged, not yet recorded",
    "sink.after_decision": "transactional sink: decision recorded, phase 2 not started",
    "sink.mid_commit": "transactional sink: first transaction of phase 2 committed, rest not",
    "sink.after_commit": "sink: batch committed, Spark's commit log not yet written",
    "job.after_batch": "job: batch complete (commit log written)",
}
EXECUTOR_POINTS = {
    "source.after_read": "replayable source: a task read its split, rows not yet handed on",
    "sink.after_write": "sink: a task wrote its rows, not yet prepared/flushed",
    "sink.after_prepare": "transactional sink: a task prepared (phase 1), not yet reported",
    "sink.after_flush": "idempotent sink: a task flushed its upserts, not yet reported",
}
POINTS = {**DRIVER_POINTS, **EXECUTOR_POINTS}

FAULTS_ENV = "EPOCHAL_FAULTS"


@dataclass(frozen=True)
class Fault:
    """One crash point, optionally only at one batch."""

    point: str
    batch: int | None = None

    @property
    def label(self) -> str:
        """``point@batch`` or ``point``."""
        return self.point if self.batch is None else f"{self.point}@{self.batch}"


@dataclass(frozen=True)
class FaultPlan:
    """The crash points of a job, and where their fired-markers live."""

    faults: tuple[Fault, ...] = ()
    marker_dir: str | None = None

    @classmethod
    def parse(cls, text: str, marker_dir: str | None = None) -> FaultPlan:
        """Parse ``"point[@batch], ..."``; unknown points are an error listing the known ones."""
        faults = []
        for item in filter(None, (part.strip() for part in (text or "").split(","))):
            point, _, batch = item.partition("@")
            if point not in POINTS:
                raise ConfigError(
                    "job", "faults", f"unknown crash point {point!r}", f"Use: {', '.join(POINTS)}."
                )
            try:
                faults.append(Fault(point, int(batch) if batch else None))
            except ValueError:
                raise ConfigError(
                    "job", "faults", f"{item!r}: batch is not a number", "Write point@3."
                ) from None
        return cls(tuple(faults), marker_dir)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def reach(self, point: str, batch: int | None = None) -> None:
        """Called at each protocol step: dies here if the plan says so (once)."""
        if not self.faults:
            return
        for fault in self.faults:
            if fault.point != point or (fault.batch is not None and fault.batch != batch):
                continue
            if self._claim(fault):
                _die(point, batch)

    def _claim(self, fault: Fault) -> bool:
        if self.marker_dir is None:
            return True
        os.makedirs(self.marker_dir, exist_ok=True)
        path = os.path.join(self.marker_dir, fault.label.replace("/", "_"))
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        os.close(fd)
        return True

    def fired(self) -> list[str]:
        """Labels of the faults that fired so far."""
        if not self.marker_dir or not os.path.isdir(self.marker_dir):
            return []
        return sorted(os.listdir(self.marker_dir))


def _die(point: str, batch: int | None) -> None:
    sys.stderr.write(f"epochal: crash point {point} at batch {batch}: killing (SIGKILL)\n")
    sys.stderr.flush()
    if point in EXECUTOR_POINTS:
        target = _executor_jvm()
        os.kill(target or os.getpid(), signal.SIGKILL)
    else:
        _kill_driver()
    os._exit(137)  # not reached unless the kill was refused


def _executor_jvm() -> int | None:
    """The executor JVM above this Python worker, if this is a cluster executor."""
    pid = os.getppid()
    for _ in range(6):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return None
        if b"CoarseGrainedExecutorBackend" in cmd:
            return pid
        if pid <= 1:
            return None
        pid = parent
    return None


def _kill_driver() -> None:
    """Kill the driver's process group when the driver runs under the supervisor; else this
    process's own group would include the test runner, so kill the driver JVM ancestry only."""
    group = os.environ.get("EPOCHAL_DRIVER_PGID")
    if group:
        os.killpg(int(group), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
