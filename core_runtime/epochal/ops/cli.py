"""The ``epochal`` command: run jobs, manage them, list connectors, run the demo.

Run it as ``python -m epochal`` (always works) or ``epochal`` (the console script, when pip's
script directory is on PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from epochal.config import CONNECT_DOC, SPARK_CONNECT_ADVICE, is_spark_connect_url
from epochal.state import files
from epochal_sdk import EpochalError

DEFAULT_SNAPSHOT_DIR = os.environ.get("EPOCHAL_SNAPSHOT_DIR", "./epochal-snapshots")


def version_text() -> str:
    """``epochal <v> (epochal-sdk <v>, pyspark <v>, Python <v> at <interpreter>)``."""
    from importlib import metadata

    def installed(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    python = sys.version.split()[0]
    return (
        f"epochal {installed('epochal')} (epochal-sdk {installed('epochal-sdk')}, "
        f"pyspark {installed('pyspark')}, Python {python} at {sys.executable})"
    )


class CommandError(Exception):
    """A mistake on the command line: the message says what is wrong and what to do."""


def _connectors(args: argparse.Namespace) -> int:
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


def _run(args: argparse.Namespace) -> int:
    from epochal.control.supervisor import submit

    _refuse_spark_connect(args.master)
    config = _config(args)  # every setting checked before anything is written
    endpoint = _metrics_endpoint(args)  # a busy port, too
    sys.path.insert(0, os.getcwd())
    try:
        jobdir = submit(args.name, args.target, config, replace=args.replace)
    except BaseException:
        if endpoint is not None:
            endpoint.server_close()
        raise
    return _supervise(jobdir, force=False, args=args, endpoint=endpoint)


def _metrics_endpoint(args: argparse.Namespace) -> Any:
    """The metrics endpoint's server, bound now (``--metrics-port``), or None."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        return None
    from epochal.ops.metrics import listen

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


def _jobs(args: argparse.Namespace) -> int:
    from epochal.control.supervisor import request
    from epochal.state.checkpoint import verify_job

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
        from epochal.ops.metrics import render_prometheus

        print(render_prometheus(jobdir), end="")
        return 0
    if action in ("cancel", "suspend"):
        record = request(jobdir, action)
        print(f"{record.name}: {action} requested; status {record.status.value}")
        return 0
    if action == "resume":
        _refuse_spark_connect(jobdir.load().job_config.master)
        return _supervise(jobdir, force=args.force, args=args)
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
        print(
            f"{job.name:<24} {status['status']:<11} runs {job.run:<3} restarts "
            f"{job.restarts:<3} batch {job.progress.get('batch', '-')}  {job.target}"
        )
    return 1 if unreadable else 0


