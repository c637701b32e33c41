"""Nothing in a job's directory grows with the job's age: per-batch records are pruned to their
retention (an old job's unbounded manifests too), the verification before a restart reads the
same files at 10^5 batches as at 10^2, logs rotate, and ended drivers' records and logs are
pruned to the newest few."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epochal.base import logfiles, processes
from epochal.config import JobConfig
from epochal.control.launcher import prune_driver_logs
from epochal.metrics import recording
from epochal.state import retention
from epochal.state.jobs import JobDirectory, JobRecord
from epochal.state.layout import JobLayout
from epochal.state.lease.fence import Fence
from epochal.state.lease.session import prune_ended_sessions
from epochal.state.manifests import MANIFESTS, manifest_key, record_manifest, verify_job
from epochal.state.store import MAGIC

YOUNG, OLD = 100, 100_000
"""The two ages compared: 10^2 and 10^5 batches."""
BATCH_DIRECTORIES = {MANIFESTS, "decisions", "done", "keys", "offsets", "commits"}
"""Directories whose entries are named by batch."""


def _raw_entry(path: str, value: Any) -> None:
    """Write a store entry as the store does, without its fsync (10^5 of them in seconds)."""
    data = json.dumps(value, sort_keys=True).encode()
    header = {"count": 2, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    header["written"] = 0.0
    with open(path, "wb") as fh:
        fh.write(MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + data)


def _log_entries(checkpoint: str, batch: int) -> dict[str, str]:
    """Spark's offset and commit log entries of ``batch``, and their checksums."""
    digests = {}
    for log_name, text in (
        ("offsets", f'v1\n{{"batchId":{batch}}}\n{{"0":{batch}}}'),
        ("commits", 'v1\n{"nextBatchWatermarkMs":0}'),
    ):
        os.makedirs(f"{checkpoint}/{log_name}", exist_ok=True)
        Path(f"{checkpoint}/{log_name}/{batch}").write_text(text)
        digests[log_name] = hashlib.sha256(text.encode()).hexdigest()
    return digests


def _job_aged(root: Path, batches: int, *, unbounded_manifests: bool) -> JobDirectory:
    """A job's directory after ``batches`` batches, written the way a job's would be: Spark
    keeps its last 100 log entries, the transactional sink its last 100 decisions and done
    markers, the idempotent sink its last 10 key digests, and the manifests are either the
    retention's (today) or one per batch (an epochal before the retention)."""
    snapshots = str(root / "snapshots")
    jobdir = JobDirectory(snapshots, "aged")
    record = JobRecord("aged", "m:f", JobConfig(snapshot_dir=snapshots).to_dict())
    record.progress = {"batch": batches - 1}
    jobdir.save(record)
    store = jobdir.store
    last = batches - 1
    kept = range(max(0, batches - 100), batches)
    os.makedirs(f"{store.base}/{MANIFESTS}")
    for batch in kept:
        _raw_entry(f"{store.base}/{manifest_key(batch)}", _log_entries(jobdir.checkpoint, batch))
    if unbounded_manifests:  # the batches Spark no longer keeps: a few files, linked (fast)
        for batch in range(kept.start):
            template = f"{root}/forgotten-{batch // 50_000}"  # a file system's link limit
            if batch % 50_000 == 0:
                _raw_entry(template, {"offsets": "0" * 64, "commits": "0" * 64})
            os.link(template, f"{store.base}/{manifest_key(batch)}")
    for directory in ("sinks/out/decisions", "sinks/out/done", "sinks/copy/keys"):
        os.makedirs(f"{store.base}/{directory}")
    for batch in kept:
        _raw_entry(f"{store.base}/sinks/out/decisions/{batch:012d}", {"transactions": []})
        _raw_entry(f"{store.base}/sinks/out/done/{batch:012d}", {"batch": batch})
    for batch in range(last - 9, last + 1):
        _raw_entry(f"{store.base}/sinks/copy/keys/{batch:012d}-00000", {"count": 1, "total": 0})
    return jobdir


class _Reads:
    """The files a block opens and the directories it lists, counted through Python's audit
    hooks (every ``open``, ``os.listdir`` and ``os.scandir`` of this process), as paths
    relative to ``root`` (so that two job directories can be compared)."""

    active: _Reads | None = None

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.events: Counter[tuple[str, str]] = Counter()

    @staticmethod
    def hook(event: str, args: tuple[Any, ...]) -> None:
        reads = _Reads.active
        if reads is None or event not in ("open", "os.listdir", "os.scandir") or not args:
            return
        path = args[0]
        if isinstance(path, str) and path.startswith(reads.root):
            reads.events[(event, path[len(reads.root) :])] += 1


sys.addaudithook(_Reads.hook)


