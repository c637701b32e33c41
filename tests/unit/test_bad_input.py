"""Bad input gets a clear error that names the input and what to do, before anything is
written; nothing a user can mistype costs data. One test per row of the bad-input table in
docs/evidence/bad-input.md;
:func:`test_the_bad_input_table_names_tests_that_exist` keeps the table and the tests in step
(the JDBC rows are integration tests: integration/jdbc/test_jdbc_bad_input.py).
"""

from __future__ import annotations

import errno
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from epochal import JobConfig
from epochal.base import processes
from epochal.control.supervisor import Supervisor
from epochal.metrics import endpoint
from epochal.parts import registry
from epochal.parts.job_context import ENV_JOB, JobContext
from epochal.spark.common import Part
from epochal.state import jobs
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.lease import swaps
from epochal_sdk import ConfigError, Options

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/evidence/bad-input.md"
TABLE_HEADING = "# Bad input"


def _epochal(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The ``epochal`` command as a user runs it."""
    return subprocess.run(
        [sys.executable, "-c", "from epochal.ops.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _wait(condition: Callable[[], Any], what: str, seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


def _job(snapshots: Path, name: str, **config: Any) -> JobDirectory:
    jobdir = JobDirectory(str(snapshots), name)
    settings = JobConfig(snapshot_dir=str(snapshots), **config).to_dict()
    jobdir.save(JobRecord(name, "pipelines:copy", settings))
    return jobdir


def _written(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()] if directory.exists() else []


# -- options ----------------------------------------------------------------------------------
MISSPELLED = [
    ("map", "sink", {"path": "/m", "map": "out", "mod": "transactional"}, "mod", "mode"),
    (
        "map",
        "source",
        {"path": "/m", "map": "in", "maxRecordPerBatch": "5"},
        "maxRecordPerBatch",
        "maxRecordsPerBatch",
    ),
    (
        "jdbc",
        "sink",
        {"url": "postgresql://db/x", "table": "t", "keyColumn": "id"},
        "keyColumn",
        "keyColumns",
    ),
    (
        "kafka",
        "source",
        {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "startingOffset": "earliest"},
        "startingOffset",
        "startingOffsets",
    ),
    (
        "jms",
        "source",
        {"url": "stomp://b:61613", "destination": "q", "dedupeWindowId": "5"},
        "dedupeWindowId",
        "dedupeWindowIds",
    ),
]


@pytest.mark.parametrize(("connector", "kind", "options", "wrong", "meant"), MISSPELLED)
def test_a_misspelled_option_is_refused_with_a_did_you_mean(
    connector: str, kind: str, options: dict[str, str], wrong: str, meant: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        registry.check_options(connector, kind, options)
    message = str(refused.value)
    assert f"option {wrong!r}" in message and f"Did you mean {meant!r}?" in message, message
    spelled = {k: v for k, v in options.items() if k != wrong}
    registry.check_options(connector, kind, {**spelled, meant: options[wrong]})


def test_a_misspelled_option_is_refused_when_the_query_is_planned_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Through the data source Spark calls: the sink is refused before its lease, its
    record or its map exist."""
    from pyspark.sql.types import StringType, StructField, StructType

    from epochal.spark.datasource import data_source_class

    snapshots = tmp_path / "snapshots"
    options = {
        "path": str(tmp_path / "out.sqlite"),
        "map": "out",
        "mod": "transactional",
        "epochal.snapshotDir": str(snapshots),
        "epochal.job": "typo",
    }
    source = data_source_class("map")(options)
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    with pytest.raises(ConfigError, match=r"option 'mod'.*Did you mean 'mode'\?"):
        source.streamWriter(schema, False)
    assert _written(tmp_path) == []
    misspelled_runtime = {**options, "mod": "", "epochal.snapshotDri": str(snapshots)}
    with pytest.raises(ConfigError, match=r"'epochal.snapshotDri'.*'epochal.snapshotDir'"):
        data_source_class("map")(misspelled_runtime)


def test_an_unknown_kafka_property_names_the_option_not_librdkafkas_code() -> None:
    from epochal_kafka.source import KafkaSource

    options = Options(
        "kafka",
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "kafka.linger.msec": "5"},
    )
    registry.check_options("kafka", "source", options)  # a pass-through family: accepted here
    with pytest.raises(ConfigError) as refused:
        KafkaSource(options).check()  # the first client refuses it, before any broker call
    message = str(refused.value)
    assert "option 'kafka.linger.msec'" in message, message
    assert "No such configuration property" in message and "_INVALID_ARG" not in message


