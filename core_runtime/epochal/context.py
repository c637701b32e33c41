"""JobContext: who is running (job, run, guarantee, store) as seen by the connectors.

The driver process sets it in its environment before Spark starts, so the Python workers of
the driver JVM inherit it. The data source captures it on the driver and carries it, pickled,
to the executors. A query started without ``epochal run`` can give the same through options
(``epochal.job``, ``epochal.snapshotDir``, ``epochal.guarantee``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from epochal.faults import FaultPlan
from epochal.store import SnapshotStore
from epochal_sdk import ConfigError, Guarantee

ENV_JOB = "EPOCHAL_JOB"
ENV_JOB_DIR = "EPOCHAL_JOB_DIR"
ENV_GUARANTEE = "EPOCHAL_GUARANTEE"
ENV_ALLOW_DOWNGRADE = "EPOCHAL_ALLOW_DOWNGRADE"
ENV_RUN = "EPOCHAL_RUN"
ENV_LEASE_EPOCH = "EPOCHAL_LEASE_EPOCH"
ENV_FAULTS = "EPOCHAL_FAULTS"


def job_dir(snapshot_dir: str, job: str) -> str:
    """Where one job's checkpoint, store, records and logs live."""
    return f"{snapshot_dir.rstrip('/')}/{job}"


@dataclass(frozen=True)
class JobContext:
    """What a connector adapter needs to know about the job it runs in."""

    job: str = "default"
    job_dir: str | None = None
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    allow_downgrade: bool = False
    run: int = 0
    lease_epoch: int = 0
    faults: FaultPlan = field(default_factory=FaultPlan)
    supervised: bool = False

    @classmethod
    def current(cls, options: Mapping[str, str] | None = None) -> JobContext:
        """The context from the environment of an epochal driver, overridden by options."""
        opts = {k.lower(): v for k, v in (options or {}).items()}
        env = os.environ
        job = opts.get("epochal.job") or env.get(ENV_JOB) or "default"
        directory = env.get(ENV_JOB_DIR)
        if opts.get("epochal.snapshotdir"):
            directory = job_dir(opts["epochal.snapshotdir"], job)
        guarantee = Guarantee.parse(
            opts.get("epochal.guarantee") or env.get(ENV_GUARANTEE) or "exactly-once"
        )
        run = int(env.get(ENV_RUN) or 0) or int(time.time())
        faults_text = opts.get("epochal.faults") or env.get(ENV_FAULTS, "")
        marker_dir = f"{directory}/faults" if directory else None
        return cls(
            job=job,
            job_dir=directory,
            guarantee=guarantee,
            allow_downgrade=(env.get(ENV_ALLOW_DOWNGRADE) == "1")
            or opts.get("epochal.allowdowngrade", "").lower() == "true",
            run=run,
            lease_epoch=int(env.get(ENV_LEASE_EPOCH) or 0),
            faults=FaultPlan.parse(faults_text, marker_dir),
            supervised=ENV_JOB in env,
        )

    def store(self, needed_by: str) -> SnapshotStore:
        """The job's snapshot store; a clear error if the query runs without one."""
        if not self.job_dir:
            raise ConfigError(
                needed_by,
                "epochal.snapshotDir",
                "there is no snapshot store to keep this connector's part of the snapshot",
                "Run the query with `epochal run` / epochal.Job, "
                "or set .option('epochal.snapshotDir', <directory>)",
            )
        return SnapshotStore(f"{self.job_dir}/store")

    def reach(self, point: str, batch: int | None = None) -> None:
        """A protocol step: fire the crash point if the fault plan names it."""
        self.faults.reach(point, batch)
