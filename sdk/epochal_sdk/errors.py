"""Errors a connector raises. Each says what is wrong and what to do about it.

The runtime classifies failures by these types: :class:`RestartableError` (and
``ConnectionError``/``TimeoutError``) restarts the job from its last snapshot; every other
error fails the job with its message.
"""

from __future__ import annotations

import os

RESTARTABLE_MARK = "[epochal:restartable]"
"""Marker carried in the message of restartable errors, so that the classification survives
the trip through Spark's JVM, where only the text of a Python exception is kept."""


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
    """The data's columns do not fit the target (a table, a map, a topic's format)."""


class GuaranteeError(EpochalError):
    """A job asks for a guarantee that one of its connectors cannot keep."""


class PoisonRecordError(EpochalError):
    """One record cannot be processed. Names the record; nothing else is skipped."""


class SnapshotError(EpochalError):
    """Snapshot data is missing or corrupt; the job refuses to run on it."""


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
    """This process lost its job lease: another driver owns the job now."""


class RestartableError(EpochalError):
    """A transient failure (lost connection, timeout): restart the job from its last snapshot."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} {RESTARTABLE_MARK}")


STARTING_ENV = "EPOCHAL_STARTING"
"""Set by the runtime: ``1`` while it checks a job's connectors at the job's first start,
``0`` everywhere else in a job (tasks, later batches, every restart). Unset outside a job."""


def job_starting() -> bool:
    """Whether the runtime is checking the connectors of a job that has not run yet.

    Outside a job (a script or a test calling ``check()``) this is ``True``: there is nothing
    to restart, so a failure is reported as it is.
    """
    return os.environ.get(STARTING_ENV, "1") == "1"


def unreachable(connector: str, option: str, problem: str, fix: str) -> EpochalError:
    """The error for a server that does not answer (raise what this returns).

    While a job starts, a server that does not answer most likely has a wrong address: a
    :class:`ConfigError` fails the job at once with ``fix``. Once the job has run, the same
    failure is a server that worked and was lost: a :class:`RestartableError` restarts the job
    from its last snapshot (with backoff, within the job's restart limit).
    """
    if job_starting():
        return ConfigError(connector, option, problem, fix)
    return RestartableError(
        f"{connector}: lost the server ({problem}); restarting from the last snapshot"
    )
