"""JVM class-data sharing for driver JVMs: a new driver starts in about half the time.

A Spark driver's JVM loads and verifies some 15 000 classes before its first batch. A
dynamic class-data-sharing archive (JDK 13+: ``-XX:ArchiveClassesAtExit`` writes the classes a
JVM loaded, ``-XX:SharedArchiveFile`` maps them into the next one) saves most of that: on this
project's 2-core machine the SparkSession comes up in 3.0 s instead of 5.4-5.9 s and the first
Spark job runs in 1.4 s instead of 2.4-2.6 s.

The archive fits one JVM build, one Spark home and one class path, so its name carries a
hash of all three. :func:`prepare` makes it once: a JVM that starts a session, runs the
warm-up query (:mod:`epochal.startup.warmup`: the classes of a streaming query with Python
sources and sinks and state) and exits writes it; ``python -m epochal prepare`` calls it
(``scripts/test.sh`` runs that before the tests). :func:`driver_java_options` adds it to a driver's
JVM options when it exists; a JVM that finds it does not fit (another class path, an
updated JDK) ignores it (``-Xshare:auto``) and starts as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from epochal.base.switches import env_switch

SWITCH_ENV = "EPOCHAL_CLASS_DATA"
"""``off``: never use nor make the archive."""
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""Keep the JVM's class-data-sharing notes (every skipped class) out of the driver's log."""
WRITER_MASTER = "local[2]"
"""The master of the session whose JVM writes the archive
(:mod:`epochal.startup.classdata_writer`)."""
SHORT_LIVED_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData")
"""Options of a JVM that lives for seconds or minutes (the demo's drivers; a test's driver,
executor or server daemon): C1 only and the serial GC, so the JIT's C2 compilations (most of
a short JVM's CPU) are not made: a demo's drivers use about a third less CPU on two cores. A
production job keeps the JVM's defaults, which a long run repays. No perf data: a JVM writes
it to /tmp/hsperfdata_<user> whatever its temporary directory, and a killed one leaves it."""
SHORT_LIVED_JVM_OPTIONS = " ".join(SHORT_LIVED_JVM)
""":data:`SHORT_LIVED_JVM` as one option string (``spark.driver.extraJavaOptions``)."""


def java_executable() -> str:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.path.join(home, "bin", "java")
    return shutil.which("java") or "java"


@functools.cache
def _java_identity(java: str) -> str:
    try:
        result = subprocess.run(
            [java, "-Xshare:auto", "-version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f"{os.path.realpath(shutil.which(java) or java)}\n{result.stderr}"


def archive_path(spark_home: str, java: str | None = None) -> str | None:
    """Where the archive for this JVM build and Spark home lives (None: no usable JVM)."""
    identity = _java_identity(java or java_executable())
    if not identity:
        return None
    jars = os.path.join(spark_home, "jars")
    listing = "\n".join(_jar_identities(jars)) if os.path.isdir(jars) else ""
    key = hashlib.sha1(f"{identity}\n{os.path.realpath(spark_home)}\n{listing}".encode())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "epochal", "jvm", f"spark-driver-{key.hexdigest()[:16]}.jsa")


def _jar_identities(jars: str) -> list[str]:
    """Each jar's name, size and modification time: what a JVM checks before it maps an
    archive (a jar rebuilt under the same name, such as the fast Spark home's own, makes the
    archive unusable, so it must make its name differ too)."""
    identities = []
    for name in sorted(os.listdir(jars)):
        with contextlib.suppress(OSError):
            stat = os.stat(os.path.join(jars, name))
            identities.append(f"{name} {stat.st_size} {stat.st_mtime_ns}")
    return identities


def _enabled() -> bool:
    return env_switch(SWITCH_ENV, True)


def _spark_home() -> str | None:
    from epochal.startup.home import package_home

    return os.environ.get("SPARK_HOME") or package_home()


ARCHIVES_KEPT = 3
"""Archives a machine keeps (about 170 MB each, one per Spark home and JVM build): making a
new one removes all but the ones most recently used. A driver whose archive was removed
starts without it (a few seconds slower) until ``epochal prepare`` makes it again."""
USE_MARK_SECONDS = 3600.0
"""A driver marks its archive used (its modification time) when the mark is older than this."""


def driver_java_options(existing: str = "") -> str:
    """``existing`` driver JVM options with the archive in front, when it exists."""
    home = _spark_home()
    archive = archive_path(home) if home and _enabled() else None
    if archive is None or "Archive" in existing:
        return existing  # none, or the options name one already (or dump one)
    try:
        used = os.stat(archive).st_mtime
    except OSError:
        return existing
    if time.time() - used > USE_MARK_SECONDS:
        with contextlib.suppress(OSError):
            os.utime(archive)  # kept by the next prepare's clean-up (_remove_unused_archives)
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET} {existing}".strip()


