"""``epochal in-doubt``: one command for every transactional sink, through the contract
(here the map sink, a real SQLite file): list a job's in-doubt transactions with their
decisions, settle them, refuse while the job runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from epochal.config import JobConfig
from epochal.control.job_requests import request, submit
from epochal.ops import cli
from epochal.ops.indoubt import main
from epochal.protocols.transactions import two_phase_commit
from epochal.state.jobs import JobDirectory, JobStatus
from epochal.state.locks import JobError
from epochal.testing import prepare_transaction
from epochal_map import MapSink, MapStore
from epochal_sdk import ConnectorContext, Options, Prepared
from epochal_sdk.schema import Field

SCHEMA = (Field("key", "string"), Field("value", "string"))
JOB, SINK_ID = "ops", "map-ops"


def _sink(path: Path, job: str = JOB) -> MapSink:
    options = {"path": str(path), "map": "out", "mode": "transactional"}
    return MapSink(Options("map", options, ConnectorContext(job=job, part_id=SINK_ID)))


def _prepare(
    sink: MapSink, job: str, batch: int, key: str, incarnation: str = "", sink_id: str = SINK_ID
) -> Prepared:
    task = ConnectorContext(job, sink_id, batch, 0, 0, SCHEMA, run=1, incarnation=incarnation)
    return prepare_transaction(sink, task, pa.record_batch({"key": [key], "value": [key]}))


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, Path, Prepared, Prepared, Prepared]:
    """A job with one decided and one undecided transaction, and another job's one."""
    snapshots, target = tmp_path / "snapshots", tmp_path / "target.sqlite"
    submit(JOB, "nowhere:job", JobConfig(snapshot_dir=str(snapshots)))
    jobdir = JobDirectory(str(snapshots), JOB)
    incarnation = jobdir.load().incarnation
    sink = _sink(target)
    sink.check(SCHEMA)
    decided = _prepare(sink, JOB, 1, "decided", incarnation)
    undecided = _prepare(sink, JOB, 2, "undecided", incarnation)
    other = _prepare(sink, "another", 1, "theirs")
    store = jobdir.store
    protocol, _ = two_phase_commit(store, sink, JOB, SINK_ID, incarnation=incarnation, run=None)
    protocol.decide(1, [decided])
    options = {"path": str(target), "map": "out", "mode": "transactional"}
    store.write_json(
        f"parts/sink-{SINK_ID}",
        {"kind": "sink", "connector": "map", "contract": "transactional", "options": options},
    )
    sink.close()
    return snapshots, target, decided, undecided, other


