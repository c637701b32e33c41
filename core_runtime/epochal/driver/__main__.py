"""``python -m epochal.driver (--epoch N SNAPSHOT_DIR JOB | --standby [--keep-warm |
--no-warm-up])``: a
driver process, started by a supervisor (:mod:`epochal.control.launcher`).

The session profile comes as the first line of stdin, never on the command line: its Spark
settings may hold secrets, and any user of the host can read a process's command line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from epochal.base import files
from epochal.control.messages import Promotion
from epochal.driver.guards import Supervision
from epochal.driver.run import Driver
from epochal.startup.session import SessionProfile


def main() -> None:
    """Parse the command line, read the profile, run the driver and exit with its code."""
    files.private_process()  # the checkpoint, the store, Spark's scratch files: owner-only
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m epochal.driver")
    parser.add_argument("snapshot_dir", nargs="?", help="the job's snapshot directory")
    parser.add_argument("job", nargs="?", help="the job's name")
    parser.add_argument("--epoch", type=int, help="the lease epoch this driver runs at")
    parser.add_argument("--standby", action="store_true", help="warm up, wait for promotion")
    parser.add_argument("--launched", type=float, default=None, help="when it was started")
    parser.add_argument(
        "--keep-warm", action="store_true", help="with --standby: stay warm while it waits"
    )
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="with --standby: ready once the session is up, without the warm-up query",
    )
    args = parser.parse_args()
    if args.standby == (args.epoch is not None):
        parser.error("give exactly one of --epoch and --standby")
    if (args.keep_warm or args.no_warm_up) and not args.standby:
        parser.error("--keep-warm and --no-warm-up are for a warm driver (--standby)")
    if args.keep_warm and args.no_warm_up:
        parser.error("a driver that keeps warm warms up (--keep-warm, not --no-warm-up)")
    if args.epoch is not None and not (args.snapshot_dir and args.job):
        parser.error("--epoch needs the snapshot directory and the job")
    profile = SessionProfile.from_json(sys.stdin.readline())
    supervision = Supervision()
    supervision.start()
    driver = Driver(supervision, profile)
    job = None if args.standby else Promotion(args.epoch, args.snapshot_dir, args.job)
    code = driver.main(
        job, args.launched or time.time(), keep_warm=args.keep_warm, warm_up=not args.no_warm_up
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
