"""JobConfig: what a job asks for, validated when it is submitted."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from epochal.base import secrets
from epochal.base.switches import env_switch
from epochal_sdk import ConfigError, Guarantee

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: str | float | int, option: str = "duration") -> float:
    """``"500ms"``, ``"2s"``, ``"1m"`` or a number of seconds → seconds."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(
                "job", option, f"{value!r} is not a duration", "Write e.g. 1s, 500ms."
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError("job", option, f"{value!r} is negative", "Give a positive duration.")
    return seconds


JVM_LAUNCH_SETTINGS = frozenset(
    {
        "spark.driver.extrajavaoptions",
        "spark.driver.defaultjavaoptions",
        "spark.driver.extraclasspath",
        "spark.driver.extralibrarypath",
        "spark.driver.memory",
        "spark.jars.packages",
        "spark.jars.repositories",
        "spark.jars.ivy",
        "spark.jars.ivysettings",
        "spark.jars.excludes",
    }
)
"""Spark settings (lower case) that act when the driver's JVM is launched, so PySpark can
only give them on its command line (``spark-submit --conf k=v``), which every user of the
host can read (``/proc/<pid>/cmdline``). Every other setting reaches the JVM after it
started, through PySpark's gateway (:func:`epochal.startup.session.spark_session`)."""


def check_snapshot_dir(snapshot_dir: str) -> None:
    """Refuse a local snapshot directory that cannot be one: the path, or the nearest of its
    parents that exists, is a file. (A missing directory is created when a job is written;
    URIs such as ``s3://`` are checked by their store.)"""
    if "://" in str(snapshot_dir):
        return
    current = os.path.abspath(snapshot_dir)
    while not os.path.lexists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    if os.path.exists(current) and not os.path.isdir(current):
        where = "is a file" if current == os.path.abspath(snapshot_dir) else f"is under {current}"
        raise ConfigError(
            "job",
            "snapshot_dir",
            f"{snapshot_dir!r} {where}, which is not a directory",
            "Give a directory (it is created if missing) or an s3:// URI (--snapshot-dir, "
            "$EPOCHAL_SNAPSHOT_DIR, JobConfig.snapshot_dir).",
        )


def check_spark_setting(key: str, value: str) -> None:
    """Refuse a Spark setting of a job that would put a secret where others can read it:
    a secret value given as it is (the job's record, ``job.json``, keeps every setting; give
    a ``${env:NAME}`` or ``${file:PATH}`` reference, resolved where the driver builds its
    session), or any secret or reference in a setting that only acts on the JVM's command
    line (:data:`JVM_LAUNCH_SETTINGS`)."""
    option = f"spark_conf {key}"
    launch = key.strip().lower() in JVM_LAUNCH_SETTINGS
    if secrets.is_reference(value):
        if launch:
            raise ConfigError(
                "job",
                option,
                "is a setting Spark reads when the driver's JVM is launched, so its value goes "
                "on the JVM's command line, which every user of the host can read; a "
                "reference there would put what it stands for on it",
                "Give the value itself (no secret), or pass the secret another way (a file "
                "the JVM reads, an environment variable of the driver).",
            )
        return
    if not secrets.is_secret_setting(key, value):
        return
    if launch:
        raise ConfigError(
            "job",
            option,
            "holds a secret, and Spark reads this setting when the driver's JVM is launched, "
            "so it would go on the JVM's command line, which every user of the host can read",
            "Pass the secret another way: a file the JVM reads (e.g. a trust store's "
            "password file), or a setting read after the JVM started.",
        )
    raise ConfigError(
        "job",
        option,
        "holds a secret, and the job's record (job.json) would keep it in clear",
        "Give it as ${env:NAME} (an environment variable of the supervisor, and of any "
        "process that resumes the job) or ${file:PATH} (a file only its owner reads: chmod "
        "600): the driver resolves it where it builds its session and hands it to Spark "
        "after the JVM started (never on a command line); the record keeps the reference.",
    )


TIMELINE_OPTION = "epochal.timeline"
"""The query's option that turns a batch's timeline on (``true``; see
:mod:`epochal.metrics.timeline`)."""
TIMELINE_ENV = "EPOCHAL_TIMELINE"
"""The environment variable that turns the timeline on for every query of a driver (``1``)."""


def timeline_enabled(options: Mapping[str, str] | None = None) -> bool:
    """Whether the timeline is on for a query with these options (or for every query of the
    process, by :data:`TIMELINE_ENV`)."""
    opts = {k.lower(): v for k, v in (options or {}).items()}
    if opts.get(TIMELINE_OPTION.lower(), "").strip().lower() in ("true", "1", "yes"):
        return True
    return env_switch(TIMELINE_ENV, False)


CONNECT_DOC = "docs/how-to/spark-connect.md"
"""Where running epochal's formats from a Spark Connect client is explained."""
SPARK_CONNECT_ADVICE = (
    "Give a Spark master (local[2], spark://host:7077, yarn, k8s://...), or run the query from "
    "your Spark Connect client with format('epochal.<name>') and the epochal.* options: see "
    f"{CONNECT_DOC}"
)
"""What to do instead of supervising a job on Spark Connect (the CLI and JobConfig say it)."""