@pytest.mark.parametrize(
    ("getter", "raw", "problem"),
    [
        ("int", "1" + "0" * 40, "is above 9223372036854775807"),
        ("int", "-" + "1" * 30, "is below -9223372036854775808"),
        ("float", "nan", "is not a finite number"),
        ("float", "inf", "is not a finite number"),
        ("float", "-Infinity", "is not a finite number"),
        ("float", "1e300", "is above 1e+15"),
    ],
)
def test_numeric_options_refuse_huge_numbers_nan_and_inf(
    getter: str, raw: str, problem: str
) -> None:
    options = Options("map", {"maxRecordsPerBatch": raw})
    with pytest.raises(ConfigError, match=re.escape(problem)) as refused:
        getattr(options, getter)("maxRecordsPerBatch", 1)
    assert "option 'maxRecordsPerBatch'" in str(refused.value)
    assert Options("m", {"x": "12"}).int("x", 0, maximum=12) == 12
    with pytest.raises(ConfigError, match=r"is above 11\. Give 11 or less"):
        Options("m", {"x": "12"}).int("x", 0, maximum=11)


# -- the command line ---------------------------------------------------------------------------
def test_a_metrics_port_out_of_range_or_busy_is_refused_before_the_lease_and_the_record(
    tmp_path: Path,
) -> None:
    snapshots = tmp_path / "snapshots"
    run = ["run", "pipelines:copy", "--name", "ported", "--snapshot-dir", str(snapshots)]
    out_of_range = _epochal(*run, "--metrics-port", "99999")
    assert out_of_range.returncode == 2
    assert "--metrics-port: 99999 is not a TCP port" in out_of_range.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = _epochal(*run, "--metrics-port", str(port))
        assert taken.returncode == 2, taken.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr, taken.stderr
        assert "Traceback" not in taken.stderr
        assert _written(snapshots) == [], "something was written before the port was checked"
        record = Path(_job(snapshots, "ported").path) / "job.json"
        before = record.read_bytes()
        resume = ["jobs", "resume", "ported", "--snapshot-dir", str(snapshots)]
        resumed = _epochal(*resume, "--metrics-port", str(port))
    assert resumed.returncode == 2 and f"127.0.0.1:{port}" in resumed.stderr, resumed.stderr
    assert record.read_bytes() == before and not (record.parent / "lease.json").exists()


def test_a_snapshot_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    for command in (
        ["jobs", "list", "--snapshot-dir", str(afile)],
        ["jobs", "status", "x", "--snapshot-dir", str(afile)],
        ["run", "pipelines:copy", "--name", "x", "--snapshot-dir", str(afile / "under")],
    ):
        result = _epochal(*command)
        assert result.returncode == 2, (command, result.stderr)
        assert "option 'snapshot_dir'" in result.stderr and "not a directory" in result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    assert afile.read_text() == "not a directory"


def test_a_snapshot_dir_that_cannot_be_created_is_refused_naming_it(tmp_path: Path) -> None:
    result = _epochal("run", "os:getcwd", "--name", "g2", "--snapshot-dir", "/proc/nope")
    assert result.returncode == 2, result.stderr
    assert "option 'snapshot_dir': '/proc/nope' cannot hold the job" in result.stderr
    assert "Give a directory this user can create and write" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not os.path.exists("/proc/nope")


