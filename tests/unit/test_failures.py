"""failures.classify: which failure texts restart a job and which fail it."""

from __future__ import annotations

import pytest

from epochal.failures import EXIT_DONE, EXIT_FATAL, EXIT_RESTARTABLE, Failure, classify
from epochal_sdk import (
    ConfigError,
    FencedError,
    GuaranteeError,
    RestartableError,
    SnapshotError,
)


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
        traceback_of(FencedError("lease epoch 3 but the job is at 4")),
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
