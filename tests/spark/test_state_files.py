"""State store files are hard-linked between a query's checkpoint and its RocksDB working
directory, not copied (:mod:`epochal.startup.statefiles`), and the state stays right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.startup import statefiles

pytestmark = pytest.mark.spark

#: A driver restarts a stateful query in its own session (what an in-place restart does) and
#: reports, from the restarted run's first batch, the table files that its RocksDB working
#: directories share (same inode) with the checkpoint, the counts, and what the session's
#: local file system does with a table file and with any other file.
SCRIPT = r"""
import json, os, sys
from epochal.startup.session import SessionProfile, spark_session

inputs, checkpoint, scratch = sys.argv[1:4]
spark = spark_session(SessionProfile("local[2]"))

def table_inodes(root):
    found = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".sst"):
                found[os.stat(os.path.join(folder, name)).st_ino] = os.path.join(folder, name)
    return found

report = {"batches": []}

def batch(frame, batch_id):
    rows = {row["key"]: row["count"] for row in frame.collect()}
    shared = set(table_inodes(checkpoint)) & set(table_inodes(scratch))
    report["batches"].append({"id": batch_id, "counts": rows, "shared": len(shared)})

def run(files):
    for name, keys in files:
        with open(os.path.join(inputs, name), "w") as fh:
            fh.write("".join(json.dumps({"key": k}) + "\n" for k in keys))
    query = (
        spark.readStream.schema("key string").json(inputs)
        .groupBy("key").count()
        .writeStream.outputMode("update").foreachBatch(batch)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()

run([("a.json", ["x", "y", "x"]), ("b.json", ["y", "z"])])
run([("c.json", ["x", "z", "z"])])  # a new run of the query: its state loaded again

jvm = spark._jvm
fs = jvm.org.apache.hadoop.fs.FileSystem.get(
    jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration()
)
report["file_system"] = fs.getClass().getName()
probe = os.path.join(scratch, "probe")
os.makedirs(probe)
for name in ("t.sst", "other.zip"):
    with open(os.path.join(probe, name), "w") as fh:
        fh.write("table" if name.endswith(".sst") else "other")
    Path = jvm.org.apache.hadoop.fs.Path
    fs.copyToLocalFile(Path(os.path.join(probe, name)), Path(os.path.join(probe, "to-" + name)))
    fs.copyFromLocalFile(Path(os.path.join(probe, name)), Path(os.path.join(probe, "from-" + name)))
    inode = os.stat(os.path.join(probe, name)).st_ino
    report[name] = [
        os.stat(os.path.join(probe, p + name)).st_ino == inode for p in ("to-", "from-")
    ]
print("REPORT " + json.dumps(report))
spark.stop()
"""


def _run(tmp_path: Path, **env_changes: str) -> dict:
    inputs, checkpoint, scratch = (tmp_path / n for n in ("inputs", "checkpoint", "scratch"))
    for folder in (inputs, scratch):
        folder.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), **env_changes}  # the JVM's local dirs
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(inputs), str(checkpoint), str(scratch)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(lines[0].split(" ", 1)[1])


def test_a_restarted_query_links_its_state_files_and_counts_right(tmp_path: Path) -> None:
    """The restarted run's RocksDB working directory holds the checkpoint's table files
    themselves (links), its counts carry on from the first run's state, and only table files
    are linked. With the linking file system switched off (the mechanism removed) no file is
    shared and the counts are the same."""
    report = _run(tmp_path)
    assert report["file_system"] == statefiles.FILE_SYSTEM_CLASS
    first, restarted = report["batches"][0], report["batches"][-1]
    assert first["counts"] == {"x": 2, "y": 2, "z": 1}
    assert restarted["counts"] == {"x": 3, "z": 3}, "the restarted run lost its state"
    assert restarted["shared"] > 0, "no table file of the checkpoint is linked"
    assert report["t.sst"] == [True, True]
    assert report["other.zip"] == [False, False]


def test_switched_off_the_state_files_are_copied(tmp_path: Path) -> None:
    report = _run(tmp_path, **{statefiles.SWITCH_ENV: "off"})
    assert report["file_system"] != statefiles.FILE_SYSTEM_CLASS
    restarted = report["batches"][-1]
    assert restarted["counts"] == {"x": 3, "z": 3}
    assert restarted["shared"] == 0
    assert report["t.sst"] == [False, False]