def _port(text: str) -> int:
    """``--metrics-port``: a TCP port, 0 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"{port} is not a TCP port: give 1 to 65535, or 0 for a free one"
        )
    return port


def _in_doubt(args: argparse.Namespace) -> int:
    from epochal.ops.indoubt import main

    return main(args.args)


def _demo(args: argparse.Namespace) -> int:
    from epochal.ops.demo import run

    return run(
        events=args.events,
        faults=args.faults,
        directory=args.dir,
        keep=args.keep,
        deadline=args.deadline,
    )


def parser() -> argparse.ArgumentParser:
    """The command line; every option's help says its default."""
    from epochal.ops.demo import DEFAULT_FAULTS

    top = argparse.ArgumentParser(
        prog="epochal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps --version on one line
        epilog="`python -m epochal COMMAND --help` describes a command's options.",
    )
    top.add_argument("--version", action="version", version=version_text())
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "connectors",
        help="list installed connectors, contracts, guarantees",
        description="The installed connectors (the `epochal` entry points), the contracts of "
        "their sources and sinks, the strongest guarantee of each, and packages that failed "
        "to load.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    p.set_defaults(func=_connectors)

    p = sub.add_parser(
        "run",
        help="run a job (module:function returning df.writeStream...)",
        description="Submit a job and supervise it in this process until it completes, fails, "
        "is suspended or cancelled (Ctrl-C stops the driver; `jobs resume` continues). The "
        "driver restarts from the last snapshot after restartable failures.",
    )
    p.add_argument(
        "target",
        help="module:function, importable from the current directory; the function gets a "
        "SparkSession and returns df.writeStream... (not started)",
    )
    p.add_argument(
        "--name",
        required=True,
        help="the job's name (required): letters, digits, '-' and '_'; it names the job's "
        "directory under --snapshot-dir and prefixes its transaction ids",
    )
    p.add_argument(
        "--guarantee",
        default="exactly-once",
        help="processing guarantee: exactly-once, at-least-once or none; the job refuses to "
        "start when a connector cannot keep it (default: %(default)s)",
    )
    p.add_argument(
        "--interval",
        default="1s",
        help="snapshot interval = micro-batch trigger interval, e.g. 500ms, 1s, 2m "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--available-now",
        action="store_true",
        help="process what the sources hold now, then complete (a bounded run) instead of a "
        "batch every --interval (default: off)",
    )
    p.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="run with a weaker guarantee (logged) when a connector cannot give --guarantee, "
        "instead of refusing to start (default: off)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=10,
        help="fail the job after this many restarts in a row without progress "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--split-brain-protection",
        action="store_true",
        help="restart only when a quorum (original/2 + 1) of the executors of the first run "
        "is up (default: off)",
    )
    p.add_argument(
        "--snapshot-dir",
        default=DEFAULT_SNAPSHOT_DIR,
        help="where jobs keep their snapshots, Spark checkpoint, record and logs: a directory "
        "or a pyarrow filesystem URI (default: %(default)s; $EPOCHAL_SNAPSHOT_DIR sets it)",
    )
    p.add_argument(
        "--master",
        default="local[2]",
        help="the Spark master of the job's driver: local[N], local-cluster[N,cores,MB], "
        "spark://host:7077, yarn, k8s://... (default: %(default)s); a Spark Connect URL "
        f"(sc://) is not one: see {CONNECT_DOC}",
    )
    p.add_argument(
        "--conf",
        action="append",
        metavar="KEY=VALUE",
        help="a Spark setting for the driver's session, e.g. spark.executor.memory=2g; "
        "repeat it for more (default: none)",
    )
    p.add_argument(
        "--faults",
        help="crash points to fire, for tests and demos, e.g. sink.after_decision@3 "
        "(default: none)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="start over: delete an existing job's snapshots first (default: off; without it "
        "an existing job of the same name, target and settings is continued)",
    )
    p.add_argument(
        "--standby",
        action="store_true",
        help="keep a second, warmed-up driver that takes over in seconds when the active one "
        "dies; costs a second driver's memory and some CPU (default: off)",
    )
    p.add_argument(
        "--lease-ttl",
        default="20s",
        help="how long the job's lease lasts without renewal: a driver stops itself after "
        "half of it without a renewal, another supervisor takes over after all of it "
        "(default: %(default)s)",
    )
    _metrics_options(p)
    p.set_defaults(func=_run)

    p = sub.add_parser(
        "jobs",
        help="list, status, cancel, suspend, resume, verify",
        description="Manage jobs by name, from any process that sees the snapshot directory.",
    )
    p.add_argument(
        "action",
        choices=["list", "status", "metrics", "cancel", "suspend", "resume", "verify"],
        help="list: every job; status: who runs a job (supervisor, driver, lease), its "
        "phase, its runs and its parts' metrics; metrics: the job's metrics in Prometheus "
        "text format; cancel: stop it and delete its snapshots; suspend: stop it, keep "
        "the snapshots; resume: run it again from its last snapshot, supervised by this "
        "process (after the lease of a previous supervisor expired, at once if that one is "
        "known dead); verify: check its snapshot data",
    )
    p.add_argument("name", nargs="?", help="the job's name (every action but list needs it)")
    p.add_argument(
        "--snapshot-dir",
        default=DEFAULT_SNAPSHOT_DIR,
        help="where the jobs live (default: %(default)s; $EPOCHAL_SNAPSHOT_DIR sets it)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="resume: take the job's lease over from a supervisor that still holds it, "
        "fencing that one (default: off)",
    )
    p.add_argument(
        "--json", action="store_true", help="status: print JSON instead of text (default: off)"
    )
    _metrics_options(p, "resume: ")
    p.set_defaults(func=_jobs)

    p = sub.add_parser(
        "in-doubt",
        help="list or settle a job's prepared transactions by hand (operators)",
        description="For every transactional sink of a job, through the sink contract: "
        "`epochal in-doubt list NAME --snapshot-dir DIR` shows each in-doubt transaction and "
        "the decision the job's snapshot holds for it; `epochal in-doubt settle NAME ...` "
        "commits the decided ones and rolls back the rest (refused while the job runs, unless "
        "--force). Options: --sink ID, --connector NAME (sinks the job's store does not "
        "record), -o KEY=VALUE (sink options, e.g. a password), --force. "
        "`epochal in-doubt list --help` describes them.",
        add_help=False,
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="list|settle NAME [options]")
    p.set_defaults(func=_in_doubt)

    p = sub.add_parser(
        "prepare",
        help="make this machine's drivers start faster (once per machine or image)",
        description="Prepare what makes a Spark driver of this interpreter start fast: a "
        "Spark home whose Python processes import compiled PySpark and whose restarted queries "
        "link their state store files instead of copying them (a 1 KB jar built with javac), "
        "and a JVM class-data "
        "archive of the classes a driver loads (made once in 20-40 s, kept in "
        "~/.cache/epochal; a driver without it starts ~3 s slower). Run it where jobs run, "
        "e.g. when building their image; it does nothing when all is there.",
    )
    p.add_argument("--force", action="store_true", help="make the archive again (default: off)")
    p.set_defaults(func=_prepare)

    p = sub.add_parser(
        "demo",
        help="exactly-once demo on the embedded map, with crashes",
        description="A journal of events → running totals per user in Spark state → the map "
        "sink with two-phase commit, exactly-once; the driver is killed (SIGKILL) at crash "
        "points and restarted from the last snapshot; the summary counts lost and duplicated "
        "events.",
    )
    p.add_argument(
        "--events",
        type=int,
        default=8000,
        help="events written to the journal while the job runs (default: %(default)s)",
    )
    p.add_argument(
        "--faults",
        default=DEFAULT_FAULTS,
        help="crash points that kill the driver, point@batch,...; '' for none "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--dir",
        default=None,
        help="work in this directory and keep it (default: a temporary directory, deleted "
        "at the end)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory and print where it is (default: off)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=170.0,
        help="seconds before the demo gives up waiting for the job (default: %(default)s)",
    )
    p.set_defaults(func=_demo)
    return top


