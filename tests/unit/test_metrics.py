"""Job metrics: what the protocol steps report, folded per batch and per part by the driver,
shown by ``jobs status``, and scraped over HTTP from the supervisor's endpoint in Prometheus
text format (checked line by line against the format's grammar)."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from epochal.config import JobConfig
from epochal.control.job_requests import submit
from epochal.control.supervisor import Supervisor
from epochal.metrics import exposition, recording
from epochal.ops.status import job_status, render
from epochal.state.jobs import JobDirectory

JOB = "metered"
SINK, SOURCE = "jdbc-0011223344", "map-5566778899"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? "
    r"(?P<value>[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))$"
)


def parse_exposition(text: str) -> dict[str, dict[str, float]]:
    """Prometheus text format 0.0.4, strictly: every family has one HELP and one TYPE
    before its samples, every sample belongs to the family declared last (a summary's
    ``_sum``/``_count``), no family appears twice. Returns family → sample line → value."""
    assert text.endswith("\n")
    families: dict[str, dict[str, float]] = {}
    kinds: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(_NAME, name) and name not in families, line
            families[name], current = {}, name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and kind in ("counter", "gauge", "summary"), line
            kinds[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            assert current is not None and current in kinds, line
            allowed = {current}
            if kinds[current] == "summary":
                allowed = {f"{current}_sum", f"{current}_count"}
            assert match["name"] in allowed, line
            families[current][line.rsplit(" ", 1)[0]] = float(match["value"])
    return families


def value(families: dict[str, dict[str, float]], family: str, **labels: str) -> float:
    """The one sample of ``family`` whose labels include ``labels``."""
    found = [
        v
        for sample, v in families[family].items()
        if all(f'{k}="{want}"' in sample for k, want in labels.items())
    ]
    assert len(found) == 1, (family, labels, families.get(family))
    return found[0]


@pytest.fixture
def jobdir(tmp_path: Path) -> JobDirectory:
    """A job that ran twice (one restart), with its parts recorded as a run records them."""
    snapshots = str(tmp_path / "snapshots")
    jobdir = submit(JOB, "nowhere:build", JobConfig(snapshot_dir=snapshots))
    with jobdir.update() as record:
        record.run, record.restarts = 2, 1
        record.progress = {"batch": 4, "rows": 500}
        record.runs = [
            {"run": 1, "kind": "cold", "first_batch_s": 9.5},
            {"run": 2, "kind": "in-place", "first_batch_s": 1.5, "recovery_s": 2.25},
        ]
    store = jobdir.store
    store.write_json(
        f"parts/sink-{SINK}",
        {"kind": "sink", "connector": "jdbc", "guarantee": "exactly-once", "contract": "x"},
    )
    store.write_json(
        f"parts/source-{SOURCE}",
        {"kind": "source", "connector": "map", "guarantee": "at-least-once"},
    )
    return jobdir


def _report_two_batches(jobdir: JobDirectory) -> None:
    sink = {"records_out": 100, "bytes_out": 2048, "decide_seconds": 0.01}
    sink |= {"decide_seconds_count": 1, "commit_seconds": 0.02, "commit_seconds_count": 1}
    for batch in (3, 4):
        recording.report(jobdir.path, "sink", SINK, "jdbc", batch, sink)
        recording.report(jobdir.path, "source", SOURCE, "map", None, {"records_in": 100})
        recording.report(jobdir.path, "sink", SINK, "jdbc", None, {"in_doubt": 2, "rolled_back": 2})
        recording.report(jobdir.path, "sink", SINK, "jdbc", batch, {"connector.round_trips": 3})
        progress = {"numInputRows": 100, "durationMs": {"addBatch": 1500, "walCommit": 20}}
        recording.collect(jobdir.path, batch, progress, jobdir.load().created)


def test_steps_reports_are_folded_per_batch_and_part(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    state = recording.load_state(jobdir.path)
    sink = state["parts"][f"sink-{SINK}"]
    assert sink["totals"]["records_out"] == 200
    assert sink["totals"]["in_doubt"] == 4 and sink["totals"]["batches"] == 2
    assert [b["batch"] for b in sink["batches"]] == [3, 4]
    assert sink["batches"][-1]["values"]["connector.round_trips"] == 3
    assert state["parts"][f"source-{SOURCE}"]["batches"][-1]["batch"] == 4  # no batch: the next
    assert state["spark"]["input_rows_total"] == 200
    assert not list(Path(recording.metrics_dir(jobdir.path), recording.PENDING).glob("*.json"))


def test_records_committed_count_once_per_batch_however_often_it_is_reported(
    jobdir: JobDirectory,
) -> None:
    """A replayed or recovered batch reports its committed records again: the total counts
    each batch once, by its largest report, in whatever order the reports are folded."""
    for batch, records in ((3, 100), (4, 80), (4, 80), (3, 100), (5, 0), (5, 60)):
        recording.report(jobdir.path, "sink", SINK, "jdbc", batch, {"records_committed": records})
        recording.report(jobdir.path, "sink", SINK, "jdbc", batch, {"records_out": records})
    state = recording.collect(jobdir.path, 5, None, jobdir.load().created)
    totals = state["parts"][f"sink-{SINK}"]["totals"]
    assert totals["records_committed"] == 240
    assert totals["records_out"] == 420  # written: every attempt counts


def test_a_sources_committed_records_count_each_task_once_and_the_batch_as_their_sum(
    jobdir: JobDirectory,
) -> None:
    """A source's read tasks report their share of a batch with their Spark partition: a
    retried or replayed task reports its share again, which counts once; the batch is the
    sum of its tasks' shares."""
    reports = ((7, 0, 40), (7, 1, 60), (7, 1, 60), (7, 0, 40), (8, 0, 30), (8, 1, 0))
    for batch, task, records in reports:
        values = {"records_committed": records, "records_in": records}
        recording.report(jobdir.path, "source", SOURCE, "map", batch, values, task=task)
    state = recording.collect(jobdir.path, 8, None, jobdir.load().created)
    totals = state["parts"][f"source-{SOURCE}"]["totals"]
    assert totals["records_committed"] == 130
    assert totals["records_in"] == 230  # read: every attempt counts