@pytest.fixture
def counted() -> Iterator[Any]:
    def count(root: Path, call: Any) -> tuple[Any, Counter[tuple[str, str]]]:
        _Reads.active = reads = _Reads(root)
        try:
            result = call()
        finally:
            _Reads.active = None
        return result, reads.events

    yield count


def test_an_old_jobs_restart_reads_what_a_young_ones_does_and_its_manifests_are_trimmed(
    tmp_path: Path, counted: Any
) -> None:
    """The verification before a restart at 10^5 batches (written by an epochal that kept
    every manifest) reads the same files as at 10^2; the job's next batches trim what it kept
    to the retention, and it stays there."""
    young = _job_aged(tmp_path / "young", YOUNG, unbounded_manifests=False)
    old = _job_aged(tmp_path / "old", OLD, unbounded_manifests=True)
    assert len(os.listdir(f"{old.store.base}/{MANIFESTS}")) == OLD  # what an old job kept

    problems, young_reads = counted(tmp_path / "young", lambda: verify_job(young))
    assert problems == []
    problems, old_reads = counted(tmp_path / "old", lambda: verify_job(old))
    assert problems == []

    def same_shape(reads: Counter[tuple[str, str]], batches: int) -> Counter[tuple[str, str]]:
        # a file of batch N of the old job stands for the file of batch N - (OLD - YOUNG) of
        # the young one
        shift = OLD - YOUNG if batches == OLD else 0
        out: Counter[tuple[str, str]] = Counter()
        for (event, path), n in reads.items():
            parts = path.split("/")
            for i in range(1, len(parts)):
                name, dash, rest = parts[i].partition("-")
                if name.isdigit() and parts[i - 1] in BATCH_DIRECTORIES:
                    number = str(int(name) - shift)
                    parts[i] = number.zfill(len(name) if len(name) == 12 else 0) + dash + rest
            out[(event, "/".join(parts))] += n
        return out

    assert same_shape(old_reads, OLD) == same_shape(young_reads, YOUNG)
    listed = {path for event, path in old_reads if event != "open"}
    assert not any(path.endswith(f"/{MANIFESTS}") for path in listed), listed
    assert sum(old_reads.values()) < 300

    # the full check (`jobs verify`) reads every manifest too: what a restart read before
    _, full_reads = counted(tmp_path / "young", lambda: verify_job(young, full=True))
    opened = Counter(event for event, _ in young_reads.elements())["open"]
    assert Counter(event for event, _ in full_reads.elements())["open"] == opened + YOUNG

    state = old.state_dir()
    manifests = f"{old.store.base}/{MANIFESTS}"
    for batch in range(OLD, OLD + 2 * retention.PRUNE_EVERY + 5):
        _log_entries(old.checkpoint, batch)
        record_manifest(state, batch, Fence(None, 0))
        kept = sorted(int(name) for name in os.listdir(manifests))
        assert len(kept) <= retention.MANIFEST_BATCHES + retention.PRUNE_EVERY
        assert kept[-1] == batch  # the newest is always there
    pruned_at = batch - batch % retention.PRUNE_EVERY
    assert kept[0] == pruned_at - retention.MANIFEST_BATCHES + 1
    old_record = old.load()
    old_record.progress = {"batch": batch}
    old.save(old_record)
    assert verify_job(old) == verify_job(old, full=True) == []


def test_a_restart_still_finds_a_corrupt_or_missing_log_entry_of_the_last_batches(
    tmp_path: Path,
) -> None:
    batches = 1_000
    old = _job_aged(tmp_path, batches, unbounded_manifests=True)
    Path(old.checkpoint, "offsets", str(batches - 2)).write_text("changed")
    Path(old.checkpoint, "commits", str(batches - 1)).unlink()
    assert sorted(verify_job(old)) == [
        f"Spark's commits log entry for batch {batches - 1} is missing",
        f"Spark's offsets log entry for batch {batches - 2} is corrupt",
    ]
    corrupt = Path(old.store.base, "sinks", "out", "decisions", f"{batches - 5:012d}")
    corrupt.write_bytes(corrupt.read_bytes().replace(b"transactions", b"transaktions"))
    assert any("corrupt" in p and "decisions" in p for p in verify_job(old))


def test_a_log_rotates_at_its_size_and_keeps_its_backups(tmp_path: Path) -> None:
    path = str(tmp_path / "logs" / "driver-1.log")
    log = logfiles.RotatingLog(path, max_bytes=1000, backups=2)
    lines = [f"line {i:05d} {'x' * 40}\n" for i in range(500)]
    for line in lines:
        log.write(line)
    log.close()
    parts = logfiles.parts(path)
    assert parts == [path, f"{path}.1", f"{path}.2"]
    assert all(os.path.getsize(p) <= 1000 for p in parts)
    kept = "".join(Path(p).read_text() for p in reversed(parts))
    assert kept.splitlines(keepends=True) == lines[-len(kept.splitlines()) :]  # the newest
    assert all(os.stat(p).st_mode & 0o077 == 0 for p in parts)


