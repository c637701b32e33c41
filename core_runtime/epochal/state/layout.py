"""The layout of a job's directory, in one place.

::

    <snapshot_dir>/<job>/job.json                    the job record (status, runs, progress)
                        /lease.json                  the lease (:mod:`epochal.state.lease`)
                        /epochs/<epoch>/checkpoint   Spark's checkpoint of the live epoch
                        /epochs/<epoch>/store        the connectors' part of the snapshots
                        /faults/                     markers of fired crash points (tests)
                        /logs/                       driver and protocol logs      (local)
                        /drivers/<token>.json        what each supervised driver run is (local)
                        /sessions/<driver>.json      what a session driver holds     (local)

On an object store (``s3://``) every epoch's state lives at one shared prefix
``<job>/state`` (an object store cannot rename a tree: see :mod:`epochal.state.lease.fence`), and
what concerns one machine only (logs, driver and session records) is kept on that machine's disk
(:func:`local_dir`).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from epochal.state import objectstore

JOB_RECORD = "job.json"
LEASE_RECORD = "lease.json"
EPOCHS = objectstore.EPOCHS_SEGMENT
"""The directory under a job that holds the state of its live epoch (and nothing else for
long: stale ones left by zombies are deleted at the next take-over)."""
DRIVERS = "drivers"
SESSIONS = "sessions"
FAULTS = "faults"
LOGS = "logs"
CHECKPOINT = "checkpoint"
STORE = "store"
LOCAL_DIR_ENV = "EPOCHAL_LOCAL_DIR"
"""Where the logs and driver records of jobs whose snapshot directory is not on a local file
system go (default ``$XDG_STATE_HOME/epochal`` or ``~/.local/state/epochal``)."""


def check_job_name(name: str) -> str:
    """``name`` if it can name a job (a directory, a prefix of transaction ids); else a
    ``ValueError`` that says what is allowed."""
    if not name or not all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        raise ValueError(
            f"job name {name!r} is not allowed: use letters, digits, '-' and '_' "
            "(it names a directory and prefixes transaction ids)"
        )
    return name


@dataclass(frozen=True)
class JobLayout:
    """Where everything of one job is.

    Args:
        snapshot_dir: the snapshot directory (a path or a URI) that holds the job.
        name: the job's name (checked: :func:`check_job_name`).
    """

    snapshot_dir: str
    name: str

    def __post_init__(self) -> None:
        check_job_name(self.name)

    @property
    def path(self) -> str:
        """The job's directory."""
        return f"{self.snapshot_dir.rstrip('/')}/{self.name}"

    @property
    def local(self) -> bool:
        """Whether the job's directory is on this machine's file system."""
        return "://" not in self.snapshot_dir

    @property
    def epochs(self) -> str:
        """The directory of the epochs' state directories."""
        return f"{self.path}/{EPOCHS}"

    def epoch_dir(self, epoch: int) -> str:
        """The name of the state directory of lease ``epoch`` (on an object store an alias
        of the shared prefix: :meth:`state_dir`)."""
        return f"{self.epochs}/{epoch}"

    def state_dir(self, epoch: int) -> str:
        """Where the state of lease ``epoch`` really is: its directory locally, the job's
        shared ``<job>/state`` prefix on an object store."""
        return objectstore.shared_state_dir(self.epoch_dir(epoch))

    def checkpoint(self, epoch: int) -> str:
        """Spark's checkpoint of lease ``epoch``."""
        return f"{self.epoch_dir(epoch)}/{CHECKPOINT}"

    def store(self, epoch: int) -> str:
        """The root of the snapshot store of lease ``epoch``."""
        return f"{self.epoch_dir(epoch)}/{STORE}"

    @property
    def faults(self) -> str:
        """Markers of fired crash points."""
        return f"{self.path}/{FAULTS}"

    def _on_this_machine(self, sub: str) -> str:
        if self.local:
            return f"{self.path}/{sub}"
        return os.path.join(local_dir(self.snapshot_dir, self.name), sub)

    @property
    def logs(self) -> str:
        """Driver and protocol logs (on this machine)."""
        return self._on_this_machine(LOGS)

    @property
    def drivers(self) -> str:
        """Records of the supervised driver runs (on this machine)."""
        return self._on_this_machine(DRIVERS)

    @property
    def sessions(self) -> str:
        """Records of the session drivers that hold or held the lease (on this machine)."""
        return self._on_this_machine(SESSIONS)


def local_dir(snapshot_dir: str, name: str) -> str:
    """This machine's directory for job ``name`` of a snapshot directory that is not on a
    local file system (an object store): logs and driver records.
    ``$EPOCHAL_LOCAL_DIR``, else ``$XDG_STATE_HOME/epochal``, else ``~/.local/state/epochal``;
    under it one directory per snapshot directory (a readable name and a digest)."""
    base = os.environ.get(LOCAL_DIR_ENV) or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "epochal"
    )
    slug = re.sub(r"[^A-Za-z0-9]+", "-", snapshot_dir).strip("-")[:60]
    digest = hashlib.sha256(snapshot_dir.encode()).hexdigest()[:8]
    return os.path.join(base, f"{slug}-{digest}", name)