def test_list_shows_each_transaction_of_the_job_with_its_decision(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots, _, decided, undecided, other = staged
    assert main(["list", JOB, "--snapshot-dir", str(snapshots)]) == 0
    out = capsys.readouterr().out
    assert f"{decided.transaction_id}  batch 1  run 1  sink {SINK_ID} (map)  decided: commit" in out
    assert f"{undecided.transaction_id}  batch 2  run 1" in out and "undecided: roll back" in out
    assert other.transaction_id not in out


def test_settle_is_refused_while_the_job_runs_then_commits_and_rolls_back(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots, target, _, _, other = staged
    JobDirectory(str(snapshots), JOB).lease.acquire("a-live-supervisor")
    assert main(["settle", JOB, "--snapshot-dir", str(snapshots)]) == 2
    assert "settling now would roll back" in capsys.readouterr().err

    assert main(["settle", JOB, "--snapshot-dir", str(snapshots), "--force"]) == 0
    assert "finished 1 decided batch(es) [1], rolled back 1" in capsys.readouterr().out
    with MapStore(str(target)) as store:
        assert store.entries("out") == {"decided": "decided"}
        assert store.in_doubt("ep.") == [other.transaction_id]  # another job's: untouched
    assert main(["list", JOB, "--snapshot-dir", str(snapshots)]) == 0
    assert "no in-doubt transactions" in capsys.readouterr().out


def test_sinks_the_store_does_not_record_are_found_with_their_connector(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots, target, decided, _, _ = staged
    JobDirectory(str(snapshots), JOB).store.delete(f"parts/sink-{SINK_ID}")
    assert main(["list", JOB, "--snapshot-dir", str(snapshots)]) == 2
    assert "--connector" in capsys.readouterr().err
    found = [
        "list", JOB, "--snapshot-dir", str(snapshots), "--connector", "map",
        "-o", f"path={target}", "-o", "map=out", "-o", "mode=transactional",
    ]  # fmt: skip
    assert main(found) == 0
    assert f"{decided.transaction_id}  batch 1  run 1  sink {SINK_ID} (map)" in (
        capsys.readouterr().out
    )


def test_the_cli_runs_it(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots, _, decided, _, _ = staged
    with pytest.raises(SystemExit) as done:
        cli.main(["in-doubt", "list", JOB, "--snapshot-dir", str(snapshots)])
    assert done.value.code == 0
    assert decided.transaction_id in capsys.readouterr().out


def test_an_option_given_as_a_reference_is_resolved_so_no_secret_is_on_the_command_line(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshots, target, decided, _, _ = staged
    JobDirectory(str(snapshots), JOB).store.delete(f"parts/sink-{SINK_ID}")
    monkeypatch.setenv("EPOCHAL_TEST_TARGET", str(target))
    found = [
        "list", JOB, "--snapshot-dir", str(snapshots), "--connector", "map",
        "-o", "path=${env:EPOCHAL_TEST_TARGET}", "-o", "map=out", "-o", "mode=transactional",
    ]  # fmt: skip
    assert main(found) == 0
    assert decided.transaction_id in capsys.readouterr().out


# -- a job's end settles what it left in doubt -------------------------------------------------
def _job(snapshots: Path) -> JobDirectory:
    return JobDirectory(str(snapshots), JOB)


def test_cancel_settles_the_jobs_transactions_before_deleting_its_snapshots(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared],
) -> None:
    snapshots, target, _, undecided, other = staged
    said: list[str] = []
    record = request(_job(snapshots), "cancel", report=said.append)
    assert record.status == JobStatus.CANCELLED
    assert not _job(snapshots).store.list("parts")  # the snapshots went, after settling
    with MapStore(str(target)) as store:
        assert store.entries("out") == {"decided": "decided"}
        assert store.in_doubt("ep.") == [other.transaction_id]  # another job's: untouched
        assert store.transaction_state(undecided.transaction_id) == "rolled_back"
    assert any("finished 1 decided batch(es) [1], rolled back 1" in line for line in said)


def _unreachable(snapshots: Path) -> None:
    """The sink's record now names a store that cannot be opened."""
    options = {"path": str(snapshots / "gone" / "x" / "t.sqlite"), "map": "out"}
    _job(snapshots).store.write_json(
        f"parts/sink-{SINK_ID}",
        {"kind": "sink", "connector": "map", "contract": "transactional", "options": options},
    )


def test_cancel_is_refused_with_the_transactions_and_the_command_when_a_sink_is_unreachable(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared],
) -> None:
    snapshots, target, decided, _, _ = staged
    _unreachable(snapshots)
    with pytest.raises(JobError) as refused:
        request(_job(snapshots), "cancel")
    message = str(refused.value)
    prefix = decided.transaction_id.rsplit(".", 4)[0]
    assert f"sink {SINK_ID} (map): its prepared transactions {prefix}.*" in message
    assert f"decided to commit, not yet done: {decided.transaction_id}" in message
    assert f"python -m epochal in-doubt settle {JOB} --snapshot-dir {snapshots}" in message
    assert "--force" in message
    assert _job(snapshots).load().status != JobStatus.CANCELLED  # nothing deleted
    assert _job(snapshots).store.list("parts")

    said: list[str] = []
    record = request(_job(snapshots), "cancel", force=True, report=said.append)
    assert record.status == JobStatus.CANCELLED
    assert any("stay prepared" in line and prefix in line for line in said)
    assert any("in-doubt settle ops" in line and "--connector map" in line for line in said)
    with MapStore(str(target)) as store:  # left as they were, and said so
        assert len(store.in_doubt(prefix + ".")) == 2


def test_a_replaced_job_gets_a_new_incarnation_after_its_old_transactions_are_settled(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared],
) -> None:
    snapshots, target, _, undecided, _ = staged
    before = _job(snapshots).load().incarnation
    submit(JOB, "nowhere:job", JobConfig(snapshot_dir=str(snapshots)), replace=True)
    after = _job(snapshots).load().incarnation
    assert after and after != before
    with MapStore(str(target)) as store:
        assert store.entries("out") == {"decided": "decided"}
        assert store.transaction_state(undecided.transaction_id) == "rolled_back"
    # the new job's ids are not the old one's: the same batch, partition, run and attempt
    sink = _sink(target)
    fresh = _prepare(sink, JOB, 1, "again", after)
    sink.close()
    assert fresh.transaction_id != undecided.transaction_id.replace(".2.0.1.0", ".1.0.1.0")


def test_replace_is_refused_when_the_old_jobs_sink_is_unreachable_unless_forced(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared],
) -> None:
    snapshots, _, _, _, _ = staged
    _unreachable(snapshots)
    before = _job(snapshots).load().incarnation
    config = JobConfig(snapshot_dir=str(snapshots))
    with pytest.raises(JobError, match="refusing to start the job over"):
        submit(JOB, "nowhere:job", config, replace=True)
    assert _job(snapshots).load().incarnation == before
    submit(JOB, "nowhere:job", config, replace=True, force=True)
    assert _job(snapshots).load().incarnation != before


def test_in_doubt_finds_a_predecessors_transactions_by_their_connector(
    staged: tuple[Path, Path, Prepared, Prepared, Prepared], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshots, target, _, undecided, _ = staged
    _unreachable(snapshots)
    submit(JOB, "nowhere:job", JobConfig(snapshot_dir=str(snapshots)), replace=True, force=True)
    settle = [
        "settle", JOB, "--snapshot-dir", str(snapshots), "--connector", "map",
        "-o", f"path={target}", "-o", "map=out", "-o", "mode=transactional",
    ]  # fmt: skip
    assert main(settle) == 0
    assert "rolled back 2" in capsys.readouterr().out  # no decisions of its own: rolled back
    with MapStore(str(target)) as store:
        assert store.transaction_state(undecided.transaction_id) == "rolled_back"
        assert store.in_doubt(f"ep.{JOB}.") == []
