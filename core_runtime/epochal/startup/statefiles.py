"""epochal's local file system: state store files linked, not copied (a restart that does
not read and write the state), and a checkpoint written without starting processes.

Spark's RocksDB state store keeps each open state partition in a local working directory and
the versions it committed in the query's checkpoint. A query run opens its partitions afresh
(a restarted query gets a new run id, and Spark never hands it the old run's open instances),
so every restart, in place or in a new driver, copies every table file (``.sst``) of the
version it resumes from the checkpoint into a new working directory, and every commit copies
the new table files back: at 1 GB of state the first batch after an in-place restart or a
standby's promotion took 3-11 s (``addBatch``), against 0.7-1.7 s with links.

On one machine with the checkpoint on a local file system (a ``local`` or ``local-cluster``
master, which is where every driver epochal starts by itself runs), a hard link does the
same: table files are never changed once written, only deleted, and Spark names each
checkpoint copy uniquely. ``LinkingLocalFileSystem`` (Java, beside this module) is Hadoop's
local file system with exactly that change for ``.sst`` files, and falls back to the copy
for anything else or when the link is refused (ends on two file systems).

It is built once per machine with ``javac`` into the fast Spark home's ``jars/`` (see
:mod:`epochal.startup.home`), so it is on the driver's and the executors' class path, inside
the JVM class-data archive; :func:`session_conf` then gives a driver's session
``spark.hadoop.fs.file.impl``. Without a JDK (no ``javac``), with a ``SPARK_HOME`` of the
user's or ``EPOCHAL_STATE_LINKS=off``, state files are copied as Spark does by itself.

The same jar holds the raw layer both file systems sit on, ``NioRawLocalFileSystem``: Hadoop
without its native library (pip's pyspark has none) starts a ``readlink`` process to read a
path's link status and a ``chmod`` process to set a new file's permissions, and Spark writes
each offset and commit log entry through ``FileContext`` as a temporary file (and its
checksum) renamed into place: about twenty processes per micro-batch on the driver, 30 ms of
``walCommit`` and 30-50 ms of ``commitOffsets`` per batch on a 2-core machine, against 1-2 ms
each without them. ``NioLocalFs`` is ``FileContext``'s ``file:`` file system over that layer
(``spark.hadoop.fs.AbstractFileSystem.file.impl``), for the same sessions, whatever
``EPOCHAL_STATE_LINKS`` says; Hadoop's answers (permissions, a refused rename, a link's
status) are unchanged.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile

from epochal.base.switches import env_switch

log = logging.getLogger("epochal.spark")

SWITCH_ENV = "EPOCHAL_STATE_LINKS"
"""``off``: state store files are copied (Spark's own behaviour); the checkpoint is still
written without starting processes."""
FILE_SYSTEM_CLASS = "org.epochal.hadoop.LinkingLocalFileSystem"
"""``fs.file.impl``: Hadoop's ``FileSystem`` for ``file:`` (what the state store copies with)."""
COPYING_FILE_SYSTEM_CLASS = "org.epochal.hadoop.NioLocalFileSystem"
"""``fs.file.impl`` with :data:`SWITCH_ENV` off: state files copied, no process started."""
FILE_CONTEXT_CLASS = "org.epochal.hadoop.NioLocalFs"
"""``fs.AbstractFileSystem.file.impl``: the ``file:`` file system of Hadoop's ``FileContext``
(what Spark writes a query's checkpoint with)."""
JAR_NAME = "epochal-linking-local-fs.jar"
"""The jar's name in a Spark home's ``jars/``."""
_JVM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")
SOURCES = (
    os.path.join(_JVM, "LinkingLocalFileSystem.java"),
    os.path.join(_JVM, "NioRawLocalFileSystem.java"),
    os.path.join(_JVM, "NioLocalFileSystem.java"),
    os.path.join(_JVM, "NioLocalFs.java"),
)
"""The Java sources the jar is compiled from."""
HADOOP_API_JARS = "hadoop-client-api-*.jar"
"""What the class compiles against (the Hadoop that Spark's jars directory ships)."""


@functools.cache
def source_digest() -> str:
    """A short hash of the Java sources: part of the fast Spark home's name, so a changed
    source gets a new home (and a new class-data archive) instead of a stale jar."""
    digest = hashlib.sha1()
    for source in SOURCES:
        with open(source, "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()[:8]


def build_jar(spark_jars: str, target_dir: str) -> str | None:
    """Compile the file system against the Hadoop in ``spark_jars`` and write
    ``target_dir/JAR_NAME``; its path, or None (logged) when there is no ``javac`` or it
    fails: state files are then copied, as without epochal."""
    javac = shutil.which("javac")
    hadoop = sorted(glob.glob(os.path.join(spark_jars, HADOOP_API_JARS)))
    if javac is None or not hadoop:
        log.info("state store files are copied: no javac or no Hadoop API jar in %s", spark_jars)
        return None
    with tempfile.TemporaryDirectory(prefix="epochal-javac-") as classes:
        result = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-cp", hadoop[-1], "-d", classes, *SOURCES],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            log.warning("state store files are copied: javac failed:\n%s", result.stderr[-2000:])
            return None
        target = os.path.join(target_dir, JAR_NAME)
        partial = f"{target}.{os.getpid()}.partial"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for folder, _dirs, files in os.walk(classes):
                for name in sorted(files):
                    path = os.path.join(folder, name)
                    jar.write(path, os.path.relpath(path, classes))
        os.replace(partial, target)
        return target


def _every_jvm_has_the_jar(master: str) -> bool:
    """One machine, every JVM of the application started from the driver's Spark home."""
    return master.startswith("local")  # local, local[N], local[*], local-cluster[...]


def session_conf(master: str) -> dict[str, str]:
    """The Spark settings that give a session with ``master`` epochal's local file system:
    none unless the Spark home in use (``SPARK_HOME``, set before the session's JVM starts)
    has the jar and the master keeps every JVM on this machine. The checkpoint is written
    without starting processes; state files are linked unless :data:`SWITCH_ENV` is off."""
    if not _every_jvm_has_the_jar(master):
        return {}
    home = os.environ.get("SPARK_HOME")
    if not home or not os.path.isfile(os.path.join(home, "jars", JAR_NAME)):
        return {}
    links = env_switch(SWITCH_ENV, True)
    return {
        "spark.hadoop.fs.file.impl": FILE_SYSTEM_CLASS if links else COPYING_FILE_SYSTEM_CLASS,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": FILE_CONTEXT_CLASS,
    }