def test_a_job_started_over_starts_its_metrics_over(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    recording.report(jobdir.path, "sink", SINK, "jdbc", 0, {"records_out": 7})
    state = recording.collect(jobdir.path, 0, None, job_created=jobdir.load().created + 1)
    assert state["parts"][f"sink-{SINK}"]["totals"]["records_out"] == 7


def test_status_shows_each_part(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    text = render(job_status(jobdir))
    assert f"sink {SINK} (jdbc, exactly-once): out 200 rec/4.0KB, in doubt 4, rolled back 4" in (
        text
    )
    assert "last batch 4: decide 10ms, commit 20ms" in text
    assert f"source {SOURCE} (map, at-least-once): in 200 rec" in text


def test_status_includes_reports_not_collected_yet(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    recording.report(jobdir.path, "sink", SINK, "jdbc", 5, {"records_out": 1})  # after the end
    part = job_status(jobdir)["metrics"]["parts"][f"sink-{SINK}"]
    assert part["guarantee"] == "exactly-once" and part["totals"]["records_out"] == 201
    assert part["last_batch"]["batch"] == 5
    assert (
        recording.load_state(jobdir.path)["parts"][f"sink-{SINK}"]["totals"]["records_out"] == 200
    )


def test_the_exposition_has_job_part_and_connector_metrics(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    families = parse_exposition(exposition.render_prometheus(jobdir))
    assert value(families, "epochal_job_restarts_total", job=JOB) == 1
    assert value(families, "epochal_job_runs_total", job=JOB) == 2
    assert value(families, "epochal_job_last_recovery_seconds", job=JOB) == 2.25
    assert value(families, "epochal_part_guarantee", part=SINK, guarantee="exactly-once") == 2
    assert value(families, "epochal_part_guarantee", part=SOURCE) == 1
    assert value(families, "epochal_part_records_out_total", part=SINK) == 200
    assert value(families, "epochal_part_records_in_total", part=SOURCE) == 200
    assert value(families, "epochal_part_in_doubt_total", part=SINK) == 4
    assert value(families, "epochal_connector_round_trips_total", part=SINK) == 6
    summary = families["epochal_part_phase_seconds"]
    assert [v for s, v in summary.items() if "_count{" in s and 'phase="commit"' in s] == [2]
    assert value(families, "epochal_batch_duration_seconds", phase="addBatch") == 1.5


def test_the_supervisor_serves_the_metrics_for_a_scrape(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    supervisor = Supervisor(jobdir, report=lambda line: None, metrics_port=0)
    server = supervisor._serve_metrics()
    try:
        assert supervisor.metrics_url is not None
        with urllib.request.urlopen(supervisor.metrics_url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            first = parse_exposition(response.read().decode())
        assert value(first, "epochal_part_records_out_total", part=SINK) == 200
        # every scrape reads afresh: a restart recorded meanwhile shows at the next one
        with jobdir.update() as record:
            record.restarts = 2
        with urllib.request.urlopen(supervisor.metrics_url, timeout=10) as response:
            again = parse_exposition(response.read().decode())
        assert value(again, "epochal_job_restarts_total", job=JOB) == 2
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(supervisor.metrics_url.replace("/metrics", "/x"), timeout=10)
    finally:
        server.shutdown()
        server.server_close()


def test_the_textfile_is_the_same_exposition(jobdir: JobDirectory) -> None:
    _report_two_batches(jobdir)
    path = exposition.write_textfile(jobdir)
    assert path is not None and path.endswith("/metrics/epochal.prom")
    assert parse_exposition(Path(path).read_text()) == parse_exposition(
        exposition.render_prometheus(jobdir)
    )


def test_a_task_that_cannot_see_the_jobs_directory_reports_nothing(tmp_path: Path) -> None:
    elsewhere = str(tmp_path / "not-here" / "job")
    recording.report(elsewhere, "source", "p", "c", 1, {"records_in": 1}, task_side=True)
    assert not (tmp_path / "not-here").exists()
    started = time.monotonic()
    recording.report("/proc/no-such-dir/job", "sink", "p", "c", 1, {"x": 1})  # never raises
    assert time.monotonic() - started < 60


def test_the_standby_s_readiness_and_the_effective_guarantee_are_exported(
    jobdir: JobDirectory,
) -> None:
    families = parse_exposition(exposition.render_prometheus(jobdir))
    assert "epochal_standby_ready" not in families  # no standby: no series
    with jobdir.update() as record:
        record.supervisor = {"standby_pid": 4242, "standby_ready": False}
        record.effective_guarantee = "at-least-once"
    families = parse_exposition(exposition.render_prometheus(jobdir))
    assert value(families, "epochal_standby_ready", job=JOB) == 0
    assert value(families, "epochal_job_effective_guarantee", guarantee="at-least-once") == 1
    with jobdir.update() as record:
        record.supervisor = {"standby_pid": 4242, "standby_ready": True}
    families = parse_exposition(exposition.render_prometheus(jobdir))
    assert value(families, "epochal_standby_ready", job=JOB) == 1


def test_status_of_a_stopped_job_shows_a_released_lease_and_no_standby(
    jobdir: JobDirectory,
) -> None:
    status = job_status(jobdir)
    status["phase"] = "suspended"
    status["lease"] = {"epoch": 2, "pid": 484, "host": "vm", "renewed_ago_s": None, "ttl_s": 20}
    status["standby"] = {"pid": 9, "ready": False, "up_s": 94.9, "warmup_s": None}
    text = render(status)
    assert "lease epoch 2, owner pid 484 on vm, released (ttl 20s, not live)" in text
    assert "standby" not in text
    status["phase"] = "running"
    assert "standby driver pid 9 warming up for 94.9s" in render(status)


def test_a_part_keeps_its_newest_batches_and_their_task_shares_only(
    jobdir: JobDirectory,
) -> None:
    """Per batch, a part keeps its values and its tasks' shares for the newest
    ``METRIC_BATCHES`` batches only, however long the job runs; the totals keep counting."""
    from epochal.state import retention

    batches = retention.METRIC_BATCHES * 3
    for batch in range(batches):
        for task in range(4):
            values = {"records_committed": 5, "records_in": 5}
            recording.report(jobdir.path, "source", SOURCE, "map", batch, values, task=task)
    state = recording.collect(jobdir.path, batches - 1, None, jobdir.load().created)
    part = state["parts"][f"source-{SOURCE}"]
    assert len(part["batches"]) == retention.METRIC_BATCHES
    assert part["batches"][0]["batch"] == batches - retention.METRIC_BATCHES
    assert all(len(b["shares"]["records_committed"]) == 4 for b in part["batches"])
    assert part["totals"]["records_committed"] == batches * 4 * 5