def test_a_log_several_processes_append_to_rotates_under_a_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "protocol.log")
    writer = (
        "import sys\nfrom epochal.base import logfiles\n"
        "for i in range(300):\n"
        "    logfiles.append_line(sys.argv[1], f'{sys.argv[2]} {i:04d} ' + 'y' * 30, 2000, 3)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", writer, path, str(n)]) for n in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    parts = logfiles.parts(path)
    assert len(parts) == 4
    assert all(os.path.getsize(p) < 2000 + 100 for p in parts)


def test_only_the_newest_drivers_logs_are_kept(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in range(1, 26):
        for name in (f"driver-{n}.log", f"driver-{n}.log.1"):
            (logs / name).write_text("x")
            os.utime(logs / name, (1_000 + n, 1_000 + n))
    (logs / "protocol.log").write_text("kept")
    deleted = prune_driver_logs(str(logs))
    assert len(deleted) == 2 * (25 - retention.DRIVER_LOGS)
    left = sorted(os.listdir(logs))
    assert "protocol.log" in left
    kept = {int(n.split("-")[1].split(".")[0]) for n in left if n.startswith("driver-")}
    assert kept == set(range(26 - retention.DRIVER_LOGS, 26))


def test_only_the_newest_ended_session_drivers_records_are_kept(tmp_path: Path) -> None:
    layout = JobLayout(str(tmp_path / "snapshots"), "plain")
    os.makedirs(layout.sessions)
    os.makedirs(layout.logs)
    host = socket.gethostname()
    dead = []
    for n in range(15):  # drivers that ended: pids that cannot be running (above pid_max)
        pid = 5_000_000 + n
        record = Path(layout.sessions, f"{host}-{pid}-{n}.json")
        record.write_text("{}")
        os.utime(record, (1_000 + n, 1_000 + n))
        Path(f"{record}.lock").write_text("")
        Path(layout.logs, f"session-{pid}.log").write_text("keeper")
        dead.append(pid)
    me = Path(layout.sessions, f"{host}-{os.getpid()}-{_start_ticks()}.json")
    me.write_text("{}")
    os.utime(me, (1, 1))  # the oldest record, but its driver is alive
    deleted = prune_ended_sessions(layout)
    assert len(deleted) == 15 - retention.DRIVER_RECORDS
    left = set(os.listdir(layout.sessions))
    assert me.name in left
    assert {f"{host}-{pid}-{n}.json" for n, pid in enumerate(dead)} & left == {
        f"{host}-{pid}-{n}.json" for n, pid in enumerate(dead) if n >= 15 - retention.DRIVER_RECORDS
    }
    assert len(os.listdir(layout.logs)) == retention.DRIVER_RECORDS
    assert len([n for n in left if n.endswith(".lock")]) == retention.DRIVER_RECORDS


def _start_ticks() -> int:
    return processes.start_ticks(os.getpid()) or 0


def test_metric_reports_nobody_collects_are_bounded(tmp_path: Path) -> None:
    """A driver without a progress listener collects no metric reports: the driver-side
    reports of its parts keep the pending ones to the newest few."""
    job_dir = str(tmp_path / "snapshots" / "plain")
    os.makedirs(job_dir)
    for batch in range(12):
        for _task in range(4):  # what the tasks of a batch leave
            recording.report(job_dir, "sink", "out", "map", batch, {"rows": 1.0}, task_side=True)
    pending = Path(job_dir, "metrics", recording.PENDING)
    assert len(os.listdir(pending)) == 48
    recording.trim_pending(str(pending), keep=10)
    assert len(os.listdir(pending)) == 10
    for batch in range(retention.PENDING_METRICS // 4 + 20):  # a long run, never collected
        for task in range(4):
            path = pending / f"sink-out-{batch}-{task}.json"
            path.write_text("{}")
    assert len(os.listdir(pending)) > retention.PENDING_METRICS
    recording.report(job_dir, "sink", "out", "map", 20, {"rows": 1.0})  # a commit, due
    assert len(os.listdir(pending)) == retention.PENDING_METRICS


def test_every_bound_is_listed_once_and_the_reference_states_it() -> None:
    bounds = retention.bounds()
    assert len({b.record for b in bounds}) == len(bounds)
    assert retention.MANIFEST_BATCHES >= 2 and retention.DECISION_BATCHES >= 50
    page = (Path(__file__).resolve().parents[2] / "docs/reference/retention.md").read_text()
    for bound in bounds:
        shown = f"{bound.kept // 1024 // 1024} MiB" if bound.unit == "bytes" else str(bound.kept)
        assert shown in page, (bound, shown)
    assert f"every {retention.PRUNE_EVERY} batches" in page
