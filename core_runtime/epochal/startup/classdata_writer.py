"""The process that writes the class-data archive (``python -m epochal.startup.classdata_writer
--dump TARGET``, started by :func:`epochal.startup.classdata.prepare`): a session whose JVM
archives the classes it loaded when it exits."""

from __future__ import annotations

import contextlib
import sys

from epochal.startup.classdata import QUIET, WRITER_MASTER


def dump(target: str) -> None:
    """In a process of its own: a session whose JVM writes ``target`` when it exits."""
    from epochal.spark.datasource import register
    from epochal.startup.session import SessionProfile, spark_session
    from epochal.startup.warmup import warm_up

    options = f"-XX:ArchiveClassesAtExit={target} {QUIET}"
    profile = SessionProfile(WRITER_MASTER, (("spark.driver.extraJavaOptions", options),))
    spark = spark_session(profile, app_name="epochal-classdata")
    register(spark)
    warm_up(spark)
    spark.stop()
    # the JVM writes the archive as it exits: PySpark's gateway process ends with this one
    gateway = spark.sparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
            proc.wait(timeout=300)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--dump":
        dump(sys.argv[2])
    else:
        sys.exit("usage: python -m epochal prepare")
