"""A ``SPARK_HOME`` in which PySpark's Python processes start fast.

pip's ``pyspark`` package is also Spark's home (``bin/``, ``jars/``), and its
``python/lib/pyspark.zip`` holds PySpark's sources without bytecode. Spark puts that zip first
on the path of every Python process it starts (the driver's planner daemons, the streaming
source runner of each query, the executors' daemons), so each of them compiles PySpark from
source again: 0.8 s to import ``pyspark.sql`` from the zip against 0.3 s from the installed
package on this project's 2-core machine, paid by every new query's source runner (the
critical path of an in-place restart or a standby's promotion) and by every daemon of a new
driver.

:func:`use_fast_spark_home` points ``SPARK_HOME`` at a directory that links to everything of
the installed package but those two zips: the processes Spark starts then import PySpark (and
py4j) from the interpreter's own site-packages, where their compiled bytecode is: the same
code, the same version. Its ``jars/`` holds one jar more than PySpark's: a local file system
that links state store files instead of copying them (:mod:`epochal.startup.statefiles`). It
is used where the driver's Python processes run this
interpreter and the executors either do too (a local master) or take Spark's home from their
own machine (a standalone cluster's workers); not for YARN, whose client ships
``pyspark.zip`` to the executors. A ``SPARK_HOME`` that is already set is left alone (a real
Spark distribution), and ``EPOCHAL_SPARK_HOME=asis`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile

from epochal.startup.statefiles import build_jar, source_digest


def python_of_spark() -> dict[str, str]:
    """The environment that makes the Python processes a driver's Spark starts run this
    interpreter (the one with the packages), not the ``python3`` that PATH finds: a virtual
    environment need not be active, and a system Python with ``.venv`` has no pyspark."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


SWITCH_ENV = "EPOCHAL_SPARK_HOME"
"""``asis``: leave ``SPARK_HOME`` to PySpark (its package directory, with the zips)."""
SKIPPED_PREFIXES = ("pyspark.zip", "py4j-")
"""What the fast home leaves out of ``python/lib``: PySpark's and py4j's source zips (both
are installed as packages beside pyspark, compiled)."""


def package_home() -> str | None:
    """The installed pyspark package's directory when it is Spark's home (pip's pyspark
    ships ``bin/spark-submit`` and ``python/lib/pyspark.zip`` inside the package)."""
    import pyspark

    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    if os.path.isfile(os.path.join(home, "bin", "spark-submit")) and os.path.isfile(
        os.path.join(home, "python", "lib", "pyspark.zip")
    ):
        return home
    return None


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "epochal", "spark-home")


def fast_spark_home(package: str, root: str | None = None) -> str:
    """The fast home for ``package`` (made once, atomically; several processes may race)."""
    from pyspark.version import __version__

    digest = hashlib.sha1(os.path.realpath(package).encode()).hexdigest()[:10]
    target = os.path.join(root or _cache_root(), f"{__version__}-{digest}-{source_digest()}")
    if os.path.isdir(target):
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    building = tempfile.mkdtemp(prefix=".building-", dir=os.path.dirname(target))
    try:
        _link_all(package, building, skip=("python", "jars"))
        jars = os.path.join(building, "jars")
        os.makedirs(jars)
        _link_all(os.path.join(package, "jars"), jars, skip=())
        build_jar(os.path.join(package, "jars"), jars)  # state files linked, not copied
        python = os.path.join(package, "python")
        os.makedirs(os.path.join(building, "python"))
        _link_all(python, os.path.join(building, "python"), skip=("lib",))
        lib = os.path.join(building, "python", "lib")
        os.makedirs(lib)
        for name in os.listdir(os.path.join(python, "lib")):
            if not name.startswith(SKIPPED_PREFIXES):
                os.symlink(os.path.join(python, "lib", name), os.path.join(lib, name))
        with contextlib.suppress(FileExistsError, OSError):
            os.rename(building, target)  # a racing process may have made it first
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def _link_all(source: str, target: str, skip: tuple[str, ...]) -> None:
    for name in os.listdir(source):
        if name not in skip:
            os.symlink(os.path.join(source, name), os.path.join(target, name))


def use_fast_spark_home(master: str) -> str | None:
    """Set ``SPARK_HOME`` to the fast home before a SparkSession's JVM starts, when it helps
    and is safe: a local or standalone master, no ``SPARK_HOME`` set, pyspark installed by
    pip. Returns the home set, or None."""
    if os.environ.get(SWITCH_ENV, "").lower() == "asis" or os.environ.get("SPARK_HOME"):
        return None
    if not master.startswith(("local", "spark://")):
        return None
    package = package_home()
    if package is None or importlib.util.find_spec("py4j") is None:
        return None
    try:
        home = fast_spark_home(package)
    except OSError:  # a read-only home directory: PySpark's own home still works
        return None
    os.environ["SPARK_HOME"] = home
    return home
