"""Changes to a running job, each made twice in the middle of one stream: once after a clean
suspend, once after a kill that left a batch's transactions prepared (the decision of batch 5
never made, the job failed with restarts off), with lost, duplicated and in-doubt records
counted by key in the sink's own journal (docs/how-to/change-a-running-job.md).

The job (map journal 'input' → map 'output', exactly-once, two-phase commit, 50 records a
batch): batches 0-3 take the first 200 records; the job is suspended; the first change is
made and 50 more records arrive; resumed, it writes them (batch 4); 50 more arrive and batch 5
is killed before its decision; the second change is made; resumed, the job settles what the
kill left and writes batch 5 again; every key must be in the output once, nothing prepared.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from epochal import Job, JobConfig, JobStatus
from epochal.testing.scenarios import LOCAL, TEST_SPARK_CONF
from epochal_map import MapStore
from epochal_sdk import TransactionId

pytestmark = pytest.mark.spark

KILL_AT = 5
"""The batch whose decision is never made: the first of the second change's records."""


def _config(snapshot_dir: Path) -> JobConfig:
    return JobConfig(
        snapshot_dir=str(snapshot_dir),
        available_now=False,
        snapshot_interval=0.5,
        restart_backoff=0.2,
        max_restarts=0,
        faults=f"sink.before_decision@{KILL_AT}",
        master=LOCAL,
        spark_conf=dict(TEST_SPARK_CONF),
    )


def _add(map_path: str, start: int, end: int) -> None:
    with MapStore(map_path) as store:
        store.append_events("input", [(str(i), f"v{i}") for i in range(start, end)])


def _outputs(map_path: str, maps: list[str]) -> dict[str, dict[str, str]]:
    with MapStore(map_path) as store:
        return {name: store.entries(name) for name in maps}


def _written(map_path: str, maps: list[str]) -> int:
    """Every record the maps' journals hold (a key written twice counts twice)."""
    with MapStore(map_path) as store:
        return sum(
            store.journal_end(name, p) for name in maps for p in store.journal_partitions(name)
        )


def _prepared(map_path: str) -> list[str]:
    with MapStore(map_path) as store:
        return store.in_doubt("ep.")


