"""What a job's record is asked outside a running supervisor: a job submitted (its record
written, not run), a cancel or a suspend requested (done here when no supervisor holds the
job's lease), and whether a job that says it runs has lost its supervisor."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from epochal.config import JobConfig
from epochal.spark import features
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.locks import JobError
from epochal_sdk import ConfigError


def _target_name(target: str | Callable[..., Any]) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise JobError(
            f"{target!r} cannot be imported by the driver process: pass 'module:function' "
            "for a function defined at the top level of an importable module"
        )
    return f"{module}:{qualname}"


def submit(
    name: str,
    target: str | Callable[..., Any],
    config: JobConfig | None = None,
    *,
    replace: bool = False,
    force: bool = False,
    report: Callable[[str], None] | None = None,
) -> JobDirectory:
    """Create (or, with ``replace``, re-create) the record of a job without running it.
    A job that needs what the installed pyspark lacks is refused here, before any driver
    starts (:func:`epochal.spark.features.refusals`).

    A job created anew (no record, ``replace``, or the record of a cancelled job) gets a
    new incarnation (:meth:`JobRecord.create`), so its ids never collide with a
    predecessor's of the same name. Before a predecessor's snapshots are deleted, what it
    left in doubt is settled (:func:`~epochal.parts.settling.settle_before_deleting`; each
    sink's outcome goes to ``report``); when that cannot be done the submit is refused with
    the transactions and the command that settles them, unless ``force``."""
    config = config or JobConfig()
    refused = features.refusals(available_now=config.available_now)
    if refused:
        raise JobError(f"job {name!r} cannot run on this pyspark: " + "; ".join(refused))
    untested = features.untested_release()
    if untested and report is not None:
        report(f"epochal: {untested}")
    jobdir = JobDirectory(config.snapshot_dir, name)
    target_name = _target_name(target)
    try:
        return _submit(jobdir, target_name, config, replace, force, report)
    except OSError as exc:  # any file system: a directory that cannot be created or written
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"job {name!r}",
            "snapshot_dir",
            f"{config.snapshot_dir!r} cannot hold the job: {reason}"
            + (f" ({exc.filename})" if exc.filename else ""),
            "Give a directory this user can create and write (a missing one is created), "
            "or an s3:// URI (--snapshot-dir, $EPOCHAL_SNAPSHOT_DIR, JobConfig.snapshot_dir).",
        ) from None


def _submit(
    jobdir: JobDirectory,
    target_name: str,
    config: JobConfig,
    replace: bool,
    force: bool,
    report: Callable[[str], None] | None,
) -> JobDirectory:
    from epochal.parts.settling import settle_before_deleting

    name = jobdir.name
    previous = ""
    if jobdir.exists():
        existing = jobdir.load()
        if replace or existing.status == JobStatus.CANCELLED:
            if lease_live(jobdir):
                raise JobError(
                    f"job {name!r} is running (its lease is held): cancel it first "
                    f"(`python -m epochal jobs cancel {name} --snapshot-dir "
                    f"{config.snapshot_dir}`), then start it over"
                )
            settle_before_deleting(
                jobdir, "start the job over", force, report, retry="run it with --replace"
            )
            jobdir.delete_snapshots()
            previous = existing.incarnation
        elif existing.target != target_name or existing.config != config.to_dict():
            raise JobError(
                f"job {name!r} already exists with another target or config; resume it with "
                "`python -m epochal jobs resume`, cancel it first, or submit under another name"
            )
        else:
            return jobdir
    record = JobRecord.create(
        name,
        target_name,
        config.to_dict(),
        previous,
        python_path=[os.getcwd(), *[p for p in sys.path if p and os.path.isdir(p)][:20]],
    )
    jobdir.save(record)
    return jobdir


def request(
    jobdir: JobDirectory,
    what: str,
    *,
    force: bool = False,
    report: Callable[[str], None] | None = None,
) -> JobRecord:
    """Ask the job to cancel or suspend. If no supervisor runs it, do it here: a cancel
    settles what the job left in doubt before it deletes the snapshots
    (:func:`~epochal.parts.settling.settle_before_deleting`, outcomes to ``report``), and is
    refused, the job left as it was, when that cannot be done, unless ``force``."""
    from epochal.parts.settling import settle_before_deleting

    if not jobdir.load().target:
        raise JobError(
            f"job {jobdir.name!r} runs in a driver's own SparkSession (not under `epochal "
            f"run`): nothing here can {what} it. Stop that application (and its restarter); "
            "its lease is released when its driver ends"
        )
    if what == "cancel" and not lease_live(jobdir):
        settle_before_deleting(jobdir, "cancel the job", force, report, retry="cancel it")
    with jobdir.update() as record:
        if record.status.finished and what != "cancel":
            raise JobError(f"job {record.name!r} is {record.status.value}; nothing to {what}")
        record.requested = what
        live = lease_live(jobdir)
        if not live:
            if what == "cancel":
                record.status = JobStatus.CANCELLED
            elif what == "suspend":
                record.status = JobStatus.SUSPENDED
            record.requested = None
    if not live and what == "cancel":
        jobdir.delete_snapshots()
    return jobdir.load()


def lease_live(jobdir: JobDirectory) -> bool:
    """Whether a supervisor holds the job's lease now (renewed within its TTL, alive)."""
    lease = jobdir.lease.read()
    return bool(lease and lease.live)


def orphaned(jobdir: JobDirectory, record: JobRecord) -> bool:
    """Whether the record says the job runs but no supervisor holds its lease: its
    supervisor died (resume it with ``python -m epochal jobs resume NAME``)."""
    return record.status.live and not lease_live(jobdir)
