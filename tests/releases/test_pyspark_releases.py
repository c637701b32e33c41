"""epochal on the pyspark releases before the suite's own (4.3): each installed first into a
new virtual environment, then epochal's wheels, built from the tree; pip keeps that pyspark,
a job that needs what the release lacks is refused at submit, the kit's contract checks of
the map connector pass (in process, no Spark), and ``python -m epochal demo`` (two hard
driver kills) ends exactly-once. The kit's crash cases run on each release too
(:data:`KIT_CASES`): the map suite's crash points, and its running aggregation, at a
processing-time trigger on 4.0 and 4.1 (which lack the available-now trigger for Python
sources), at available-now on 4.2; each reference connector's own crash points (full lane);
and the kit's suite of the ``foreachBatch`` writers on 3.5.

Each release is a unit of work of its own for the suite's two workers (the root
conftest.py). pip's cache holds each release's wheel after the first download.
"""

from __future__ import annotations

from pathlib import Path
from shutil import copy

import pytest

from integration.harness.jms import JmsServer
from integration.harness.kafka import KafkaServer
from integration.harness.plugin import (  # noqa: F401 - fixtures
    jms_server,
    kafka_server,
    postgres_server,
)
from integration.harness.postgres import PostgresServer
from tests.releases.environments import run, venv_with_pyspark
from tests.wheels import SPARK_3_5_RELEASE

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
MAP_SUITE = ROOT / "tests" / "conformance" / "test_map_conformance.py"
RELEASES = ["4.0.5", "4.1.4", "4.2.1"]
"""The newest patch of each older minor release epochal supports."""
ADMISSION_CONTROL_SINCE = (4, 2)
DEMO_EVENTS = 3000
"""The demo's events on an older release (its default is 4000)."""

VERSION = "import importlib.metadata as m; print(m.version('pyspark'))"
SUBMIT_AVAILABLE_NOW = """
import sys
from epochal import JobConfig
from epochal.control.job_requests import submit
from epochal.state.locks import JobError

try:
    submit("bounded", "epochal.pipelines:copy", JobConfig(snapshot_dir=sys.argv[1],
           available_now=True))
except JobError as exc:
    print(exc)
else:
    print("submitted")
"""


@pytest.fixture
def pyspark_release(request: pytest.FixtureRequest) -> str:
    """The release under test (this fixture's name makes each release a unit of work)."""
    return str(request.param)


