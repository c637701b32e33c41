"""Which failures restart a job and which fail it (the seeds' "restartable" events).

Failures reach the driver as text: a Python error crosses Spark's JVM as its traceback,
wrapped in the JVM's exceptions. :data:`KINDS` names each failure a deployment meets, the
text that identifies it, whether it restarts the job, whether the driver can restart the
query in place (same JVM and SparkSession) or needs a new driver process, and the test that
kills that process to prove it. docs/explanation/guarantees.md shows the same table.
"""

from __future__ import annotations

import contextlib
import enum
import re
from dataclasses import dataclass
from typing import Any

from epochal.base import secrets
from epochal_sdk.errors import RESTARTABLE_MARK


class Failure(enum.StrEnum):
    """How a failure is treated."""

    RESTARTABLE = "restartable"
    FATAL = "fatal"


@dataclass(frozen=True)
class FailureKind:
    """One kind of failure: how it shows and what epochal does about it."""

    name: str
    marks: tuple[str, ...]
    """Texts that identify it (any one of them)."""
    failure: Failure
    in_place: bool
    """Whether the query can restart inside the same driver (its JVM and session survive)."""
    proven_by: str
    """The test that causes this failure for real and counts lost and duplicated records."""


STOPPED_ON_ITS_OWN_MARK = "QueryStoppedOnItsOwn"
"""Marks a continuous job's query that ended without an error and without a request."""

FENCED = FailureKind(
    "the run lost the job's lease (another driver took over; zombie or orphan)",
    ("FencedError", "StateMovedError"),
    Failure.RESTARTABLE,
    False,
    "kit: zombie driver (SIGSTOP past the lease, SIGCONT after a take-over)",
)

# Checked in this order; the first kind whose mark is in the text wins. epochal's typed fatal
# errors come before the restartable kinds, so a user error wrapped in a lost task is still a
# user error; Spark's generic wrappers (AnalysisException) come last, because Spark wraps
# restartable causes in them too (a sink that lost its server while Spark set up the batch's
# writer surfaces as "AnalysisException: [PYTHON_DATA_SOURCE_ERROR] ... RestartableError").
KINDS: tuple[FailureKind, ...] = (
    FENCED,
    FailureKind(
        "a connector refused the guarantee, an option or a schema",
        ("GuaranteeError", "ConfigError", "SchemaMismatchError"),
        Failure.FATAL,
        False,
        "tests/spark/test_jobs.py (refused at submit), connector option tests",
    ),
    FailureKind(
        "the snapshot is missing or corrupt, or keys changed on replay",
        ("SnapshotError", "KeyStabilityError"),
        Failure.FATAL,
        False,
        "tests/spark/test_jobs.py::test_corrupt_snapshot_refuses_restart",
    ),
    FailureKind(
        "a record cannot be processed (poison record)",
        ("PoisonRecordError",),
        Failure.FATAL,
        False,
        "integration/jdbc/test_jdbc_jobs.py (poison row)",
    ),
    FailureKind(
        "a connector lost its server (RestartableError, connection errors, timeouts)",
        (
            RESTARTABLE_MARK,
            "RestartableError",
            "ConnectionError",
            "ConnectionRefusedError",
            "ConnectionResetError",
            "BrokenPipeError",
            "TimeoutError",
            "socket.timeout",
            "Connection reset",
            "Connection refused",
        ),
        Failure.RESTARTABLE,
        True,
        "soak: server restarted; integration/jdbc/test_jdbc_jobs.py (PostgreSQL stopped)",
    ),
    FailureKind(
        "a Python worker died: a driver-side one (the source runner, a planner, the commit "
        "worker) or an executor's",
        (
            "Python worker exited unexpectedly",
            "PythonStreamingSourceRunner",
            "PythonStreamingSinkCommitRunner",
            "PythonPlannerRunner",
            "StreamingPythonRunner",
            "java.io.EOFException",
        ),
        Failure.RESTARTABLE,
        True,
        "kit: driver-side and executor Python workers killed (SIGKILL); "
        "tests/spark/test_jobs.py (a killed source runner seen at once)",
    ),
    FailureKind(
        "a continuous job's query stopped without an error and without a request",
        (STOPPED_ON_ITS_OWN_MARK,),
        Failure.RESTARTABLE,
        True,
        "tests/spark/test_jobs.py (a query stopped by code in the driver is restarted)",
    ),
    FailureKind(
        "an executor was lost",
        ("ExecutorLostFailure", "Lost executor", "RpcTimeoutException", "executor lost"),
        Failure.RESTARTABLE,
        True,
        "kit: executor JVM killed at the executor crash points (local-cluster)",
    ),
    FailureKind(
        "the driver's JVM or its Py4J gateway was lost",
        (
            "Py4JNetworkError",
            "Answer from Java side is empty",
            "Error while sending or receiving",
            "SparkContext was shut down",
            "Cannot call methods on a stopped SparkContext",
        ),
        Failure.RESTARTABLE,
        False,
        "kit: driver killed at every driver crash point (SIGKILL of the whole run)",
    ),
    FailureKind(
        "too few executors for the split-brain quorum",
        ("QuorumNotMet",),
        Failure.RESTARTABLE,
        False,
        "integration/cluster/test_cluster_jobs.py (a restart on half the cluster)",
    ),
    FailureKind(
        "two drivers wrote the same checkpoint (only a zombie can cause it)",
        ("CONCURRENT_STREAM_LOG_UPDATE", "Concurrent update to the"),
        Failure.RESTARTABLE,
        False,
        "kit: zombie driver",
    ),
    FailureKind(
        "the query is wrong (Spark's analysis refused it, a module is missing)",
        ("AnalysisException", "ModuleNotFoundError"),
        Failure.FATAL,
        False,
        "tests/spark/test_jobs.py (user error fails without restart)",
    ),
)