def test_a_target_that_does_not_import_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    snapshots = tmp_path / "snapshots"
    (tmp_path / "broken_import.py").write_text("import no_such_dependency\n")
    (tmp_path / "no_build.py").write_text("def other(spark):\n    pass\n")
    cases = {
        "nosuchmodule:build": "module 'nosuchmodule' does not import: ModuleNotFoundError",
        "broken_import:build": "No module named 'no_such_dependency' (at ",
        "no_build:build": "has no function 'build'",
        "no_colon": "is not 'module:function'",
    }
    for target, said in cases.items():
        started = time.monotonic()
        result = _epochal(
            "run", target, "--name", "g2", "--snapshot-dir", str(snapshots), cwd=tmp_path
        )
        took = time.monotonic() - started
        assert result.returncode == 2, (target, result.stderr)
        assert said in result.stderr, (target, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        assert not snapshots.exists(), f"{target}: something was written before the refusal"
        assert took < 7, f"{target}: refused only after {took:.1f}s (a driver was started?)"


def test_a_torn_job_record_is_listed_as_unreadable_not_left_out(tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    _job(snapshots, "sound")
    torn = _job(snapshots, "torn")
    record = Path(torn.path) / "job.json"
    record.write_bytes(record.read_bytes()[:40])  # a write cut short
    listed = _epochal("jobs", "list", "--snapshot-dir", str(snapshots))
    assert listed.returncode == 1
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert "SUBMITTED" in lines["sound"]
    assert "UNREADABLE" in lines["torn"] and str(record) in lines["torn"], listed.stdout
    assert "corrupt" in lines["torn"] and "Restore" in lines["torn"]
    assert [j.name for j in jobs.scan_jobs(str(snapshots))] == ["sound", "torn"]


def test_a_corrupt_lease_shows_that_job_as_unreadable_and_lists_the_others(
    tmp_path: Path,
) -> None:
    snapshots = tmp_path / "snapshots"
    _job(snapshots, "first")
    broken = _job(snapshots, "broken")
    broken.lease.acquire("someone", ttl=20)
    _job(snapshots, "last")
    (Path(broken.path) / "lease.json").write_text('{"body": "{\\"epoch\\": 7}", "sha256": "0"}')
    listed = _epochal("jobs", "list", "--snapshot-dir", str(snapshots))
    assert listed.returncode == 1, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert set(lines) == {"first", "broken", "last"}, listed.stdout
    assert "UNREADABLE" in lines["broken"] and "lease.json" in lines["broken"]
    assert "is corrupt" in lines["broken"] and "delete " in lines["broken"]
    assert "SUBMITTED" in lines["first"] and "SUBMITTED" in lines["last"]


# -- the lease renewal --------------------------------------------------------------------------
class _StandInDriver:
    """A real process standing in for a driver run: it carries the run's token (what the
    supervisor kills a run by) and answers its heartbeats."""

    def __init__(self) -> None:
        self.token = processes.new_run_token()
        env = {**os.environ, processes.RUN_TOKEN_ENV: self.token}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], env=env
        )

    def heartbeat_age(self) -> float:
        return 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def _renewing_supervisor(tmp_path: Path) -> tuple[Supervisor, _StandInDriver, list[str]]:
    """A supervisor holding its job's lease (TTL 2 s: renewed every 0.4 s, given up after
    1 s unrenewed) and renewing it on its thread, with a running stand-in driver."""
    jobdir = _job(tmp_path / "snapshots", "renewed", lease_ttl=2)
    lines: list[str] = []
    supervisor = Supervisor(jobdir, report=lines.append, pool=None)
    supervisor.config = jobdir.load().job_config
    supervisor.epoch = jobdir.lease.acquire(supervisor.owner, ttl=2)
    supervisor._renewed_at = time.monotonic()
    driver = _StandInDriver()
    supervisor.active = driver  # type: ignore[assignment]
    threading.Thread(target=supervisor._renew, daemon=True).start()
    return supervisor, driver, lines


