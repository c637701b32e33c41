"""A PySpark application for the YARN smoke test; it runs as the driver in the AM container.

``blocking_app.py <dir> [<max seconds>]``: runs a tiny job, writes ``<dir>/attempt-<n>``
("attempt <n> pid <pid> jvm <AM pid> container <id> sum <result>"), then waits until
``<dir>/stop`` exists and stops. It gives up (exit 3) after ``max seconds`` or when its AM
JVM is gone, so a lost test run leaves no process behind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(markers: Path, max_seconds: float) -> int:
    """Run the job, write the marker, block until the stop file appears."""
    from pyspark.sql import SparkSession

    deadline = time.monotonic() + max_seconds
    jvm = os.getppid()  # the ApplicationMaster's JVM started this Python
    spark = SparkSession.builder.getOrCreate()
    total = spark.sparkContext.parallelize(range(100), 2).map(lambda x: x * 2).sum()
    container = os.environ["CONTAINER_ID"]  # container_[e<epoch>_]<ts>_<app>_<attempt>_<n>
    attempt = int(container.split("_")[-2])
    text = f"attempt {attempt} pid {os.getpid()} jvm {jvm} container {container} sum {total}\n"
    tmp = markers / f".attempt-{attempt}.tmp"
    tmp.write_text(text)
    tmp.rename(markers / f"attempt-{attempt}")
    while not (markers / "stop").exists():
        if os.getppid() != jvm or time.monotonic() > deadline:
            return 3
        time.sleep(0.1)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 600.0))