UNKNOWN = FailureKind(
    "anything else (a user code error, an unknown failure)",
    (),
    Failure.FATAL,
    False,
    "tests/spark/test_jobs.py (user error fails without restart)",
)


def identify(text: str) -> FailureKind:
    """The kind of failure this text shows (:data:`UNKNOWN` when none matches)."""
    for kind in KINDS:
        if any(mark in text for mark in kind.marks):
            return kind
    return UNKNOWN


def classify(text: str) -> Failure:
    """Classify a failure from its text.

    Lost connections, lost executors, crashed workers, a lost lease and timeouts restart the
    job from its last snapshot; everything else (user code errors, bad config, refused
    guarantees, corrupt snapshots) fails it with its cause, as restarting would fail the same
    way again.
    """
    return identify(text).failure


def failure_text(error: Any) -> str:
    """The whole text of a query's failure: its message and every cause, with the JVM's
    class names (a crashed worker shows only as ``java.io.EOFException`` in a cause: the
    query's own message is then empty) and the Python tracebacks the causes carry."""
    parts = [str(error)]
    cause, depth = getattr(error, "_cause", None), 0
    while cause is not None and depth < 12:
        origin = getattr(cause, "_origin", None)
        described = None
        with contextlib.suppress(Exception):
            described = str(origin.toString()) if origin is not None else None
        parts.append(f"caused by: {described or type(cause).__name__}: {cause}")
        cause, depth = getattr(cause, "_cause", None), depth + 1
    return "\n".join(parts)


def summary_of(text: str) -> str:
    """The most telling line of a long Spark/Python error text (secrets masked): epochal's
    own error if there is one, else the first Python error, else the first Spark exception."""
    return secrets.mask(telling_line(text))


def telling_line(text: str) -> str:
    """The line of ``text`` that says most about the failure (see :func:`summary_of`)."""
    patterns = (
        r"(epochal\w*\.[\w.]*(?:Error|Exception): [^\n]+)",
        r"(\b\w+(?:Error|Exception): [^\n]+)",
        r"(SparkException: [^\n]+)",
    )
    step = re.search(r"epochal step: ([^\n]+)", text)
    where = f" [{step.group(1)}]" if step else ""
    spark = re.search(r"terminated with exception: ([^\n]+)", text)
    if spark and "Traceback" not in text:  # a JVM-side failure: Spark's own words
        return spark.group(1)[:2000] + where
    for pattern in patterns:
        found = re.findall(pattern, text)
        if found:
            return found[0][:2000] + where
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:2000] if lines else "unknown failure"
