"""epochal's local file system (:mod:`epochal.startup.statefiles`): state store files are
hard-linked between a query's checkpoint and its RocksDB working directory, not copied, and
the state stays right; the checkpoint is written without starting a process, and Hadoop's
answers (permissions, a refused rename, a link's status) stay Hadoop's."""

from __future__ import annotations

import json
import os
import shutil
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

inputs, checkpoint, scratch, started = sys.argv[1:5]
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

def run(files, session=spark, checkpoint=checkpoint):
    for name, keys in files:
        with open(os.path.join(inputs, name), "w") as fh:
            fh.write("".join(json.dumps({"key": k}) + "\n" for k in keys))
    query = (
        session.readStream.schema("key string").json(inputs)
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

# -- the checkpoint's own file system (Hadoop's FileContext) ------------------------------------
def started_for(folder):
    with open(started) as fh:
        return [line for line in fh if folder in line]

def modes(folder):
    return {
        os.path.relpath(os.path.join(d, n), folder): oct(os.stat(os.path.join(d, n)).st_mode)
        for d, _dirs, files in os.walk(folder) for n in files
        if os.path.basename(d) in ("commits", "offsets")
    }

report["started"] = len(started_for(checkpoint))
control = os.path.join(scratch, "control-checkpoint")  # the same query on Hadoop's LocalFs
hadoops = spark.newSession()
hadoops.conf.set("fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.LocalFs")
ours_batches = list(report["batches"])
run([], session=hadoops, checkpoint=control)
report["batches"] = ours_batches  # the control's batch is not the restarted run's
report["started_by_hadoops"] = len(started_for(control))
ours_modes, hadoops_modes = modes(checkpoint), modes(control)
report["same_modes"] = {k: ours_modes.get(k) == v for k, v in hadoops_modes.items()}

conf = spark._jsparkSession.sessionState().newHadoopConf()
fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(jvm.java.net.URI("file:///"), conf)
report["file_context"] = fc.getDefaultFileSystem().getClass().getName()
Path = jvm.org.apache.hadoop.fs.Path
for name, text in (("a", "first"), ("b", "second")):
    with open(os.path.join(probe, name), "w") as fh:
        fh.write(text)
no_overwrite = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
no_overwrite[0] = jvm.org.apache.hadoop.fs.Options.Rename.NONE
try:
    fc.rename(Path(os.path.join(probe, "a")), Path(os.path.join(probe, "b")), no_overwrite)
    report["rename_onto_a_file"] = "renamed"
except Exception as error:
    report["rename_onto_a_file"] = "FileAlreadyExistsException" in str(error) or str(error)[:600]
with open(os.path.join(probe, "b")) as fh:
    report["kept"] = fh.read()
os.symlink(os.path.join(probe, "b"), os.path.join(probe, "link"))
link = fc.getFileLinkStatus(Path(os.path.join(probe, "link")))
report["link"] = [link.isSymlink(), link.getSymlink().toUri().getPath()]
hadoops_fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
    jvm.java.net.URI("file:///"), hadoops._jsparkSession.sessionState().newHadoopConf()
)
report["made"] = []
for name, context in (("ours", fc), ("hadoops", hadoops_fc)):
    for mode in ("750", "644", "1777"):
        made = os.path.join(probe, f"{name}-{mode}")
        context.mkdir(Path(made), jvm.org.apache.hadoop.fs.permission.FsPermission(mode), False)
        report["made"].append(oct(os.stat(made).st_mode & 0o7777))
print("REPORT " + json.dumps(report))
spark.stop()
"""


#: The commands Hadoop's local file system starts without its native library (pip's pyspark
#: has none): a link's target, a file's permissions set and read.
HADOOP_SHELL_COMMANDS = ("readlink", "chmod", "ls", "stat")


def _recording_commands(folder: Path, record: Path) -> str:
    """A directory of stand-ins for :data:`HADOOP_SHELL_COMMANDS` that write their command
    line to ``record`` and run the real command: the driver's ``PATH`` starts with it."""
    folder.mkdir()
    record.touch()
    for name in HADOOP_SHELL_COMMANDS:
        real = shutil.which(name)
        assert real is not None, name
        stand_in = folder / name
        stand_in.write_text(f'#!/bin/sh\necho "{name} $*" >> {record}\nexec {real} "$@"\n')
        stand_in.chmod(0o700)
    return str(folder)


def _run(tmp_path: Path, **env_changes: str) -> dict:
    inputs, checkpoint, scratch = (tmp_path / n for n in ("inputs", "checkpoint", "scratch"))
    for folder in (inputs, scratch):
        folder.mkdir()
    started = tmp_path / "started.log"
    recording = _recording_commands(tmp_path / "bin", started)
    env = {
        **os.environ,
        "TMPDIR": str(scratch),  # the JVM's local dirs
        "PATH": f"{recording}{os.pathsep}{os.environ['PATH']}",
        **env_changes,
    }
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(inputs), str(checkpoint), str(scratch), str(started)],
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
    _assert_the_checkpoint_starts_no_process(report)


def _assert_the_checkpoint_starts_no_process(report: dict) -> None:
    """Writing the checkpoint (offset and commit logs, metadata, state) started no process,
    where the same query on Hadoop's own ``LocalFs`` (the mechanism removed) starts some for
    every batch; the files get the same permissions; a rename onto an existing file is still
    refused and changes nothing; a symbolic link is still reported as one; a directory made
    with a permission has it."""
    assert report["file_context"] == statefiles.FILE_CONTEXT_CLASS
    assert report["started_by_hadoops"] > 0, "the control started no process: a blind test"
    assert report["started"] == 0, f"{report['started']} processes started for the checkpoint"
    assert report["same_modes"] and all(report["same_modes"].values()), report["same_modes"]
    assert report["rename_onto_a_file"] is True
    assert report["kept"] == "second"
    assert report["link"][0] is True and report["link"][1].endswith("/probe/b")
    ours, hadoops = report["made"][:3], report["made"][3:]
    assert ours == hadoops and ours[0] != ours[1], report["made"]


def test_switched_off_the_state_files_are_copied(tmp_path: Path) -> None:
    report = _run(tmp_path, **{statefiles.SWITCH_ENV: "off"})
    assert report["file_system"] == statefiles.COPYING_FILE_SYSTEM_CLASS
    restarted = report["batches"][-1]
    assert restarted["counts"] == {"x": 3, "z": 3}
    assert restarted["shared"] == 0
    assert report["t.sst"] == [False, False]
    _assert_the_checkpoint_starts_no_process(report)  # the switch is the state files' only
