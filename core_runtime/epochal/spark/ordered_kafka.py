"""Spark's Kafka source with every micro-batch's Spark partitions in one order, for sinks that
settle each Spark partition on their own.

``spark.readStream.format("kafka-ordered")`` takes ``format("kafka")``'s options and gives its
rows; the only change is the order of a batch's input partitions: by topic, Kafka partition
and first offset, so Spark partition ``i`` of a batch reads the same offset range in the
first attempt and in a replay from the offset log (Spark's own order differs between the
two). epochal's Kafka sink commits one Kafka transaction per Spark partition, so with
``kafka-ordered`` straight into it an exactly-once job needs no routing shuffle.

The provider is a small Java class (:data:`SOURCE`) in a jar that ships in this package
(:func:`jar`), loaded only by the driver: put it on the driver's class path with Spark's
Kafka connector (``spark.jars``, ``--jars`` or ``ADD JAR``). The jar is built from the source
by :func:`build_jar`, byte for byte the same on every build (``python -m
epochal.spark.ordered_kafka`` rewrites it; a test checks that it matches the source).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import tempfile
import zipfile

from epochal.parts.spark_plan.capabilities import ORDERED_KAFKA_FORMAT

FORMAT = ORDERED_KAFKA_FORMAT
"""The format name of the ordered source (the Java provider's ``shortName``)."""
PROVIDER_CLASS = "org.epochal.spark.OrderedKafkaProvider"
"""The provider's class; its table, ``OrderedKafkaProvider$OrderedKafkaTable``, is what a
started query's plan shows."""

_JVM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")
SOURCE = os.path.join(_JVM, "OrderedKafkaProvider.java")
"""The provider's Java source."""
JAR_NAME = "epochal-ordered-kafka.jar"
_SERVICE = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
_COMPILE_AGAINST = (
    "spark-catalyst_*.jar",
    "spark-sql_*.jar",
    "spark-sql-api_*.jar",
    "spark-common-utils_*.jar",
    "scala-library-*.jar",
)
"""What the class compiles against, from a Spark ``jars/`` directory (the data source API's
interfaces; none of Spark's Kafka classes: it reaches them by reflection)."""
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
"""Every jar entry's time stamp, so that a build gives the same bytes."""


def jar() -> str:
    """The path of the jar that holds the provider (it ships in this package)."""
    return os.path.join(_JVM, JAR_NAME)


def build_jar(spark_jars: str, target: str, source: str = SOURCE) -> str:
    """Compile ``source`` (by default :data:`SOURCE`) against the Spark in ``spark_jars``
    (for Java 17) and write the jar to ``target``, with the data source registration and
    fixed time stamps. Raises :class:`RuntimeError` with javac's output when it fails."""
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("building the ordered Kafka provider needs a JDK's javac on PATH")
    classpath = [p for pattern in _COMPILE_AGAINST for p in glob.glob(f"{spark_jars}/{pattern}")]
    with tempfile.TemporaryDirectory(prefix="epochal-javac-") as classes:
        command = [javac, "--release", "17", "-nowarn", "-cp", os.pathsep.join(classpath)]
        result = subprocess.run(
            [*command, "-d", classes, source], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"javac failed:\n{result.stdout}{result.stderr}")
        entries = {"META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\r\n\r\n"}
        entries[_SERVICE] = f"{PROVIDER_CLASS}\n".encode()
        for path in sorted(glob.glob(f"{classes}/**/*.class", recursive=True)):
            with open(path, "rb") as fh:
                entries[os.path.relpath(path, classes)] = fh.read()
        partial = f"{target}.partial"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
            for name, data in entries.items():
                out.writestr(zipfile.ZipInfo(name, _FIXED_TIME), data)
        os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m epochal.spark.ordered_kafka [--spark-jars DIR]``: rebuild the shipped jar
    from the source (after a change to it), against the installed pyspark by default."""
    parser = argparse.ArgumentParser(prog="python -m epochal.spark.ordered_kafka")
    parser.add_argument("--spark-jars", help="a Spark jars/ directory (default: pyspark's)")
    args = parser.parse_args(argv)
    spark_jars = args.spark_jars
    if spark_jars is None:
        import pyspark

        spark_jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    print(build_jar(spark_jars, jar()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
