"""Which failures restart a job and which fail it (the seeds' "restartable" events)."""

from __future__ import annotations

import enum

from epochal_sdk.errors import RESTARTABLE_MARK


class Failure(enum.StrEnum):
    """How a failure is treated."""

    RESTARTABLE = "restartable"
    FATAL = "fatal"


EXIT_DONE = 0
EXIT_RESTARTABLE = 75
EXIT_FATAL = 70

# Checked first: these are never restarted, whatever else the text says.
_FATAL = (
    "GuaranteeError",
    "ConfigError",
    "SchemaMismatchError",
    "KeyStabilityError",
    "SnapshotError",
    "FencedError",
    "PoisonRecordError",
    "AnalysisException",
    "ModuleNotFoundError",
)
_RESTARTABLE = (
    RESTARTABLE_MARK,
    "RestartableError",
    "ConnectionError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "BrokenPipeError",
    "TimeoutError",
    "socket.timeout",
    "Python worker exited unexpectedly",
    "ExecutorLostFailure",
    "Lost executor",
    "Connection reset",
    "Connection refused",
    "RpcTimeoutException",
    "QuorumNotMet",
)


def classify(text: str) -> Failure:
    """Classify a failure from its text (Python errors cross Spark's JVM as text).

    Lost connections, lost executors, crashed workers and timeouts restart the job from its
    last snapshot; everything else (user code errors, bad config, refused guarantees, corrupt
    snapshots) fails it with its cause, as restarting would fail the same way again.
    """
    if any(mark in text for mark in _FATAL):
        return Failure.FATAL
    if any(mark in text for mark in _RESTARTABLE):
        return Failure.RESTARTABLE
    return Failure.FATAL
