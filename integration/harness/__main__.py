"""Command line of the harness.

``python -m integration.harness prefetch``   fetch Kafka jars + Artemis into the cache
``python -m integration.harness check``      report which prerequisites are present
``python -m integration.harness serve kafka|postgres|jms``  run one server until Ctrl-C
``python -m integration.harness images``     build the servers' container images (a Docker
engine must answer; see integration.harness.images)
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import threading
import time
from collections.abc import Callable

from ._process import HarnessError, cleanup_all
from .cache import artemis_version, cache_dir, kafka_version, prefetch
from .server import Server


def _prefetch(args: argparse.Namespace) -> int:
    started = time.monotonic()
    print(f"cache directory: {cache_dir()}")
    print(
        f"ensuring Kafka {kafka_version()} jars and Artemis {artemis_version()} are cached "
        "(fetched from Maven Central when missing)"
    )
    for what, path in prefetch(kafka=not args.no_kafka, artemis=not args.no_artemis).items():
        print(f"  {what}: {path}")
    print(f"prefetch done in {time.monotonic() - started:.1f}s")
    return 0


def _check(_args: argparse.Namespace) -> int:
    from .postgres import find_bindir

    missing = 0
    for tool in ("java", "mvn"):
        found = shutil.which(tool)
        missing += found is None
        print(f"{tool:18} {found or 'MISSING'}")
    try:
        print(f"{'postgres bindir':18} {find_bindir()}")
    except HarnessError as exc:
        missing += 1
        print(f"{'postgres bindir':18} MISSING ({exc})")
    for module in ("confluent_kafka", "psycopg", "stomp"):
        present = importlib.util.find_spec(module) is not None
        missing += not present
        print(f"{module:18} {'ok' if present else 'MISSING'}")
    print(f"{'cache':18} {cache_dir()}")
    return 1 if missing else 0


def _serve(args: argparse.Namespace) -> int:
    from .jms import start_jms
    from .kafka import start_kafka
    from .postgres import start_postgres

    starters: dict[str, Callable[[], Server]] = {
        "kafka": start_kafka,
        "postgres": start_postgres,
        "jms": start_jms,
    }
    server = starters[args.server]()
    print(server, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.backend.close()
        cleanup_all()
    return 0


def _images(_args: argparse.Namespace) -> int:
    from . import images
    from .containers import docker_available

    if not docker_available():
        print("no Docker engine answers (or testcontainers is missing): no images to build")
        return 0
    started = time.monotonic()
    for name, tag in images.ensure_all().items():
        print(f"  {name}: {tag}")
    print(f"images ready in {time.monotonic() - started:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m integration.harness``."""
    parser = argparse.ArgumentParser(prog="python -m integration.harness")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("prefetch", help="fetch Kafka jars and Artemis into the cache")
    fetch.add_argument("--no-kafka", action="store_true", help="skip the Kafka jars")
    fetch.add_argument("--no-artemis", action="store_true", help="skip the Artemis distribution")
    fetch.set_defaults(func=_prefetch)
    check = commands.add_parser("check", help="report which prerequisites are present")
    check.set_defaults(func=_check)
    serve = commands.add_parser("serve", help="run one server in the foreground until Ctrl-C")
    serve.add_argument("server", choices=["kafka", "postgres", "jms"])
    serve.set_defaults(func=_serve)
    build = commands.add_parser("images", help="build the servers' container images")
    build.set_defaults(func=_images)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