def _wait(condition: Callable[[], object], what: str, job: Job, seconds: float = 240.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {_account(job)}")
        time.sleep(0.2)


def _account(job: Job) -> str:
    """The job's record and the end of its driver logs, for a failure message."""
    record = job.status()
    logs = sorted(Path(job.jobdir.logs).glob("*.log"))

    tails = "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-3000:] for p in logs)
    return f"{record.status} runs={record.runs} driver={record.driver}{tails}"


def _count(map_path: str, maps: list[str]) -> int:
    return sum(len(entries) for entries in _outputs(map_path, maps).values())


def _run_with_two_changes(
    tmp_path: Path,
    map_path: str,
    change: Callable[[int], None],
    maps: list[str],
    snapshot_dirs: tuple[Path, Path, Path] | None = None,
) -> dict[str, int]:
    """The stream of the module's docstring; ``change(1)`` after the suspend, ``change(2)``
    after the kill; ``snapshot_dirs`` the directory the job starts in and the ones it is
    resumed from after each change (the same one by default). The counts: lost, duplicated
    and in-doubt records, and the records written (the journals' length)."""
    first, second, third = snapshot_dirs or (tmp_path / "snapshots",) * 3
    job = Job.submit("changed", "pipelines:copy", _config(first), report=lambda line: None)
    _wait(lambda: _count(map_path, maps) == 200, "batches 0-3", job)
    job.suspend()
    assert job.join(120).status == JobStatus.SUSPENDED
    change(1)
    _add(map_path, 200, 250)
    job = Job("changed", str(second)).resume(report=lambda line: None)
    _wait(lambda: _count(map_path, maps) == 250, "batch 4, after the first change", job)
    _add(map_path, 250, 300)
    record = job.join(240)
    assert record.status == JobStatus.FAILED, record
    assert _prepared(map_path), f"the kill at batch {KILL_AT} left nothing prepared"
    assert _count(map_path, maps) == 250
    change(2)
    job = Job("changed", str(third)).resume(report=lambda line: None)
    _wait(lambda: _count(map_path, maps) >= 300, "batch 5 again, after the second change", job)
    job.cancel()
    keys = [key for entries in _outputs(map_path, maps).values() for key in entries]
    counts = {
        "lost": len(set(map(str, range(300))) - set(keys)),
        "duplicated": len(keys) - len(set(keys)),
        "in_doubt": len(_prepared(map_path)),
        "written": _written(map_path, maps),
    }
    return counts


EXACTLY_ONCE = {"lost": 0, "duplicated": 0, "in_doubt": 0, "written": 300}


def test_changed_code_that_keeps_its_parts_carries_everything_over(
    tmp_path: Path, map_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed transformation (a prefix before each value): the sink part keeps its id;
    the batch the kill interrupted is written again by the new code."""

    def change(step: int) -> None:
        monkeypatch.setenv("EPOCHAL_TEST_VALUE_PREFIX", f"code{step}-")

    counts = _run_with_two_changes(tmp_path, map_path, change, ["output"])
    assert counts == EXACTLY_ONCE, counts
    output = _outputs(map_path, ["output"])["output"]
    assert {output[str(i)] for i in (0, 199)} == {"v0", "v199"}
    assert output["220"] == "code1-v220" and output["270"] == "code2-v270"


def test_a_changed_connector_option_settles_the_old_part(
    tmp_path: Path, map_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed option that names the sink's target (another map): a new part id each
    time; the old part's record is dropped at the next run, and what the kill left prepared
    under it is rolled back, its batch written to the new target."""

    def change(step: int) -> None:
        monkeypatch.setenv("EPOCHAL_TEST_OUTPUT", f"output{step + 1}")

    maps = ["output", "output2", "output3"]
    counts = _run_with_two_changes(tmp_path, map_path, change, maps)
    assert counts == EXACTLY_ONCE, counts
    sizes = {name: len(entries) for name, entries in _outputs(map_path, maps).items()}
    assert sizes == {"output": 200, "output2": 50, "output3": 50}, sizes


def test_a_changed_parallelism_of_the_sinks_input_is_carried_over(
    tmp_path: Path, map_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink's input repartitioned (3, then 2 Spark partitions): the transactions of a
    batch share its prefix whatever their partitions, so the kill's prepared transactions
    (3 partitions) are rolled back and the batch is written again in 2."""

    def change(step: int) -> None:
        monkeypatch.setenv("EPOCHAL_TEST_PARTITIONS", str(4 - step))

    counts = _run_with_two_changes(tmp_path, map_path, change, ["output"])
    assert counts == EXACTLY_ONCE, counts
    committed = _committed_partitions(map_path)
    assert committed[4] == {0, 1, 2} and committed[KILL_AT] == {0, 1}, committed


def test_changed_shuffle_partitions_of_a_stateless_shuffle_take_effect_and_are_carried_over(
    tmp_path: Path, map_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spark.sql.shuffle.partitions`` set by the job's code (3, then 4 after the suspend,
    then 1 after the kill) before a shuffle by key into the sink. A stateless shuffle takes
    the number the code sets when the query is built (only a stateful operator's is fixed by
    the checkpoint), so this is a change of the sink's parallelism: batch 4 is written in 4
    partitions; the kill's prepared transactions (4 partitions) are rolled back and the batch
    is written again in 1."""
    monkeypatch.setenv("EPOCHAL_TEST_SHUFFLE_PARTITIONS", "3")

    def change(step: int) -> None:
        monkeypatch.setenv("EPOCHAL_TEST_SHUFFLE_PARTITIONS", "4" if step == 1 else "1")

    counts = _run_with_two_changes(tmp_path, map_path, change, ["output"])
    assert counts == EXACTLY_ONCE, counts
    committed = sorted(_committed_partitions(map_path).items())
    three, four, one = {0, 1, 2}, {0, 1, 2, 3}, {0}
    assert committed == [(0, three), (1, three), (2, three), (3, three), (4, four), (5, one)], (
        committed
    )


def _committed_partitions(map_path: str) -> dict[int, set[int]]:
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(map_path)) as conn:
        rows = conn.execute("SELECT txn_id FROM txns WHERE state = 'committed'").fetchall()
    found: dict[int, set[int]] = {}
    for (text,) in rows:
        txn = TransactionId.parse(text)
        if txn is not None:
            found.setdefault(txn.batch, set()).add(txn.partition)
    return found


def test_a_moved_snapshot_directory_is_resumed_from_its_new_place(
    tmp_path: Path, map_path: str
) -> None:
    """The snapshot directory moved (renamed) while the job is suspended, and again after the
    kill: resumed from the new place, the job finds its checkpoint, its snapshots and what the
    kill left prepared there, and nothing is left in the old places."""
    places = (tmp_path / "a", tmp_path / "b", tmp_path / "c")

    def change(step: int) -> None:
        shutil.move(str(places[step - 1]), str(places[step]))

    counts = _run_with_two_changes(tmp_path, map_path, change, ["output"], places)
    assert counts == EXACTLY_ONCE, counts
    assert not os.path.exists(places[0]) and not os.path.exists(places[1])
