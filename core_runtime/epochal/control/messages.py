"""The messages between a supervisor and its driver processes, in one place.

A driver tells its supervisor what it does with one line per event on its stdout, each
``epochal-progress <json>`` (:func:`emit`, read back by :func:`read_event`): ``heartbeat``
(every :data:`HEARTBEAT_SECONDS`), ``ready`` (a warm driver finished its warm-up), ``run``
(a run of the job's query started) and ``progress`` (a batch was committed). Anything else the
driver prints is its log.

The supervisor talks to a warm driver through its stdin: one JSON line promotes it to run a
job (:class:`Promotion`). The stdin closing means the supervisor is gone.

A driver process ends with one of the exit codes below; the supervisor decides from it (and
from the job record) whether to restart the job.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

PROGRESS_PREFIX = "epochal-progress "
"""Starts every event line a driver prints for its supervisor."""
HEARTBEAT_SECONDS = 1.0
"""How often a driver tells its supervisor it is alive."""

EXIT_DONE = 0
"""The job's query finished (available-now) or was stopped on request."""
EXIT_RESTARTABLE = 75
"""The driver failed in a way a new driver can recover from."""
EXIT_FENCED = 76
"""The driver stopped because another driver owns the job (restartable, never FAILED)."""
EXIT_FATAL = 70
"""The driver failed in a way a restart would repeat (the job fails)."""

_OUT = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    """Print one event line for the supervisor (driver side; thread-safe)."""
    line = PROGRESS_PREFIX + json.dumps(event)
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def read_event(line: str) -> dict[str, Any] | None:
    """The event of a line a driver printed (supervisor side); None for a log line."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        event = json.loads(line[len(PROGRESS_PREFIX) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


@dataclass(frozen=True)
class Promotion:
    """The supervisor's order to a warm driver: run job ``job`` of ``snapshot_dir`` at lease
    ``epoch``, with the supervisor's environment as it is now (``env``), without the variables
    it had when the driver was launched and no longer has (``unset``: a warm driver must not
    run a pipeline with a setting the supervisor has since dropped)."""

    epoch: int
    snapshot_dir: str
    job: str
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    def to_line(self) -> str:
        """The line written to the driver's stdin."""
        return (
            json.dumps(
                {
                    "promote": True,
                    "epoch": self.epoch,
                    "snapshot_dir": self.snapshot_dir,
                    "job": self.job,
                    "env": self.env,
                    "unset": list(self.unset),
                }
            )
            + "\n"
        )

    def apply_env(self, environ: MutableMapping[str, str]) -> None:
        """Make ``environ`` (the warm driver's) the supervisor's: drop ``unset``, take ``env``."""
        for name in self.unset:
            environ.pop(name, None)
        environ.update(self.env)

    @classmethod
    def parse(cls, line: str) -> Promotion | None:
        """The promotion in a line read from stdin; None for anything else."""
        if not line.strip().startswith("{"):
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict) or not message.get("promote"):
            return None
        return cls(
            int(message["epoch"]),
            str(message["snapshot_dir"]),
            str(message["job"]),
            {str(k): str(v) for k, v in dict(message.get("env") or {}).items()},
            tuple(str(k) for k in message.get("unset") or ()),
        )
