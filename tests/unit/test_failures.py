"""failures.classify: which failure texts restart a job and which fail it; an unreachable
server fails a job that starts and restarts a job that ran."""

from __future__ import annotations

import os

import pytest

from epochal.control.failures import Failure, classify
from epochal.control.messages import EXIT_DONE, EXIT_FATAL, EXIT_RESTARTABLE
from epochal.parts.job_context import JobContext
from epochal.spark.datasource import _job_start_checks
from epochal_sdk import ConfigError, RestartableError, SnapshotError, unreachable
from epochal_sdk.errors import STARTING_ENV, GuaranteeError, job_starting


def traceback_of(exc: BaseException) -> str:
    """Roughly what crosses Spark's JVM: the exception's type and message."""
    return f"Traceback (most recent call last):\n  ...\n{type(exc).__name__}: {exc}"


@pytest.mark.parametrize(
    "text",
    [
        traceback_of(ConnectionError("server went away")),
        traceback_of(ConnectionResetError(104, "reset by peer")),
        traceback_of(TimeoutError("read timed out")),
        traceback_of(RestartableError("map store locked")),
        # only the mark survives when the type name is lost
        "org.apache.spark.SparkException: broker gone [epochal:restartable]",
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)",
        "Job aborted due to stage failure: ExecutorLostFailure (executor 1 exited caused by one "
        "of the running tasks) Reason: Remote RPC client disassociated.",
        "java.net.ConnectException: Connection refused",
        "QuorumNotMet: 1 of 3 executors",
    ],
)
def test_restartable(text: str) -> None:
    assert classify(text) is Failure.RESTARTABLE


@pytest.mark.parametrize(
    "text",
    [
        traceback_of(GuaranteeError("sink can give at most at-least-once")),
        traceback_of(ConfigError("map", "map", "is required", "Set it.")),
        traceback_of(SnapshotError("snapshot entry 'x' is corrupt")),
        "pyspark.errors.exceptions.captured.AnalysisException: [UNRESOLVED_COLUMN] `vlue`",
        traceback_of(ZeroDivisionError("division by zero")),
        "something nobody has seen before",
        "",
    ],
)
def test_fatal(text: str) -> None:
    assert classify(text) is Failure.FATAL


def test_fatal_marks_win_over_restartable_marks() -> None:
    text = (
        "ConnectionError while reading, then: "
        + traceback_of(ConfigError("kafka", "topic", "is required", "Set it."))
        + " [epochal:restartable]"
    )
    assert classify(text) is Failure.FATAL
    assert classify("ExecutorLostFailure ... SnapshotError: entry missing") is Failure.FATAL
    assert classify("Python worker exited unexpectedly ... KeyStabilityError") is Failure.FATAL


def test_restartable_error_carries_its_mark() -> None:
    assert "[epochal:restartable]" in str(RestartableError("lost the connection"))
    assert classify(str(RestartableError("lost the connection"))) is Failure.RESTARTABLE


def test_exit_codes_are_distinct() -> None:
    assert len({EXIT_DONE, EXIT_RESTARTABLE, EXIT_FATAL}) == 3
    assert EXIT_DONE == 0


@pytest.mark.parametrize(
    ("starting", "expected", "failure"),
    [
        (None, ConfigError, Failure.FATAL),  # outside a job: report it as it is
        ("1", ConfigError, Failure.FATAL),  # the job's first start: a wrong address
        ("0", RestartableError, Failure.RESTARTABLE),  # a server that worked and was lost
    ],
)
def test_an_unreachable_server_fails_a_start_and_restarts_a_running_job(
    monkeypatch: pytest.MonkeyPatch, starting: str | None, expected: type, failure: Failure
) -> None:
    if starting is None:
        monkeypatch.delenv(STARTING_ENV, raising=False)
    else:
        monkeypatch.setenv(STARTING_ENV, starting)
    error = unreachable("jdbc", "url", "cannot connect to db:5432", "Check the host.")
    assert type(error) is expected
    assert "cannot connect to db:5432" in str(error)
    assert classify(traceback_of(error)) is failure


def test_the_data_source_says_which_checks_are_a_job_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(STARTING_ENV, "0")  # what the driver sets for the whole job

    def seen(context: JobContext, first_plan: bool = True) -> bool:
        with _job_start_checks(context, first_plan):
            inside = job_starting()
        assert os.environ[STARTING_ENV] == "0", "the flag must be restored"
        return inside

    assert seen(JobContext(run=1, supervised=True))
    assert not seen(JobContext(run=1, supervised=True), first_plan=False)
    assert not seen(JobContext(run=2, supervised=True))
    assert seen(JobContext(run=1_800_000_000, supervised=False))  # a query outside epochal run