def _prepare(args: argparse.Namespace) -> int:
    from epochal.startup.classdata import prepare

    archive = prepare(force=args.force)
    if archive is None:
        print("epochal prepare: no class-data archive (switched off, no JVM, or it failed)")
        return 1
    print(f"epochal prepare: drivers use {archive}")
    return 0


def _metrics_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--metrics-port``/``--metrics-host``: the supervisor's Prometheus endpoint."""
    p.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        help=f"{prefix}serve the job's metrics in Prometheus text format at "
        "http://HOST:PORT/metrics while this supervisor runs (0: a free port, printed); "
        "the driver also writes them to <job>/metrics/epochal.prom (default: no endpoint)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help=f"{prefix}the address the metrics endpoint listens on (default: %(default)s)",
    )


def _where(args: argparse.Namespace) -> str:
    """``epochal run (job 'x')``: the command, and the job when there is one."""
    command = " ".join(filter(None, [args.command, getattr(args, "action", None)]))
    name = getattr(args, "name", None)
    return f"epochal {command}" + (f" (job {name!r})" if name else "")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``epochal`` and ``python -m epochal``."""
    files.private_process()  # job records, snapshots, logs: the owner's only
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
    except CommandError as exc:
        print(f"{_where(args)}: {exc}", file=sys.stderr)
        code = 2
    except EpochalError as exc:
        print(f"{_where(args)}: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
