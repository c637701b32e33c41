"""The ``epochal`` command's commands: what each one does once its arguments are parsed
(:mod:`epochal.ops.cli` parses them)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from epochal.config import CONNECT_DOC, SPARK_CONNECT_ADVICE, is_spark_connect_url
from epochal_sdk import EpochalError

DEFAULT_SNAPSHOT_DIR = os.environ.get("EPOCHAL_SNAPSHOT_DIR", "./epochal-snapshots")


class CommandError(Exception):
    """A mistake on the command line: the message says what is wrong and what to do."""


def connectors(args: argparse.Namespace) -> int:
    """``epochal connectors``: the installed connectors, their parts and guarantees."""
    from epochal.parts import registry

    found = registry.connectors()
    code = 1 if registry.BROKEN else 0  # an installed connector that fails to load: an error
    if args.json:
        for name, problem in registry.BROKEN.items():
            print(f"error: connector {name!r} failed to load: {problem}", file=sys.stderr)
        print(json.dumps({n: _describe(c) for n, c in found.items()}, indent=2))
        return code
    for name, problem in registry.BROKEN.items():
        print(f"{name}  (BROKEN: failed to load: {problem})")
    if not found and not registry.BROKEN:
        print("no connectors installed (pip install epochal-map, epochal-kafka, ...)")
    for name, cls in found.items():
        info = _describe(cls)
        print(f"{name}  ({info['module']})")
        if info["description"]:
            print(f"    {info['description']}")
        print(f"    format: epochal.{name}")
        for part, contracts in info["contracts"].items():
            print(f"    {part}: {', '.join(contracts)} — up to {info['guarantees'][part]}")
    return code


def _describe(cls: Any) -> dict[str, Any]:
    from epochal_sdk.connector import CONTRACTS

    contracts = {}
    for part, klass in (("source", cls.source_class), ("sink", cls.sink_class)):
        if klass is not None:
            contracts[part] = [c.__name__ for c in CONTRACTS if issubclass(klass, c)]
    return {
        "module": cls.__module__,
        "description": cls.description,
        "contracts": contracts,
        "guarantees": {k: v.label for k, v in cls.guarantees().items()},
    }


def _config(args: argparse.Namespace) -> Any:
    from epochal.config import JobConfig

    conf = {}
    for item in args.conf or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(
                f"--conf {item!r} is not KEY=VALUE. Write e.g. --conf spark.executor.memory=2g"
            )
        conf[key.strip()] = value
    return JobConfig(
        guarantee=args.guarantee,
        snapshot_interval=args.interval,
        available_now=args.available_now,
        allow_downgrade=args.allow_downgrade,
        max_restarts=args.max_restarts,
        split_brain_protection=args.split_brain_protection,
        snapshot_dir=args.snapshot_dir,
        master=args.master,
        spark_conf=conf,
        faults=args.faults or "",
        lease_ttl=args.lease_ttl,
        standby=args.standby,
    )


def _say(line: str) -> None:
    """What a command reports on the way (settling a job's transactions, ...)."""
    print(line, file=sys.stderr, flush=True)


def _progress(line: dict[str, Any]) -> None:
    print(
        f"[{line['job']}] run {line['run']} batch {line['batch']}: {line['rows']} rows", flush=True
    )


def _refuse_spark_connect(master: str) -> None:
    """``epochal run`` starts and supervises its own Spark driver: Spark Connect is no
    master it can start, and with ``SPARK_REMOTE`` set the driver's session would fail."""
    if is_spark_connect_url(master):
        raise CommandError(
            f"--master {master!r} is a Spark Connect URL, but the supervisor runs its own Spark "
            f"driver. {SPARK_CONNECT_ADVICE}"
        )
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        raise CommandError(
            f"SPARK_REMOTE={remote} is set (Spark Connect), but the supervisor runs its own Spark "
            "driver, whose session cannot also be a Spark Connect client. Unset it for this "
            f"command (env -u SPARK_REMOTE python -m epochal ...); see {CONNECT_DOC}"
        )


def run(args: argparse.Namespace) -> int:
    """``epochal run``: submit a job and supervise it until it ends."""
    from epochal.control.job_requests import submit

    _refuse_spark_connect(args.master)
    config = _config(args)  # every setting checked before anything is written
    endpoint = _metrics_endpoint(args)  # a busy port, too
    sys.path.insert(0, os.getcwd())
    try:
        _check_target(args.target)  # a target that does not import: before a record or a JVM
        jobdir = submit(
            args.name, args.target, config, replace=args.replace, force=args.force, report=_say
        )
    except BaseException:
        if endpoint is not None:
            endpoint.server_close()
        raise
    return _supervise(jobdir, force=False, args=args, endpoint=endpoint)


def _check_target(target: str) -> None:
    """Refuse a ``module:function`` target that the driver could not call: its module does
    not import here (the driver imports it with the same path: the current directory first),
    or it has no such function. Checked before the job's record is written, so a typo costs
    neither a driver's JVM start nor a FAILED job that blocks the name."""
    import importlib
    import traceback

    module_name, sep, function = target.partition(":")
    if not sep or not module_name or not function:
        raise CommandError(
            f"target {target!r} is not 'module:function'. Write e.g. `epochal run "
            "my_pipeline:build`, where my_pipeline.py (in the current directory or on "
            "PYTHONPATH) defines build(spark)"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        frames = [  # the module's own frames, not this function's nor importlib's
            f
            for f in traceback.extract_tb(exc.__traceback__)[1:]
            if "<frozen" not in f.filename and f.filename != importlib.__file__
        ]
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        raise CommandError(
            f"target {target!r}: module {module_name!r} does not import: "
            f"{type(exc).__name__}: {exc}{where}. Nothing was "
            f"written. Run `epochal run` from the directory that holds {module_name}.py, or "
            "put its directory on PYTHONPATH, and fix what stops its import"
        ) from None
    found: Any = module
    for part in function.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise CommandError(
            f"target {target!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) "
            f"has no function {function!r}. Nothing was written. Name the function that "
            "builds the query: module:function"
        )


def _metrics_endpoint(args: argparse.Namespace) -> Any:
    """The metrics endpoint's server, bound now (``--metrics-port``), or None."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        return None
    from epochal.metrics.endpoint import listen

    return listen(port, getattr(args, "metrics_host", None) or "127.0.0.1")


EXIT_TAKEN_OVER = 3
"""Exit code of a supervisor whose job was taken over by another supervisor."""


def _supervise(
    jobdir: Any, force: bool, args: argparse.Namespace | None = None, endpoint: Any = None
) -> int:
    from epochal.control.supervisor import Supervisor
    from epochal.state.jobs import JobStatus

    if endpoint is None and args is not None:
        endpoint = _metrics_endpoint(args)
    supervisor = Supervisor(jobdir, force=force, on_progress=_progress, metrics_endpoint=endpoint)
    try:
        record = supervisor.run()
        if supervisor.lost.is_set():
            print(
                f"[{jobdir.name}] another supervisor took this job over (its lease moved on); "
                "this one stopped its drivers and exits. `python -m epochal jobs status "
                f"{jobdir.name} --snapshot-dir {jobdir.snapshot_dir}` shows who runs it.",
                file=sys.stderr,
            )
            return EXIT_TAKEN_OVER
    except KeyboardInterrupt:
        supervisor.stop_child()
        print(
            f"[{jobdir.name}] interrupted: the driver was stopped; resume with "
            f"`epochal jobs resume {jobdir.name}`",
            file=sys.stderr,
        )
        return 130
    if record.status in (JobStatus.COMPLETED, JobStatus.SUSPENDED, JobStatus.CANCELLED):
        return 0
    where = f"{jobdir.name} --snapshot-dir {jobdir.snapshot_dir}"
    if record.status == JobStatus.FAILED:
        hint = (
            f"the job FAILED; its snapshots are kept. Driver logs: {jobdir.logs}. Fix the "
            f"cause, then `python -m epochal jobs resume {where}` continues from the last "
            "snapshot (or run it again with --replace to start over)."
        )
    else:
        hint = (
            f"this supervisor stopped with the job {record.status.value}; "
            f"`python -m epochal jobs status {where}` shows who runs it and why."
        )
    print(f"[{jobdir.name}] {hint}", file=sys.stderr)
    return 1


def _jobdir(args: argparse.Namespace) -> Any:
    from epochal.state.jobs import JobDirectory

    return JobDirectory(args.snapshot_dir, args.name)


def jobs(args: argparse.Namespace) -> int:
    """``epochal jobs ...``: list, status, metrics, verify, resume, suspend or cancel jobs."""
    from epochal.control.job_requests import request
    from epochal.state.manifests import verify_job

    action = args.action
    if action == "list":
        return _list(args)
    if not args.name:
        raise CommandError(
            f"give the job's name: `python -m epochal jobs {action} NAME "
            f"--snapshot-dir {args.snapshot_dir}`; `python -m epochal jobs list "
            f"--snapshot-dir {args.snapshot_dir}` shows the jobs there"
        )
    jobdir = _jobdir(args)
    if action == "status":
        from epochal.ops.status import job_status, render

        status = job_status(jobdir)
        print(json.dumps(status, indent=2, default=str) if args.json else render(status))
        return 0
    if action == "metrics":
        from epochal.metrics.exposition import render_prometheus

        print(render_prometheus(jobdir), end="")
        return 0
    if action in ("cancel", "suspend"):
        record = request(jobdir, action, force=args.force, report=_say)
        print(f"{record.name}: {action} requested; status {record.status.value}")
        return 0
    if action == "resume":
        _refuse_spark_connect(jobdir.load().job_config.master)
        return _supervise(jobdir, force=args.force, args=args)
    if action == "verify":
        problems = verify_job(jobdir, full=True)
        if problems:
            print(f"{args.name}: {len(problems)} problem(s):")
            for p in problems:
                print(f"  - {p}")
            return 1
        checked, _ = jobdir.store.verify()
        print(f"{args.name}: snapshot sound ({checked} entries verified)")
        return 0
    raise CommandError(f"unknown action {action!r}; see `python -m epochal jobs --help`")


UNREADABLE = "UNREADABLE"
"""What ``jobs list`` shows for a job whose record or lease cannot be read."""


def _list(args: argparse.Namespace) -> int:
    """``jobs list``: one line per job; a job whose record or lease cannot be read is shown
    as UNREADABLE with the path, the problem and what to do (never left out), and the others
    are listed all the same. Exit code 1 when some job is unreadable."""
    from epochal.ops.status import job_status
    from epochal.state.jobs import UnreadableJob, scan_jobs

    found = scan_jobs(args.snapshot_dir)
    if not found:
        print(f"no jobs in {args.snapshot_dir}")
    unreadable = 0
    for job in found:
        if isinstance(job, UnreadableJob):
            unreadable += 1
            print(f"{job.name:<24} {UNREADABLE:<11} {job.path}: {job.problem}. {job.fix}")
            continue
        jobdir = _jobdir(argparse.Namespace(**{**vars(args), "name": job.name}))
        try:
            status = job_status(jobdir, job)
        except (EpochalError, OSError) as exc:  # the lease: the error says what to do
            unreadable += 1
            print(f"{job.name:<24} {UNREADABLE:<11} {exc}")
            continue
        at = job.progress.get("at")
        last = time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(float(at))) if at else ""
        print(
            f"{job.name:<24} {status['status']:<11} runs {job.run:<3} restarts "
            f"{job.restarts:<3} batch {job.progress.get('batch', '-')}{last}  "
            f"{job.target or '(its own session)'}"
        )
    return 1 if unreadable else 0


def in_doubt(args: argparse.Namespace) -> int:
    """``epochal in-doubt``: a job's in-doubt transactions (:mod:`epochal.ops.indoubt`)."""
    from epochal.ops.indoubt import main

    return main(args.args)


def demo(args: argparse.Namespace) -> int:
    """``epochal demo``: the exactly-once demo (see :mod:`epochal.ops.demo`)."""
    from epochal.ops.demo import run

    return run(
        events=args.events,
        faults=args.faults,
        directory=args.dir,
        keep=args.keep,
        deadline=args.deadline,
    )


def prepare(args: argparse.Namespace) -> int:
    """``epochal prepare``: make the JVM class-data archive for faster driver starts."""
    from epochal.startup.classdata import prepare

    archive = prepare(force=args.force)
    if archive is None:
        print("epochal prepare: no class-data archive (switched off, no JVM, or it failed)")
        return 1
    print(f"epochal prepare: drivers use {archive}")
    return 0