@pytest.mark.parametrize("pyspark_release", RELEASES, indirect=True)
@pytest.mark.timeout(1200)  # a new environment, the kit's checks, the demo (up to 600 s)
def test_the_demo_is_exactly_once_on_a_pyspark_installed_before_epochal(
    pyspark_release: str, built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    _, python, pip = venv_with_pyspark(pyspark_release, tmp_path)
    wheels = [str(w) for w in built_wheels.values()]
    done = run([*pip, *wheels, f"pytest=={pytest.__version__}"], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    version = run([python, "-c", VERSION], tmp_path, 60)
    assert version.stdout.strip() == pyspark_release, "pip replaced the pyspark installed first"

    submitted = run(
        [python, "-c", SUBMIT_AVAILABLE_NOW, str(tmp_path / "snapshots")], tmp_path, 120
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    release = tuple(int(p) for p in pyspark_release.split(".")[:2])
    if release < ADMISSION_CONTROL_SINCE:
        assert "needs pyspark 4.2+" in submitted.stdout, submitted.stdout
        assert f"you have {pyspark_release}" in submitted.stdout, submitted.stdout
    else:
        assert submitted.stdout.strip() == "submitted", submitted.stdout

    suite = tmp_path / "kit"
    suite.mkdir()
    copy(MAP_SUITE, suite)
    kit = ["-p", "no:cacheprovider", "-q", "-k", "test_contract", "-m", "not spark"]
    checks = run([python, "-m", "pytest", *kit, MAP_SUITE.name], suite, 300)
    assert checks.returncode == 0 and " passed" in checks.stdout, checks.stdout + checks.stderr

    # fewer events than the default 4000: the demo produces until both crash points fired
    # anyway, and the README's demo (tests/quickstart) runs the default
    demo = run([python, "-m", "epochal", "demo", "--events", str(DEMO_EVENTS)], tmp_path, 600)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "lost: 0\n" in demo.stdout and "duplicates: 0\n" in demo.stdout, out
    assert "result: exactly-once held" in demo.stdout, out
    assert run([python, "-c", VERSION], tmp_path, 60).stdout.strip() == pyspark_release


KIT_CASES = {
    "4.0.5": ("points-transactional", "aggregate-transactional", "session-failures-transactional"),
    "4.1.4": ("points-transactional", "aggregate-transactional", "session-failures-transactional"),
    "4.2.1": ("points-transactional",),
}
# and on 4.2, the plain-session case without epochal.register (_plain_session_without_register)
"""The map suite's cases each release runs (exactly-once): every crash point of the
replayable source and the transactional sink, killed in place and (at the end of a batch)
whole; on 4.0 and 4.1, which run them at a processing-time trigger, the running aggregation
(Spark's state store) killed in place and whole, and the plain-session restarter case, which
must say why it is skipped there. 4.2 runs at available-now as the suite's own pyspark does,
which runs the rest; the idempotent sink's crash points run the same runtime steps through
the same writer class as the transactional sink's on each release."""


@pytest.mark.parametrize("pyspark_release", RELEASES, indirect=True)
@pytest.mark.timeout(1200)  # a new environment, then the cases' own run (up to 900 s)
def test_the_kits_crash_cases_run_on_each_release(
    pyspark_release: str, built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    """The map suite (copied out of the checkout, run by the environment's pytest with
    epochal from the wheels) on ``pyspark_release``: its crash cases pass, and its coverage
    table shows each crash point killed; on a release without the available-now trigger the
    restarter case is skipped with its reason."""
    venv, python, pip = venv_with_pyspark(pyspark_release, tmp_path)
    wheels = [str(w) for w in built_wheels.values()]
    done = run([*pip, *wheels, f"pytest=={pytest.__version__}"], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    suite = tmp_path / "kit"
    suite.mkdir()
    copy(MAP_SUITE, suite)
    cases_here = KIT_CASES[pyspark_release]
    chosen = " or ".join(f"{case}-exactly-once" for case in cases_here)
    kit = ["-p", "no:cacheprovider", "-rs", "-k", f"test_crash_and_recover and ({chosen})"]
    cases = run([python, "-m", "pytest", *kit, MAP_SUITE.name], suite, 900)
    out = cases.stdout + cases.stderr
    assert cases.returncode == 0, out[-6000:]
    release = tuple(int(p) for p in pyspark_release.split(".")[:2])
    ran = len(cases_here) - (release < ADMISSION_CONTROL_SINCE)
    assert f" {ran} passed" in cases.stdout, out[-6000:]
    if release < ADMISSION_CONTROL_SINCE:
        assert " 1 skipped" in cases.stdout, out[-6000:]
        assert "session-failures ends with a run that finishes its input" in out, out[-6000:]
        assert f"(this is {pyspark_release})" in out, out[-6000:]
    else:
        assert " skipped" not in cases.stdout, out[-6000:]
    if release >= ADMISSION_CONTROL_SINCE:
        _plain_session_without_register(python, suite)
    # the coverage table: every crash point of the map suite's cases killed and passed
    for point in (
        "source.after_plan",
        "sink.after_decision",
        "sink.mid_commit",
    ):
        assert any(point in line and "passed" in line for line in out.splitlines()), point
    where = run([python, "-c", "import epochal; print(epochal.__file__)"], tmp_path, 60)
    assert where.stdout.startswith(str(venv)), f"epochal came from {where.stdout}, not the wheels"


ATTACHES = (
    "import pyspark.sql.streaming.readwriter as r; "
    "print(getattr(r.DataStreamWriter, '_epochal_attaches', False))"
)


def _plain_session_without_register(python: str, suite: Path) -> None:
    """In an environment with epochal's wheel, a plain session is a full job without
    ``epochal.register``: the wheel's ``epochal-attach.pth`` makes PySpark's query starts
    attach the session check (``EPOCHAL_ATTACH=0`` turns it off), and the map suite's
    plain-session case, its application calling no ``register``, passes whole: the zombie
    driver stopped by its query fence, a new run at each start, and the job ``COMPLETED`` at
    the last batch of Spark's commit log when the application ends right after
    ``awaitTermination()``."""
    on = run([python, "-c", ATTACHES], suite, 60)
    off = run([python, "-c", ATTACHES], suite, 60, {"EPOCHAL_ATTACH": "0"})
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False"), on.stderr + off.stderr
    kit = ["-p", "no:cacheprovider", "-k", "session-failures-transactional-exactly-once"]
    plain = run(
        [python, "-m", "pytest", *kit, MAP_SUITE.name], suite, 600, {"EPOCHAL_KIT_REGISTER": "0"}
    )
    out = plain.stdout + plain.stderr
    assert plain.returncode == 0 and " 1 passed" in plain.stdout, out[-6000:]


CONNECTOR_SUITES = (
    "integration/jdbc/test_jdbc_conformance.py",
    "integration/kafka/test_kafka_conformance.py",
    "integration/jms/test_jms_conformance.py",
)
"""The reference connectors' own kit suites; each release runs their crash points cases,
exactly-once (the JDBC sink in both modes, the Kafka sink, the JDBC, Kafka and JMS sources,
the JMS sink)."""
CONNECTOR_CASES = "test_crash_and_recover and points and exactly-once"


@pytest.mark.parametrize("pyspark_release", RELEASES, indirect=True)
@pytest.mark.timeout(1800)  # a new environment, then the cases' own run (up to 1500 s)
def test_the_reference_connectors_kit_cases_run_on_each_release(
    pyspark_release: str,
    built_wheels: dict[str, Path],
    kafka_server: KafkaServer,  # noqa: F811
    postgres_server: PostgresServer,  # noqa: F811
    jms_server: JmsServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Each reference connector's kit suite on ``pyspark_release`` (the checkout's suites and
    harness from the root, epochal from the wheels), against this session's servers: the
    crash points of every suite pass."""
    venv, python, pip = venv_with_pyspark(pyspark_release, tmp_path)
    wheels = [str(w) for w in built_wheels.values()]
    done = run([*pip, *wheels, f"pytest=={pytest.__version__}", "pytest-timeout"], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    args = ["-p", "no:cacheprovider", "-q", "-rs", "-p", "no:xdist", "--rootdir", str(ROOT)]
    args += ["--basetemp", str(tmp_path / "cases")]
    args += ["-k", CONNECTOR_CASES]
    servers = {
        "EPOCHAL_KAFKA_BOOTSTRAP": kafka_server.bootstrap_servers,
        "EPOCHAL_POSTGRES_DSN": postgres_server.dsn,
        "EPOCHAL_STOMP_URL": jms_server.url,
        "EPOCHAL_TEST_LANE": "full",
    }
    suites = [str(ROOT / path) for path in CONNECTOR_SUITES]
    cases = run([python, "-m", "pytest", *args, *suites], ROOT, 1500, servers)
    out = cases.stdout + cases.stderr
    assert cases.returncode == 0, out[-6000:]
    assert " failed" not in cases.stdout and " 7 passed" in cases.stdout, out[-6000:]
    where = run([python, "-c", "import epochal; print(epochal.__file__)"], tmp_path, 60)
    assert where.stdout.startswith(str(venv)), f"epochal came from {where.stdout}, not the wheels"


FOREACH_BATCH_SUITE = ROOT / "tests" / "conformance" / "test_foreach_batch_conformance.py"


@pytest.mark.timeout(900)  # a new environment, then the case's own run (up to 600 s)
def test_the_kit_runs_the_foreach_batch_writers_on_pyspark_3_5(
    built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    """The kit's suite of the ``foreachBatch`` writers (Spark's text file source → the map
    sink's writer) on pyspark 3.5, epochal from the wheels: its plain-session case (the
    application killed whole, paused past its lease, killed at random, stopped gracefully,
    with records arriving all along) passes; the cases under ``epochal run``, which needs
    pyspark 4.0+, are skipped saying so."""
    release = SPARK_3_5_RELEASE
    venv, python, pip = venv_with_pyspark(release, tmp_path)
    wheels = [str(w) for w in built_wheels.values()]
    done = run([*pip, *wheels, f"pytest=={pytest.__version__}"], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert run([python, "-c", VERSION], tmp_path, 60).stdout.strip() == release
    suite = tmp_path / "kit"
    suite.mkdir()
    copy(FOREACH_BATCH_SUITE, suite)
    kit = ["-p", "no:cacheprovider", "-rs", "-k", "test_crash_and_recover"]
    cases = run([python, "-m", "pytest", *kit, FOREACH_BATCH_SUITE.name], suite, 700)
    out = cases.stdout + cases.stderr
    assert cases.returncode == 0, out[-6000:]
    assert " 1 passed, 2 skipped" in cases.stdout, out[-6000:]
    assert f"runs under epochal run, which needs pyspark 4.0+ (this is {release})" in out
    assert any("session random" in line and "passed" in line for line in out.splitlines()), out[
        -6000:
    ]
    where = run([python, "-c", "import epochal; print(epochal.__file__)"], tmp_path, 60)
    assert where.stdout.startswith(str(venv)), f"epochal came from {where.stdout}, not the wheels"


FOREACH_BATCH_RELEASE = SPARK_3_5_RELEASE
FOREACH_BATCH_CASES = ROOT / "integration" / "kafka" / "test_foreach_batch.py"
MUTANT_CASE = "test_the_jdbc_case_catches_a_writer_that_writes_a_replayed_batch_again"
ROUTED_KAFKA_CASE = "routed-by-key"
"""The Kafka case's form with the rows routed by key: on 3.5 the case runs read in order
(epochal's ordered Kafka provider, built against the suite's own Spark, on Spark 3.5's Kafka
source), since routing is Spark's own shuffle, which the suite's pyspark proves."""


@pytest.mark.timeout(1800)  # a new environment, then the cases' own run (up to 1500 s)
def test_foreach_batch_crash_points_on_pyspark_3_5(
    built_wheels: dict[str, Path],
    kafka_server: KafkaServer,  # noqa: F811
    postgres_server: PostgresServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The ``foreachBatch`` writers' crash cases (Spark's Kafka source into the JDBC 2PC sink, the
    Kafka sink with Spark's source read in order, an update-mode aggregation into the JDBC
    upsert sink, and the refused unrouted Kafka case) in an environment whose pyspark is
    3.5, with epochal's wheels installed beside it by a plain ``pip install`` (pip keeps
    3.5, as the docs say). The mutant case (a writer that writes a replayed batch again must
    be caught) runs once, on the suite's own pyspark: it proves the JDBC case's counting,
    which no release changes, and costs five driver starts. The cases use this session's
    broker and database server (``EPOCHAL_KAFKA_BOOTSTRAP``, ``EPOCHAL_POSTGRES_DSN``: each
    case makes its own topics and database), not servers of their own."""
    venv, python, pip = venv_with_pyspark(FOREACH_BATCH_RELEASE, tmp_path)
    wheels = [str(w) for w in built_wheels.values()]
    done = run([*pip, *wheels, f"pytest=={pytest.__version__}", "pytest-timeout"], tmp_path, 600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert run([python, "-c", VERSION], tmp_path, 60).stdout.strip() == FOREACH_BATCH_RELEASE

    # the checkout's integration package (the harness, the cases) from the root; epochal
    # itself from the wheels
    args = ["-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--rootdir", str(ROOT)]
    args += ["-k", f"not {MUTANT_CASE} and not {ROUTED_KAFKA_CASE}"]
    args += ["--basetemp", str(tmp_path / "cases"), str(FOREACH_BATCH_CASES)]
    servers = {
        "EPOCHAL_KAFKA_BOOTSTRAP": kafka_server.bootstrap_servers,
        "EPOCHAL_POSTGRES_DSN": postgres_server.dsn,
        "EPOCHAL_TEST_LANE": "full",  # the cases CI's lane leaves to this release (conftest.py)
    }
    cases = run([python, "-m", "pytest", *args], ROOT, 1500, servers)
    out = cases.stdout + cases.stderr
    assert cases.returncode == 0, out[-6000:]
    assert " passed" in cases.stdout and " failed" not in cases.stdout, out[-6000:]
    assert " 2 deselected" in cases.stdout, out[-6000:]  # the mutant case, the routed one
    assert " skipped" not in cases.stdout, out[-6000:]
    where = run([python, "-c", "import epochal; print(epochal.__file__)"], tmp_path, 60)
    assert where.stdout.startswith(str(venv)), f"epochal came from {where.stdout}, not the wheels"
