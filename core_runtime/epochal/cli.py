"""The ``epochal`` command: run jobs, manage them, list connectors, run the demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from epochal_sdk import EpochalError

DEFAULT_SNAPSHOT_DIR = os.environ.get("EPOCHAL_SNAPSHOT_DIR", "./epochal-snapshots")


def _connectors(args: argparse.Namespace) -> int:
    from epochal import registry

    found = registry.connectors()
    if args.json:
        print(json.dumps({n: _describe(c) for n, c in found.items()}, indent=2))
        return 0
    if not found:
        print("no connectors installed (pip install epochal-map, epochal-kafka, ...)")
        return 0
    for name, problem in registry.BROKEN.items():
        print(f"{name}  (BROKEN: failed to load: {problem})")
    for name, cls in found.items():
        info = _describe(cls)
        print(f"{name}  ({info['module']})")
        if info["description"]:
            print(f"    {info['description']}")
        print(f"    format: epochal.{name}")
        for part, contracts in info["contracts"].items():
            print(f"    {part}: {', '.join(contracts)} — up to {info['guarantees'][part]}")
    return 0


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

    conf = dict(item.split("=", 1) for item in args.conf or [])
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
    )


def _progress(line: dict[str, Any]) -> None:
    print(
        f"[{line['job']}] run {line['run']} batch {line['batch']}: {line['rows']} rows", flush=True
    )


def _run(args: argparse.Namespace) -> int:
    from epochal.supervisor import submit

    sys.path.insert(0, os.getcwd())
    jobdir = submit(args.name, args.target, _config(args), replace=args.replace)
    return _supervise(jobdir, force=False)


def _supervise(jobdir: Any, force: bool) -> int:
    from epochal.jobs import JobStatus
    from epochal.supervisor import Supervisor

    supervisor = Supervisor(jobdir, force=force, on_progress=_progress)
    try:
        record = supervisor.run()
    except KeyboardInterrupt:
        supervisor.stop_child()
        print(
            f"[{jobdir.name}] interrupted: the driver was stopped; resume with "
            f"`epochal jobs resume {jobdir.name}`",
            file=sys.stderr,
        )
        return 130
    return (
        0 if record.status in (JobStatus.COMPLETED, JobStatus.SUSPENDED, JobStatus.CANCELLED) else 1
    )


def _jobdir(args: argparse.Namespace) -> Any:
    from epochal.jobs import JobDirectory

    return JobDirectory(args.snapshot_dir, args.name)


def _jobs(args: argparse.Namespace) -> int:
    from epochal.jobs import list_jobs
    from epochal.supervisor import request
    from epochal.verify import verify_job

    action = args.action
    if action == "list":
        records = list_jobs(args.snapshot_dir)
        if not records:
            print(f"no jobs in {args.snapshot_dir}")
        for r in records:
            print(
                f"{r.name:<24} {r.status.value:<11} runs {r.run:<3} restarts {r.restarts:<3} "
                f"batch {r.progress.get('batch', '-')}  {r.target}"
            )
        return 0
    if not args.name:
        raise SystemExit(f"epochal jobs {action}: give the job's name")
    jobdir = _jobdir(args)
    if action == "status":
        record = jobdir.load()
        out = record.to_json()
        out["updated_ago_s"] = round(time.time() - record.updated, 1)
        print(json.dumps(out, indent=2, default=str))
        return 0
    if action in ("cancel", "suspend"):
        record = request(jobdir, action)
        print(f"{record.name}: {action} requested; status {record.status.value}")
        return 0
    if action == "resume":
        jobdir.load()
        return _supervise(jobdir, force=args.force)
    if action == "verify":
        problems = verify_job(jobdir)
        if problems:
            print(f"{args.name}: {len(problems)} problem(s):")
            for p in problems:
                print(f"  - {p}")
            return 1
        checked, _ = jobdir.store.verify()
        print(f"{args.name}: snapshot sound ({checked} entries verified)")
        return 0
    raise SystemExit(f"unknown action {action}")


def _in_doubt(args: argparse.Namespace) -> int:
    import importlib

    try:
        tool = importlib.import_module(f"epochal_{args.connector}.indoubt")
    except ModuleNotFoundError:
        print(
            f"epochal: connector {args.connector!r} has no in-doubt tool "
            f"(is epochal-{args.connector} installed?)",
            file=sys.stderr,
        )
        return 2
    return int(tool.main(args.args) or 0)


def _demo(args: argparse.Namespace) -> int:
    from epochal.demo import run

    return run(
        events=args.events,
        faults=args.faults,
        directory=args.dir,
        keep=args.keep,
        deadline=args.deadline,
    )


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(prog="epochal", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("connectors", help="list installed connectors, contracts, guarantees")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_connectors)

    p = sub.add_parser("run", help="run a job (module:function returning df.writeStream...)")
    p.add_argument("target", help="module:function; it gets a SparkSession")
    p.add_argument("--name", required=True)
    p.add_argument(
        "--guarantee", default="exactly-once", help="exactly-once | at-least-once | none"
    )
    p.add_argument("--interval", default="1s", help="snapshot (trigger) interval, e.g. 1s")
    p.add_argument(
        "--available-now", action="store_true", help="process what is there now, then finish"
    )
    p.add_argument("--allow-downgrade", action="store_true")
    p.add_argument("--max-restarts", type=int, default=10)
    p.add_argument("--split-brain-protection", action="store_true")
    p.add_argument("--snapshot-dir", default=DEFAULT_SNAPSHOT_DIR)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--conf", action="append", help="Spark setting key=value (repeatable)")
    p.add_argument("--faults", help="crash points to fire, e.g. sink.after_decision@3 (tests)")
    p.add_argument("--replace", action="store_true", help="start over: delete the job's snapshots")
    p.set_defaults(func=_run)

    p = sub.add_parser("jobs", help="list, status, cancel, suspend, resume, verify")
    p.add_argument("action", choices=["list", "status", "cancel", "suspend", "resume", "verify"])
    p.add_argument("name", nargs="?")
    p.add_argument("--snapshot-dir", default=DEFAULT_SNAPSHOT_DIR)
    p.add_argument("--force", action="store_true", help="resume: take the lease over")
    p.set_defaults(func=_jobs)

    p = sub.add_parser(
        "in-doubt",
        help="list or settle a job's prepared transactions by hand (operators)",
        description="Delegates to the connector's operator tool, e.g. "
        "`epochal in-doubt jdbc list --dsn URL --job NAME --snapshot-dir DIR`.",
    )
    p.add_argument("connector", help="the connector whose transactions to inspect (jdbc)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="list|settle and the tool's options")
    p.set_defaults(func=_in_doubt)

    p = sub.add_parser("demo", help="exactly-once demo on the embedded map, with crashes")
    p.add_argument("--events", type=int, default=6000)
    p.add_argument("--faults", default=None)
    p.add_argument("--dir", default=None, help="keep the demo's files here")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--deadline", type=float, default=170.0, help="seconds before giving up")
    p.set_defaults(func=_demo)
    return top


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    args = parser().parse_args(argv)
    if getattr(args, "faults", None) is None and args.command == "demo":
        from epochal.demo import DEFAULT_FAULTS

        args.faults = DEFAULT_FAULTS
    try:
        code = args.func(args)
    except EpochalError as exc:
        print(f"epochal: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