def is_spark_connect_url(master: str) -> bool:
    """Whether ``master`` is a Spark Connect address (``sc://``), which no supervised job can
    run on: the supervisor starts its own driver."""
    return str(master).strip().lower().startswith("sc://")


@dataclass
class JobConfig:
    """How a job runs.

    Args:
        guarantee: the processing guarantee asked for; the effective one is the weakest of this,
            each source's and each sink's.
        snapshot_interval: seconds between snapshots (the micro-batch trigger interval).
        available_now: process what is available, then finish (a bounded run), instead of
            triggering every ``snapshot_interval``.
        allow_downgrade: run with a weaker guarantee when a connector cannot give the one asked
            for (logged), instead of refusing to start.
        auto_restart: restart after restartable failures.
        max_restarts: give up after this many restarts in a row without progress.
        restart_backoff: the wait before the second restart in a row without progress
            (seconds; the first restart is at once); doubles with each further one, up to
            ``max_restart_backoff``.
        split_brain_protection: restart only with a quorum (``original/2 + 1``) of the executors
            the job first ran with.
        snapshot_dir: where snapshots and job records live (a path, or a URI of a scheme listed in
            docs/how-to/deployment.md, "Where snapshots live").
        master: the Spark master (``local[2]``, ``local-cluster[2,1,1024]``, a cluster URL).
        spark_conf: extra Spark settings. A secret value (a setting named like Spark's
            ``spark.redaction.regex``, ``secret|password|token|access.key``, or a value with a
            password in it) must be a ``${env:NAME}`` or ``${file:PATH}`` reference: the
            job's record keeps the reference, the driver resolves it and gives it to Spark
            after the JVM started, off every command line (:func:`check_spark_setting`).
        faults: crash points to fire (tests and the demo), e.g. ``"sink.after_decision@3"``.
        lease_ttl: seconds a supervisor's lease lasts without renewal. A driver stops itself
            when its lease was not renewed for half of it; another supervisor takes the job
            over only after all of it (or at once when it knows the old one is dead).
        standby: keep a second, warmed-up driver waiting to take over when the active one
            dies (recovery in seconds; costs a second JVM's memory and some CPU).
    """

    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    snapshot_interval: float = 1.0
    available_now: bool = False
    allow_downgrade: bool = False
    auto_restart: bool = True
    max_restarts: int = 10
    restart_backoff: float = 1.0
    max_restart_backoff: float = 30.0
    split_brain_protection: bool = False
    snapshot_dir: str = "./epochal-snapshots"
    master: str = "local[2]"
    spark_conf: dict[str, str] = field(default_factory=dict)
    faults: str = ""
    lease_ttl: float = 20.0
    standby: bool = False

    def __post_init__(self) -> None:
        try:
            self.guarantee = Guarantee.parse(self.guarantee)
        except ValueError as exc:
            raise ConfigError(
                "job", "guarantee", str(exc), "Use exactly-once, at-least-once or none."
            ) from None
        try:
            self.max_restarts = int(self.max_restarts)
        except (TypeError, ValueError):
            raise ConfigError(
                "job", "max_restarts", f"{self.max_restarts!r} is not a number", "Give 0 or more."
            ) from None
        self.snapshot_interval = parse_duration(self.snapshot_interval, "snapshot_interval")
        self.restart_backoff = parse_duration(self.restart_backoff, "restart_backoff")
        self.max_restart_backoff = parse_duration(self.max_restart_backoff, "max_restart_backoff")
        self.lease_ttl = parse_duration(self.lease_ttl, "lease_ttl")
        if self.lease_ttl < 2:
            raise ConfigError(
                "job",
                "lease_ttl",
                f"{self.lease_ttl}s is too short to renew a lease in",
                "Give 2s or more (default 20s).",
            )
        if self.snapshot_interval <= 0:
            raise ConfigError(
                "job", "snapshot_interval", "must be above zero", "Give e.g. 1s or 500ms."
            )
        if self.max_restarts < 0:
            raise ConfigError("job", "max_restarts", "is negative", "Give 0 or more.")
        if is_spark_connect_url(self.master):
            raise ConfigError(
                "job",
                "master",
                f"{self.master!r} is a Spark Connect URL, but a supervised job runs its own "
                "Spark driver",
                SPARK_CONNECT_ADVICE,
            )
        if not str(self.snapshot_dir).strip():
            raise ConfigError("job", "snapshot_dir", "is empty", "Give a directory or a URI.")
        check_snapshot_dir(str(self.snapshot_dir))
        if not isinstance(self.spark_conf, dict):
            raise ConfigError(
                "job", "spark_conf", "is not a mapping", "Give {'spark.x': 'value', ...}."
            )
        for key, value in self.spark_conf.items():
            check_spark_setting(str(key), str(value))
        if self.faults:
            from epochal.base.fault_plan import FaultPlan

            FaultPlan.parse(self.faults)  # fail at submit on a typo, not in the middle of a run

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (the guarantee by its label)."""
        out = asdict(self)
        out["guarantee"] = self.guarantee.label
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        """The inverse of :meth:`to_dict`; unknown keys are an error that names them."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                "job", unknown[0], "is not a JobConfig setting", f"Use: {', '.join(sorted(known))}."
            )
        return cls(**data)
