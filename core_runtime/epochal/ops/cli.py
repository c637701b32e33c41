"""The ``epochal`` command: run jobs, manage them, list connectors, run the demo.

Run it as ``python -m epochal`` (always works) or ``epochal`` (the console script, when pip's
script directory is on PATH).
"""

from __future__ import annotations

import argparse
import sys

from epochal.base import files
from epochal.config import CONNECT_DOC
from epochal.ops import commands
from epochal.ops.commands import DEFAULT_SNAPSHOT_DIR, CommandError
from epochal_sdk import EpochalError


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


def parser() -> argparse.ArgumentParser:
    """The command line; every option's help says its default."""
    from epochal.ops.demo import DEFAULT_EVENTS, DEFAULT_FAULTS

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
    p.set_defaults(func=commands.connectors)

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
        "or a URI of a scheme listed in docs/how-to/deployment.md, 'Where snapshots live' "
        "(default: %(default)s; $EPOCHAL_SNAPSHOT_DIR sets it)",
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
        help="start over: settle what the existing job left in doubt (commit the decided, "
        "roll back the rest), then delete its snapshots; refused, with the transactions and "
        "the command to settle them, when a sink cannot be reached (default: off; without it "
        "an existing job of the same name, target and settings is continued)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --replace, or over a cancelled job: start over even when what the old job "
        "left in doubt cannot be settled, leaving it prepared (the output lists it and the "
        "command to settle it later) (default: off)",
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
    p.set_defaults(func=commands.run)

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
        "text format; cancel: stop it, settle what it left in doubt and delete its snapshots "
        "(refused, with the transactions and the command to settle them, when a sink cannot "
        "be reached); suspend: stop it, settle what the stop left in doubt (a sink that "
        "cannot be reached is settled by the next run), keep "
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
        "fencing that one; cancel: delete the snapshots even when what the job left in doubt "
        "cannot be settled, leaving it prepared (the output lists it and the command to "
        "settle it later) (default: off)",
    )
    p.add_argument(
        "--json", action="store_true", help="status: print JSON instead of text (default: off)"
    )
    _metrics_options(p, "resume: ")
    p.set_defaults(func=commands.jobs)

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
    p.set_defaults(func=commands.in_doubt)

    p = sub.add_parser(
        "prepare",
        help="make this machine's drivers start faster (once per machine or image)",
        description="Prepare what makes a Spark driver of this interpreter start fast: a "
        "Spark home whose Python processes import compiled PySpark and whose restarted queries "
        "link their state store files instead of copying them (a 1 KB jar built with javac), "
        "and a JVM class-data "
        "archive of the classes a driver loads (made once in 20-40 s, kept in "
        "~/.cache/epochal, where a new one removes all but the three used last; a driver "
        "without it starts ~3 s slower). Run it where jobs run, "
        "e.g. when building their image; it does nothing when all is there.",
    )
    p.add_argument("--force", action="store_true", help="make the archive again (default: off)")
    p.set_defaults(func=commands.prepare)

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
        default=DEFAULT_EVENTS,
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
    p.set_defaults(func=commands.demo)
    return top


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
