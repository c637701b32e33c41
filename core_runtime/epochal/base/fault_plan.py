"""Fault injection: named points at every protocol step where a process is killed hard
(or paused), as the failures of real deployments do it.

A plan is a list of ``point[@batch][:action]`` items. Separated by commas, each item fires
once per job, at the first process that reaches it (at that batch, when one is given).
Separated by ``>``, the items form a *sequence*: each fires only after the one before it has
fired, so one job run can go through many failures one after another::

    sink.after_prepare@2, sink.after_decision@4          # two independent faults
    source.after_plan > sink.after_decision:worker > job.after_batch:supervisor

Actions (the default is ``driver`` for driver points, ``executor`` for executor points):

``driver``      SIGKILL every process of the driver run: the Python driver, its JVM, every
                PySpark daemon and worker (they carry the run's token, see
                :mod:`epochal.base.processes`).
``executor``    SIGKILL the executor JVM above this Python worker on a cluster
                (``local-cluster``), the Python worker itself in local mode.
``worker``      SIGKILL only the Python process that reached the point (a driver-side
                runner or an executor's worker): the driver survives.
``supervisor``  SIGKILL the job's supervisor; the driver must not outlive it.
``pause``       SIGSTOP the supervisor and every process of the driver run (a paused
                machine, a long GC): the test resumes it later to check that the zombie
                does nothing once another supervisor took the job over.
``stall``       SIGSTOP only the process that reached the point (a task stuck where a
                stop finds it: a worker in a long GC, a hung call): the run goes on around
                it until a stop or a kill of the run ends it.
``slow``        the process that reached the point carries on after :data:`SLOW_SECONDS`
                (a task a stop finds slowed, in a GC pause or on a slow disk: it takes its
                next step after the stop, before Spark kills its Python worker).

The process that fires a fault first records a marker in ``<job>/faults`` (with the pids it
is about to kill or stop, and the run's token), then acts. A run that a fault ended or
paused (``driver``, ``supervisor``, ``pause``) fires no later fault: what is left of it (an
orphaned driver finishing a step before it notices its supervisor is gone, a zombie resumed
after its pause) must not take a fault meant for the run that took the job over.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

from epochal.base import files
from epochal.base.processes import RUN_TOKEN_ENV, SUPERVISOR_PID_ENV, processes_of
from epochal_sdk import ConfigError

DRIVER_POINTS = {
    "source.after_plan": "replayable source: offsets of a batch planned, not yet in the offset log",
    "source.after_commit": "replayable source: commit(end) reached (batch in the commit log)",
    "ack_source.after_receive": "acknowledging source: messages received, not yet stored",
    "ack_source.after_store": "acknowledging source: batch stored, not yet planned",
    "ack_source.before_ack": "acknowledging source: snapshot complete, nothing acknowledged yet",
    "ack_source.after_ack": "acknowledging source: acknowledged, not yet recorded",
    "sink.before_decision": "transactional sink: every task prepared, no decision recorded yet",
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
ACTIONS = ("driver", "executor", "worker", "supervisor", "pause", "stall", "slow")
RUN_ENDING_ACTIONS = ("driver", "supervisor", "pause")
"""Actions after which the run they hit fires no more faults (it is ended or a zombie)."""

FAULTS_ENV = "EPOCHAL_FAULTS"
SLOW_SECONDS = 1.5
"""How long ``slow`` holds its process: less than Spark takes to kill the Python worker of a
cancelled task (``spark.python.task.killTimeout``, 2 s, after its monitor saw the cancel)."""


@dataclass(frozen=True)
class Fault:
    """One fault: a point, optionally a batch, and what happens there."""

    point: str
    batch: int | None = None
    action: str | None = None

    @property
    def kind(self) -> str:
        """The action, with the point's default filled in."""
        if self.action:
            return self.action
        return "executor" if self.point in EXECUTOR_POINTS else "driver"

    @property
    def label(self) -> str:
        """``point[@batch][:action]``."""
        text = self.point if self.batch is None else f"{self.point}@{self.batch}"
        return f"{text}:{self.action}" if self.action else text


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a job, and where their fired-markers live."""

    faults: tuple[Fault, ...] = ()
    marker_dir: str | None = None
    sequential: bool = False

    @classmethod
    def parse(cls, text: str, marker_dir: str | None = None) -> FaultPlan:
        """Parse a plan (see the module doc); unknown points or actions are an error that
        lists the known ones."""
        text = text or ""
        sequential = ">" in text
        faults = []
        separator = ">" if sequential else ","
        for item in filter(None, (part.strip() for part in text.split(separator))):
            faults.append(_parse_item(item))
        return cls(tuple(faults), marker_dir, sequential)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def reach(self, point: str, batch: int | None = None) -> None:
        """Called at each protocol step: acts here if the plan says so (once)."""
        if not self.faults:
            return
        fired = self.fired() if self.sequential else []
        for index, fault in enumerate(self.faults):
            if self.sequential and index != len(fired):
                continue  # only the next fault of a sequence is armed
            if fault.point != point or (fault.batch is not None and fault.batch != batch):
                continue
            if self._ended_this_run():
                return  # an orphan or a zombie: the faults left are for the runs after it
            if self._claim(index, fault, batch):
                _act(fault, batch)

    def _ended_this_run(self) -> bool:
        """Whether a fault already fired ended or paused the run this process belongs to."""
        token = os.environ.get(RUN_TOKEN_ENV)
        if not token or not self.marker_dir:
            return False
        for index, fault in enumerate(self.faults):
            if fault.kind not in RUN_ENDING_ACTIONS:
                continue
            path = os.path.join(self.marker_dir, self._marker(index, fault))
            try:
                with open(path) as fh:
                    info = json.load(fh)
            except (OSError, ValueError):
                continue  # not fired
            if isinstance(info, dict) and info.get("token") == token:
                return True
        return False

    def _marker(self, index: int, fault: Fault) -> str:
        name = fault.label.replace("/", "_")
        return f"{index:03d}-{name}" if self.sequential else name

    def _claim(self, index: int, fault: Fault, batch: int | None = None) -> bool:
        if self.marker_dir is None:
            return True
        files.makedirs(self.marker_dir)
        path = os.path.join(self.marker_dir, self._marker(index, fault))
        info = {
            "pid": os.getpid(),
            "token": os.environ.get(RUN_TOKEN_ENV),
            "supervisor": os.environ.get(SUPERVISOR_PID_ENV),
            "batch": batch,
            "at": time.time(),
        }
        try:  # whole or absent: a reader never sees a marker without its pids
            files.write_whole(path, json.dumps(info).encode(), exclusive=True)
        except FileExistsError:
            return False
        return True

    def fired(self) -> list[str]:
        """Labels of the faults that fired so far (in the order of the plan)."""
        if not self.marker_dir or not os.path.isdir(self.marker_dir):
            return []
        names = {n for n in os.listdir(self.marker_dir) if files.TMP_MARKER not in n}
        out = []
        for index, fault in enumerate(self.faults):
            if self._marker(index, fault) in names:
                out.append(fault.label)
            elif self.sequential:
                break
        if not self.faults:  # an empty plan reports whatever fired (old markers)
            return sorted(names)
        return out

    def marker_info(self, label: str) -> dict:
        """What the process that fired ``label`` recorded (pid, run token, supervisor pid)."""
        for index, fault in enumerate(self.faults):
            if fault.label == label and self.marker_dir:
                path = os.path.join(self.marker_dir, self._marker(index, fault))
                with open(path) as fh:
                    return dict(json.load(fh))
        raise KeyError(label)


def _parse_item(item: str) -> Fault:
    head, _, given = item.partition(":")
    point, _, batch = head.strip().partition("@")
    point, action = point.strip(), given.strip() or None
    if point not in POINTS:
        raise ConfigError(
            "job", "faults", f"unknown crash point {point!r}", f"Use: {', '.join(POINTS)}."
        )
    if action is not None and action not in ACTIONS:
        raise ConfigError(
            "job", "faults", f"unknown action {action!r} in {item!r}", f"Use: {', '.join(ACTIONS)}."
        )
    try:
        return Fault(point, int(batch) if batch else None, action)
    except ValueError:
        raise ConfigError(
            "job", "faults", f"{item!r}: batch is not a number", "Write point@3."
        ) from None


def _act(fault: Fault, batch: int | None) -> None:
    kind = fault.kind
    sys.stderr.write(f"epochal: fault {fault.label} at batch {batch}: {kind}\n")
    sys.stderr.flush()
    supervisor = int(os.environ.get(SUPERVISOR_PID_ENV) or 0)
    if kind == "pause":
        if supervisor:
            _signal(supervisor, signal.SIGSTOP)
        for pid in processes_of(os.environ.get(RUN_TOKEN_ENV, "")):
            _signal(pid, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # resumed (SIGCONT): carry on as a zombie would
    if kind == "stall":
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # resumed (SIGCONT): carry on
    if kind == "slow":
        time.sleep(SLOW_SECONDS)  # the fault itself: a slowed step, not a wait for anything
        return
    if kind == "supervisor":
        if supervisor:
            _signal(supervisor, signal.SIGKILL)
        return  # the driver goes down with its supervisor; this step carries on meanwhile
    if kind == "worker":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "executor":
        os.kill(_executor_jvm() or os.getpid(), signal.SIGKILL)
    else:
        _kill_driver_run()
    os._exit(137)  # not reached unless the kill was refused


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


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


def _kill_driver_run() -> None:
    """SIGKILL every process of this driver run (found by its token), then this one. Outside
    a supervised run (no token) only this process dies."""
    token = os.environ.get(RUN_TOKEN_ENV)
    if token:
        for pid in processes_of(token):
            _signal(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
