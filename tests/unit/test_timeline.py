"""A batch's timeline (epochal.metrics.timeline): on only when asked, each step marked once,
kept per batch within its bound, readable by its owner only; and the benchmark that takes a
batch apart accounts for every millisecond of ``addBatch``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from epochal.metrics import timeline
from epochal.parts.job_context import JobContext
from epochal.state import retention
from integration.bench.batch_timeline import SEGMENTS, take_apart


def test_the_timeline_is_on_only_when_an_option_or_the_environment_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(timeline.ENV, raising=False)
    assert not JobContext.current({}).timeline
    assert not JobContext.current({timeline.OPTION: "false"}).timeline
    assert JobContext.current({timeline.OPTION: "true"}).timeline
    assert JobContext.current({"EPOCHAL.TIMELINE": "True"}).timeline  # Spark's case-free keys
    monkeypatch.setenv(timeline.ENV, "1")
    assert JobContext.current({}).timeline


def test_a_step_is_marked_once_and_a_task_counts_the_tasks_of_its_process() -> None:
    first, second = timeline.Marks(task=True), timeline.Marks(task=True)
    first.mark("first_rows")
    at = first.values["first_rows"]
    first.mark("first_rows")  # every later batch of rows: the step started already
    assert first.values["first_rows"] == at
    assert second.values["process_tasks"] == first.values["process_tasks"] + 1
    driver = timeline.Marks(task=False)
    assert driver.values["process_tasks"] == second.values["process_tasks"]
    assert first.as_dict()["pid"] == os.getpid()


def test_timelines_are_kept_for_the_newest_batches_only_and_for_their_owner(
    tmp_path: Path,
) -> None:
    job_dir = str(tmp_path / "job")
    batches = 3 * retention.TIMELINE_BATCHES
    for batch in range(batches):
        marks = timeline.Marks(task=False)
        marks.mark("entered")
        written = timeline.write(job_dir, "sink-a", batch, marks, [{"entered": 1.0}, None])
        assert written is not None
    kept = timeline.read(job_dir)
    assert len(kept) <= retention.TIMELINE_BATCHES + retention.PRUNE_EVERY
    assert [k["batch"] for k in kept] == list(range(batches - len(kept), batches))
    assert kept[-1]["tasks"] == [{"entered": 1.0}]  # a task with no marks is left out
    for name in os.listdir(f"{job_dir}/metrics/{timeline.DIRECTORY}"):
        mode = os.stat(f"{job_dir}/metrics/{timeline.DIRECTORY}/{name}").st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, (name, oct(mode))
    assert timeline.write(None, "sink-a", 1, timeline.Marks(task=False), []) is None


def _status_time(seconds: float) -> str:
    """A time as Spark's status API writes it."""
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}GMT"


def test_the_segments_of_a_batch_add_up_to_its_add_batch() -> None:
    start = 1_800_000_000.0  # the write job's submission
    job = {"submissionTime": _status_time(start), "completionTime": _status_time(start + 0.5)}
    tasks = [
        {"taskId": n, "launchTime": _status_time(start + 0.02 * n), "duration": 400 + 20 * n,
         "taskMetrics": {"executorDeserializeTime": 5}}
        for n in (1, 2)
    ]  # fmt: skip
    ends = [start + 0.02 * n + (400 + 20 * n) / 1000 for n in (1, 2)]
    marks = {
        "tasks": [
            {"entered": ends[i] - 0.35, "began": ends[i] - 0.34, "first_rows": ends[i] - 0.3,
             "rows_done": ends[i] - 0.1, "in_write": 0.15, "prepared": ends[i] - 0.05,
             "returned": ends[i] - 0.01, "process_tasks": 1.0 + i}
            for i in (0, 1)
        ],
        "driver": {"entered": start + 0.55, "decided": start + 0.58, "completed": start + 0.6,
                   "reported": start + 0.61},
    }  # fmt: skip
    progress = {"batchId": 3, "numInputRows": 10, "durationMs": {"addBatch": 700.0}}
    cut = take_apart("epochal exactly-once", 2, progress, [job], tasks, marks)
    assert set(cut.segments) <= {name for name, _ in SEGMENTS}
    assert sum(cut.segments.values()) == pytest.approx(700.0, abs=1.0), cut.segments
    assert cut.segments["decision"] == pytest.approx(30.0, abs=1.0)
    assert cut.segments["writing"] == pytest.approx(150.0, abs=1.0)  # in the write calls
    assert cut.segments["more rows"] == pytest.approx(50.0, abs=1.0)  # the rest of the loop
    assert cut.segments["rest of addBatch"] == pytest.approx(90.0, abs=1.0)
    assert cut.fresh_workers == 1 and cut.tasks == 2
