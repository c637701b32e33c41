"""``epochal in-doubt``: one command for every transactional sink, through the contract
(here the map sink, a real SQLite file): list a job's in-doubt transactions with their
decisions, settle them, refuse while the job runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from epochal.config import JobConfig
from epochal.control.job_requests import submit
from epochal.ops import cli
from epochal.ops.indoubt import main
from epochal.protocols.transactions import two_phase_commit
from epochal.state.jobs import JobDirectory
from epochal.testing import prepare_transaction
from epochal_map import MapSink, MapStore
from epochal_sdk import ConnectorContext, Options, Prepared
from epochal_sdk.schema import Field

SCHEMA = (Field("key", "string"), Field("value", "string"))
JOB, SINK_ID = "ops", "map-ops"


def _sink(path: Path, job: str = JOB) -> MapSink:
    options = {"path": str(path), "map": "out", "mode": "transactional"}
    return MapSink(Options("map", options, ConnectorContext(job=job, part_id=SINK_ID)))


def _prepare(sink: MapSink, job: str, batch: int, key: str) -> Prepared:
    task = ConnectorContext(job, SINK_ID, batch, 0, 0, SCHEMA, run=1)
    return prepare_transaction(sink, task, pa.record_batch({"key": [key], "value": [key]}))


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, Path, Prepared, Prepared, Prepared]:
    """A job with one decided and one undecided transaction, and another job's one."""
    snapshots, target = tmp_path / "snapshots", tmp_path / "target.sqlite"
    submit(JOB, "nowhere:job", JobConfig(snapshot_dir=str(snapshots)))
    sink = _sink(target)
    sink.check(SCHEMA)
    decided, undecided = _prepare(sink, JOB, 1, "decided"), _prepare(sink, JOB, 2, "undecided")
    other = _prepare(sink, "another", 1, "theirs")
    store = JobDirectory(str(snapshots), JOB).store
    protocol, _ = two_phase_commit(store, sink, JOB, SINK_ID, incarnation="", run=None)
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
