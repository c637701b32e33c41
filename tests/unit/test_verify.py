"""verify_job: snapshot entries, the Spark checkpoint's presence and its log checksums."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from epochal.config import JobConfig
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.manifests import verify_job


@pytest.fixture
def jobdir(tmp_path: Path) -> JobDirectory:
    snapshots = str(tmp_path / "snapshots")
    directory = JobDirectory(snapshots, "orders")
    directory.save(JobRecord("orders", "m:f", JobConfig(snapshot_dir=snapshots).to_dict()))
    return directory


def set_progress(jobdir: JobDirectory, batch: int) -> None:
    with jobdir.update() as rec:
        rec.progress = {"batch": batch}


def write_log(jobdir: JobDirectory, log: str, batch: int, text: str) -> str:
    os.makedirs(f"{jobdir.checkpoint}/{log}", exist_ok=True)
    path = f"{jobdir.checkpoint}/{log}/{batch}"
    Path(path).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_batch(jobdir: JobDirectory, batch: int) -> None:
    """Spark's offset and commit log entries of ``batch`` and their checksums in the store."""
    digests = {
        "offsets": write_log(jobdir, "offsets", batch, f'v1\n{{"batchId":{batch}}}\n{{"0":5}}'),
        "commits": write_log(jobdir, "commits", batch, 'v1\n{"nextBatchWatermarkMs":0}'),
    }
    jobdir.store.write_json(f"checkpoint/{batch:012d}", digests)


def test_a_new_job_is_sound(jobdir: JobDirectory) -> None:
    assert verify_job(jobdir) == []


def test_sound_store_entries(jobdir: JobDirectory) -> None:
    jobdir.store.write_json("sinks/s/decisions/000000000001", {"batch": 1})
    jobdir.store.write("sources/q/batches/000000000001", b"arrow bytes", count=3)
    assert verify_job(jobdir) == []


def test_a_corrupt_entry_is_reported(jobdir: JobDirectory) -> None:
    jobdir.store.write_json("sinks/s/decisions/000000000001", {"batch": 1})
    jobdir.store.write_json("sinks/s/decisions/000000000002", {"batch": 2})
    path = Path(jobdir.store.base, "sinks", "s", "decisions", "000000000002")
    path.write_bytes(path.read_bytes().replace(b'{"batch": 2}', b'{"batch": 7}'))
    problems = verify_job(jobdir)
    assert len(problems) == 1
    assert "'sinks/s/decisions/000000000002'" in problems[0]
    assert "corrupt" in problems[0]


def test_a_truncated_entry_is_reported(jobdir: JobDirectory) -> None:
    jobdir.store.write_json("sinks/s/done/000000000004", {"batch": 4})
    path = Path(jobdir.store.base, "sinks", "s", "done", "000000000004")
    path.write_bytes(path.read_bytes()[:-3])
    problems = verify_job(jobdir)
    assert len(problems) == 1
    assert "'sinks/s/done/000000000004'" in problems[0]
    assert "size" in problems[0]


def test_progress_without_a_checkpoint(jobdir: JobDirectory) -> None:
    set_progress(jobdir, 3)
    problems = verify_job(jobdir)
    assert len(problems) == 1
    assert f"Spark's checkpoint {jobdir.checkpoint} has no commit log" in problems[0]
    assert "committed batch 3" in problems[0]
    # an empty commit log is no better
    os.makedirs(f"{jobdir.checkpoint}/commits")
    assert len(verify_job(jobdir)) == 1


def test_checkpoint_matching_its_checksums(jobdir: JobDirectory) -> None:
    for batch in (1, 2, 3):
        checkpoint_batch(jobdir, batch)
    set_progress(jobdir, 3)
    assert verify_job(jobdir) == []


def test_a_modified_log_entry_is_corrupt(jobdir: JobDirectory) -> None:
    checkpoint_batch(jobdir, 2)
    checkpoint_batch(jobdir, 3)
    set_progress(jobdir, 3)
    Path(jobdir.checkpoint, "offsets", "3").write_text('v1\n{"batchId":3}\n{"0":6}')
    assert verify_job(jobdir) == ["Spark's offsets log entry for batch 3 is corrupt"]


def test_a_missing_log_entry(jobdir: JobDirectory) -> None:
    checkpoint_batch(jobdir, 2)
    checkpoint_batch(jobdir, 3)
    set_progress(jobdir, 3)
    os.unlink(Path(jobdir.checkpoint, "commits", "3"))
    os.unlink(Path(jobdir.checkpoint, "offsets", "2"))
    assert sorted(verify_job(jobdir)) == [
        "Spark's commits log entry for batch 3 is missing",
        "Spark's offsets log entry for batch 2 is missing",
    ]


def test_only_the_last_two_batches_are_compared(jobdir: JobDirectory) -> None:
    for batch in (1, 2, 3):
        checkpoint_batch(jobdir, batch)
    set_progress(jobdir, 3)
    Path(jobdir.checkpoint, "offsets", "1").write_text("changed")
    assert verify_job(jobdir) == []
    Path(jobdir.checkpoint, "offsets", "2").write_text("changed")
    assert verify_job(jobdir) == ["Spark's offsets log entry for batch 2 is corrupt"]


def test_a_corrupt_checksum_entry(jobdir: JobDirectory) -> None:
    checkpoint_batch(jobdir, 3)
    set_progress(jobdir, 3)
    entry = Path(jobdir.store.base, "checkpoint", "000000000003")
    head, _, body = entry.read_bytes().partition(b"\n")
    entry.write_bytes(head + b"\n" + body.replace(b"a", b"b", 1))
    problems = verify_job(jobdir)
    assert problems
    assert all("'checkpoint/000000000003'" in p for p in problems)