def _remove_unused_archives(directory: str, keep: int = ARCHIVES_KEPT) -> list[str]:
    """Delete the archives in ``directory`` beyond the ``keep`` most recently used (a new
    checkout, Spark home or JVM makes a new one; nothing removes the old). A JVM that has one
    mapped keeps its pages: deleting the file only stops new drivers from finding it. The
    names of the deleted archives."""
    found = []
    for name in os.listdir(directory):
        if name.startswith("spark-driver-") and name.endswith(".jsa"):
            with contextlib.suppress(OSError):
                found.append((os.stat(os.path.join(directory, name)).st_mtime, name))
    removed = []
    for _, name in sorted(found, reverse=True)[keep:]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    return removed


def prepare(report: Callable[[str], object] = print, force: bool = False) -> str | None:
    """Make the archive for this interpreter's PySpark (its fast Spark home, see
    :mod:`epochal.startup.home`) unless it exists; returns its path (None: switched off or no
    JVM). Takes 20-40 s once; a second process racing for it waits for the first."""
    from epochal.startup.home import python_of_spark, use_fast_spark_home

    if not _enabled():
        return None
    use_fast_spark_home("local[1]")
    home = _spark_home()
    archive = archive_path(home) if home else None
    if archive is None:
        return None
    if os.path.isfile(archive) and not force:
        return archive
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    lock = f"{archive}.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        if time.time() - os.path.getmtime(lock) > 600:  # a builder that died: take over
            os.unlink(lock)
            return prepare(report, force)
        _wait_for(archive, lock)
        return archive if os.path.isfile(archive) else None
    os.close(fd)
    _remove_dead_partials(os.path.dirname(archive))
    try:
        report(f"epochal: preparing the JVM class-data archive for Spark drivers ({archive})")
        started = time.monotonic()
        partial = f"{archive}.{os.getpid()}.partial"
        with tempfile.TemporaryDirectory(prefix="epochal-classdata-") as scratch:
            log = os.path.join(scratch, "dump.log")
            env = {**os.environ, **python_of_spark()}  # as a driver's
            with open(log, "w") as out:
                code = subprocess.call(
                    [sys.executable, "-m", "epochal.startup.classdata_writer", "--dump", partial],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=scratch,
                    env=env,
                )
            if code != 0 or not os.path.isfile(partial):
                with open(log) as fh:
                    report(f"epochal: no class-data archive (the dump failed, exit {code}):")
                    report(_failure(fh.read()))
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                return None
        os.replace(partial, archive)
        report(f"epochal: class-data archive ready in {time.monotonic() - started:.0f}s")
        removed = _remove_unused_archives(os.path.dirname(archive))
        if removed:
            report(f"epochal: removed {len(removed)} class-data archive(s) unused the longest")
        return archive
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)


def _failure(output: str) -> str:
    """What a failed dump printed that says why: its first lines that name an error (the
    cause, which a Java stack trace pushes far up), then its last lines."""
    lines = output.splitlines()
    errors = [line for line in lines if "Error" in line or "Exception" in line][:4]
    return "\n".join([*errors, "...", *lines[-15:]])


def _remove_dead_partials(directory: str) -> None:
    """Delete ``<archive>.<pid>.partial`` files of dumps whose process is gone (killed)."""
    for name in os.listdir(directory):
        parts = name.split(".")
        if len(parts) < 3 or parts[-1] != "partial" or not parts[-2].isdigit():
            continue
        if not os.path.exists(f"/proc/{parts[-2]}"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def _wait_for(archive: str, lock: str, seconds: float = 600.0) -> None:
    deadline = time.monotonic() + seconds
    while os.path.exists(lock) and not os.path.isfile(archive) and time.monotonic() < deadline:
        time.sleep(0.5)