def test_a_corrupt_lease_stops_the_driver_and_fails_the_job_with_the_reason(
    tmp_path: Path,
) -> None:
    supervisor, driver, lines = _renewing_supervisor(tmp_path)
    try:
        lease = Path(supervisor.jobdir.path) / "lease.json"
        _wait(lambda: supervisor.jobdir.lease.read().renewed > 0, "a first renewal")
        lease.write_text("{torn")
        _wait(lambda: driver.process.poll() is not None, "the driver to be stopped")
        assert supervisor.unrenewable and "lease.json" in supervisor.unrenewable
        assert "is corrupt" in supervisor.unrenewable, supervisor.unrenewable
        assert any("stopping this supervisor's drivers" in line for line in lines), lines
        record = supervisor._failed_renewal()
        assert record.status == JobStatus.FAILED
        assert supervisor.jobdir.load().status == JobStatus.FAILED
        assert "delete it" in str(record.failure) and "jobs resume renewed" in str(record.failure)
    finally:
        supervisor._stop_renewal.set()
        driver.kill()


def test_a_lease_write_that_fails_stops_the_driver_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, driver, lines = _renewing_supervisor(tmp_path)
    try:
        _wait(lambda: supervisor.jobdir.lease.read().renewed > 0, "a first renewal")

        def full_disk(*args: Any, **kwargs: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(swaps, "put_record", full_disk)
        _wait(lambda: driver.process.poll() is not None, "the driver to be stopped")
        assert "No space left on device" in str(supervisor.unrenewable)
        assert "could not be renewed for" in str(supervisor.unrenewable)
        assert any("No space left on device" in line for line in lines), lines
    finally:
        supervisor._stop_renewal.set()
        driver.kill()


# -- the metrics endpoint -----------------------------------------------------------------------
def _closed_by_the_server(sock: socket.socket) -> bool:
    """Whether the server closed this connection (it reads as ended), without waiting."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1) == b""


def test_the_metrics_endpoint_bounds_its_threads_and_times_idle_sockets_out(
    tmp_path: Path,
) -> None:
    """300 idle connections: the endpoint serves 8 (one thread each) and closes the rest at
    once; idle ones are closed after the connection timeout; a scrape is served after."""
    jobdir = _job(tmp_path / "snapshots", "scraped")
    held = endpoint.serve(jobdir, endpoint.listen(0, timeout=300.0))
    address = held.server_address[:2]
    before = threading.active_count()
    idle = [socket.create_connection(address, timeout=30) for _ in range(300)]
    try:
        refused = 300 - endpoint.MAX_CONNECTIONS
        _wait(lambda: sum(map(_closed_by_the_server, idle)) >= refused, "the extra connections")
        assert threading.active_count() <= before + endpoint.MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()
        held.shutdown()
        held.server_close()
    timed = endpoint.serve(jobdir, endpoint.listen(0, timeout=0.5))
    address = timed.server_address[:2]
    try:
        quiet = [socket.create_connection(address, timeout=30) for _ in range(3)]
        _wait(lambda: all(map(_closed_by_the_server, quiet)), "the idle sockets to time out")
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=30) as r:
            assert r.status == 200 and b"epochal_" in r.read()
    finally:
        timed.shutdown()
        timed.server_close()


# -- job names ----------------------------------------------------------------------------------
def test_a_job_name_from_epochal_job_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from epochal.spark.datasource import data_source_class

    options = {"path": "/m", "map": "in", "epochal.guarantee": "at-least-once"}
    monkeypatch.setenv(ENV_JOB, "../../elsewhere")
    with pytest.raises(ConfigError, match=rf"option '{ENV_JOB}'.*'\.\./\.\./elsewhere'"):
        data_source_class("map")(options)
    monkeypatch.delenv(ENV_JOB)
    with pytest.raises(ConfigError, match=r"option 'epochal.job'.*'a/b'"):
        data_source_class("map")({**options, "epochal.job": "a/b"})


# -- secrets in Spark settings ------------------------------------------------------------------
def test_a_secret_spark_setting_must_be_a_reference() -> None:
    secret = "s3cr3t-in-conf"
    with pytest.raises(ConfigError) as refused:
        JobConfig(spark_conf={"spark.hadoop.fs.s3a.secret.key": secret})
    message = str(refused.value)
    assert "spark_conf spark.hadoop.fs.s3a.secret.key" in message and "${env:NAME}" in message
    assert secret not in message
    with pytest.raises(ConfigError, match="command line"):
        JobConfig(spark_conf={"spark.driver.extraJavaOptions": f"-Dtrust.password={secret}"})
    with pytest.raises(ConfigError, match="command line"):
        JobConfig(spark_conf={"spark.driver.extraJavaOptions": "${env:JAVA_OPTIONS}"})
    kept = JobConfig(spark_conf={"spark.hadoop.fs.s3a.secret.key": "${env:S3_SECRET}"})
    assert kept.to_dict()["spark_conf"] == {"spark.hadoop.fs.s3a.secret.key": "${env:S3_SECRET}"}
    JobConfig(spark_conf={"spark.hadoop.fs.s3a.aws.credentials.provider": "x.Provider"})


# -- a change of target -------------------------------------------------------------------------
def test_a_new_target_under_the_same_part_id_is_refused_a_rotated_password_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = JobContext(job="moved", job_dir=str(tmp_path / "moved"))

    def part(url: str) -> Part:
        options = {"url": url, "table": "public.orders", "epochal.id": "orders"}
        return Part("jdbc", options, registry.part_id("jdbc", options), context)

    monkeypatch.setenv("DB_URL", "postgresql://app:pw-0ld-5ecret@db-1:5432/shop")
    first = part("${env:DB_URL}")
    first.check_target("sink")
    first.record("sink", "transactional")
    monkeypatch.setenv("DB_URL", "postgresql://app:pw-r0tated-5ecret@db-1:5432/shop")
    part("${env:DB_URL}").check_target("sink")  # a rotated password: the same target
    monkeypatch.setenv("DB_URL", "postgresql://app:pw-r0tated-5ecret@db-2:5432/shop")
    with pytest.raises(ConfigError) as refused:
        part("${env:DB_URL}").check_target("sink")
    message = str(refused.value)
    assert "database: db-1:5432/shop -> db-2:5432/shop" in message, message
    assert "epochal.id" in message and "cancel the job" in message
    assert "5ecret" not in message
    assert "5ecret" not in (Path(context.job_dir) / "store" / "parts" / "sink-orders").read_text()
    with pytest.raises(ConfigError, match=r"table: public\.orders -> public\.other"):
        moved = {
            "url": "postgresql://db-1:5432/shop",
            "table": "public.other",
            "epochal.id": "orders",
        }
        Part("jdbc", moved, "orders", context).check_target("sink")


# -- the table ----------------------------------------------------------------------------------
def _table_rows() -> list[str]:
    text = (ROOT / PAGE).read_text()
    assert TABLE_HEADING in text, f"{PAGE} has no {TABLE_HEADING!r} section"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][
        1:
    ]


def test_the_bad_input_table_names_tests_that_exist() -> None:
    """Every row of the table names at least one test, ``path::name``, that exists; every
    test of this file and of the JDBC bad-input tests is named by a row."""
    named: set[tuple[str, str]] = set()
    for row in _table_rows():
        found = re.findall(r"`([\w/.]+\.py)::(\w+)`", row)
        assert found, f"a row of the bad-input table names no test: {row}"
        for path, name in found:
            source = ROOT / path
            assert source.exists(), f"{path} (named in {PAGE}) does not exist"
            assert re.search(rf"^def {name}\(", source.read_text(), re.M), f"{path}::{name}"
            named.add((path, name))
    for path in ("tests/unit/test_bad_input.py", "integration/jdbc/test_jdbc_bad_input.py"):
        for name in re.findall(r"^def (test_\w+)\(", (ROOT / path).read_text(), re.M):
            if name != "test_the_bad_input_table_names_tests_that_exist":
                assert (path, name) in named, f"{PAGE}'s bad-input table lacks {name}"
