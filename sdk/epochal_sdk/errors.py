"""Errors a connector raises. Each says what is wrong and what to do about it.

The runtime classifies failures by these types: :class:`RestartableError` (and
``ConnectionError``/``TimeoutError``) restarts the job from its last snapshot; every other
error fails the job with its message.

A failure reaches the runtime as text (a Python error crosses Spark's JVM as its
traceback), so the classification goes by names in that text: a :class:`RestartableError`
(it carries :data:`RESTARTABLE_MARK`), Python's ``ConnectionError`` family and
``TimeoutError``, "Connection refused"/"Connection reset" restart the job; epochal's fatal
types (:class:`ConfigError`, :class:`SchemaMismatchError`, :class:`GuaranteeError`,
:class:`SnapshotError`, :class:`PoisonRecordError`) fail it even when a restartable error
is in the same text. A client library's own exception (``psycopg.OperationalError``,
``confluent_kafka.KafkaException``, ``stomp.exception.ConnectFailedException``) is none of
these: catch its transient errors where they happen and raise
``RestartableError("what was lost") from error``; everything else fails the job.
"""

from __future__ import annotations

import os

RESTARTABLE_MARK = "[epochal:restartable]"
"""Marker carried in the message of restartable errors, so that the classification survives
the trip through Spark's JVM, where only the text of a Python exception is kept. A
connector never writes it itself: it raises :class:`RestartableError`."""


class EpochalError(Exception):
    """Base class of every error epochal raises on purpose. Its message never shows a
    secret: passwords in URLs, ``password=`` items and private keys are masked
    (:func:`epochal_sdk.redaction.mask`)."""

    def __str__(self) -> str:
        from epochal_sdk.redaction import mask

        return mask(super().__str__())


class ConfigError(EpochalError):
    """A connector or job option is missing or wrong.

    Args:
        connector: the connector (or ``job``) the option belongs to.
        option: the option's name.
        problem: what is wrong with it.
        fix: what the user should do instead.
    """

    def __init__(self, connector: str, option: str, problem: str, fix: str) -> None:
        self.connector, self.option, self.problem, self.fix = connector, option, problem, fix
        super().__init__(f"{connector}: option {option!r}: {problem}. {fix}")


class SchemaMismatchError(EpochalError):
    """The data's columns do not fit the target (a table, a map, a topic's format).

    Raise it from :meth:`Sink.check <epochal_sdk.sinks.Sink.check>` (or wherever a mismatch
    shows) with one message that names the columns and what to change; the job fails.
    """


class GuaranteeError(EpochalError):
    """A job asks for a guarantee that one of its connectors cannot keep.

    Raised by the runtime when it compares the job's guarantee with each part's
    ``max_guarantee()``; a connector lowers its guarantee there instead of raising this.
    """


class PoisonRecordError(EpochalError):
    """One record cannot be processed. Names the record; nothing else is skipped.

    The job fails with the message (a record is never dropped silently): say which record
    (its key, its position, its message ID) and how to get past it.
    """


class SnapshotError(EpochalError):
    """Snapshot data is missing or corrupt; the job refuses to run on it.

    Raised by the runtime about its own snapshot; a connector raises the subclass
    :class:`DataGoneError` about data of its system.
    """


class DataGoneError(SnapshotError):
    """The data of a range a source must read (again) is gone: deleted by retention or
    compaction, a file replaced, a partition removed. The job fails: replaying a batch from
    other data, or skipping it, would break the guarantee silently.

    Raise it as ``DataGoneError(connector, what, why, fix)``, or with one ready message
    (``DataGoneError("...")``, like any :class:`SnapshotError`).

    Args:
        connector: the connector's name.
        what: the range that is gone, e.g. ``"partition 3, offsets 100..199"``.
        why: what removed it, as far as the connector can tell.
        fix: what the operator can do (restore the data, or start the job afresh from a
            position that exists).
    """

    def __init__(
        self, connector: str, what: str | None = None, why: str = "", fix: str = ""
    ) -> None:
        self.connector, self.what, self.why, self.fix = connector, what, why, fix
        if what is None:  # one ready message
            super().__init__(connector)
            return
        because = f" ({why})" if why else ""
        super().__init__(f"{connector}: the data of {what} is gone{because}. {fix}".rstrip())


class FencedError(EpochalError):
    """This process lost its job lease: another driver owns the job now.

    Raised by the runtime's fence checks (before a commit decision, an acknowledgement, a
    prepare); a connector lets it through and never raises it.
    """


class RestartableError(EpochalError):
    """A transient failure (lost connection, timeout): restart the job from its last snapshot.

    Raise it from anywhere a connector runs (the driver's source runner, a task, a commit)
    when the system was there and was lost; the supervisor restarts the job (with backoff,
    within the job's restart limit) and recovery repairs what the failure interrupted. For
    a server that does not answer in ``check``, use :func:`unreachable` instead: it tells a
    wrong address at the first start from a lost server later.

    Args:
        message: what was lost and where (no secret: the message is masked anyway).
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} {RESTARTABLE_MARK}")


STARTING_ENV = "EPOCHAL_STARTING"
"""Set by the runtime: ``1`` while it checks a job's connectors at the job's first start,
``0`` everywhere else in a job (tasks, later batches, every restart). Unset outside a job."""


def job_starting() -> bool:
    """Whether the runtime is checking the connectors of a job that has not run yet.

    Outside a job (a script or a test calling ``check()``) this is ``True``: there is nothing
    to restart, so a failure is reported as it is.

    Returns:
        True at the first start of a job (and outside a job), False in every later run and
        in tasks.
    """
    return os.environ.get(STARTING_ENV, "1") == "1"


def unreachable(connector: str, option: str, problem: str, fix: str) -> EpochalError:
    """The error for a server that does not answer (raise what this returns).

    While a job starts, a server that does not answer most likely has a wrong address: a
    :class:`ConfigError` fails the job at once with ``fix``. Once the job has run, the same
    failure is a server that worked and was lost: a :class:`RestartableError` restarts the job
    from its last snapshot (with backoff, within the job's restart limit).

    Example, in ``check``::

        try:
            client.ping()
        except client_library.ConnectionError as error:
            raise unreachable("mine", "url", str(error), "Check the url option.") from error

    Args:
        connector: the connector's name.
        option: the option that names the server (``url``, ``bootstrap``).
        problem: what happened (the client's message; secrets are masked).
        fix: what the user should check at the first start.

    Returns:
        The error to raise, a :class:`ConfigError` at a job's first start, else a
        :class:`RestartableError`.
    """
    if job_starting():
        return ConfigError(connector, option, problem, fix)
    return RestartableError(
        f"{connector}: lost the server ({problem}); restarting from the last snapshot"
    )
