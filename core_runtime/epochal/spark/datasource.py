"""One Spark data source class per installed connector: ``format("epochal.<name>")``."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.types import StructType

from epochal.base import logfiles, secrets
from epochal.base.processes import RUN_TOKEN_ENV
from epochal.parts import registry
from epochal.parts.effective import effective
from epochal.parts.job_context import JobContext
from epochal.parts.records import forget_part
from epochal.parts.spark_plan import check_session_query, session_driver, session_refusal
from epochal.spark import features
from epochal.spark.common import Part, sdk_schema
from epochal.spark.query_fence import QueryFence
from epochal.spark.session_progress import SessionQuery
from epochal.spark.sinks import contract_of
from epochal.spark.sources import AcknowledgingReader, ReplayableReader
from epochal.spark.task_ends import wait_for_tasks_to_end
from epochal.state import retention
from epochal.state.lease.session import DriverJvm
from epochal.state.run_records import RUN_DIR_ENV
from epochal_sdk import AcknowledgingSource, ConfigError, ReplayableSource
from epochal_sdk.errors import STARTING_ENV, GuaranteeError
from epochal_sdk.sinks import Sink
from epochal_sdk.sources import Source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("epochal.datasource")

FORMAT_PREFIX = "epochal."


class EpochalDataSource(DataSource):
    """The Spark side of a connector. Created on the driver: it captures the job context there
    and carries it, pickled, to the executors."""

    connector_name: ClassVar[str] = ""
    connector_entry_point: ClassVar[str] = ""
    """The connector plugin's entry point value as the driver found it: the class travels by
    value to the Python processes Spark starts, which load the plugin from it
    (:func:`epochal.parts.registry.connector`)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.options: dict[str, str] = dict(options)
        registry.connector(self.connector_name, self.connector_entry_point)  # loads, or why not
        registry.check_runtime_options(self.options)  # before any epochal.* option is used
        self.context = JobContext.current(self.options)

    @classmethod
    def name(cls) -> str:
        return FORMAT_PREFIX + cls.connector_name

    def _part(self, kind: str) -> Part:
        return Part.in_job(
            kind,
            self.connector_name,
            self.options,
            self.context,
            entry_point=self.connector_entry_point,
        )

    def schema(self) -> str:
        registry.check_options(self.connector_name, "source", self.options)
        with _job_start_checks(self.context):
            source = self._part("source").build_source()
            try:
                return source.schema()
            finally:
                source.close()

    def _streaming(self) -> None:
        """A streaming read or write of the job is planned: its driver holds the job's lease
        from here (:meth:`JobContext.holding_the_lease`); a schema look-up needs none."""
        self.context = self.context.holding_the_lease(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        registry.check_options(self.connector_name, "source", self.options)
        _refuse_what_the_session_check_refused(self.context)
        self._streaming()
        part = self._part("source")
        with _job_start_checks(self.context):
            part.check_target("source")
            source = part.build_source()
            try:
                source.check()
                part.guarantee = effective(
                    self.context.guarantee,
                    source.max_guarantee(),
                    part=f"source {part.label}",
                    options=self.options,
                    allow_downgrade=self.context.allow_downgrade,
                    why=_reason(source),
                )
            finally:
                source.close()
        part.record("source", source_contract(source), _reason(source))
        if isinstance(source, ReplayableSource):
            return ReplayableReader(part, schema)
        if isinstance(source, AcknowledgingSource):
            return AcknowledgingReader(part, schema)
        raise TypeError(f"{part.label}: {type(source).__name__} implements no source contract")

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        registry.check_options(self.connector_name, "sink", self.options)
        _refuse_what_the_session_check_refused(self.context)
        self._streaming()
        part = self._part("sink")
        fields = sdk_schema(schema)
        first_plan = _planning_worker() and _first_plan_of_run(part)
        with _job_start_checks(self.context, first_plan):
            sink = part.build_sink()
            try:
                contract = contract_of(part, sink)
                part.guarantee = effective(
                    self.context.guarantee,
                    sink.max_guarantee(),
                    part=f"sink {part.label}",
                    options=self.options,
                    allow_downgrade=self.context.allow_downgrade,
                    why=_reason(sink),
                )
                if first_plan:
                    _trace(part, f"planning {part.label} (run {part.context.run})")
                    part.check_target("sink")
                    _settle_gone_sinks(part)
                    sink.check(fields)
                    part.record("sink", contract.name, _reason(sink))
                    done = contract.start_run(part, sink)
                    if done:
                        _trace(
                            part,
                            f"{part.label}: recovery at the start of run {part.context.run}: "
                            f"{done}",
                        )
                    _mark_planned(part)
            finally:
                sink.close()
        return contract.writer(part, fields, schema)


@contextlib.contextmanager
def _job_start_checks(context: JobContext, first_plan: bool = True) -> Iterator[None]:
    """Tell the connectors (``epochal_sdk.job_starting()``) whether the code inside checks a
    job that has not run yet: only the first plan of a supervised job's first run (or of a
    query started without ``epochal run``) is a start; a server that does not answer then is a
    configuration error. Every later check meets a lost server: a restartable failure."""
    starting = first_plan and (not context.supervised or context.run <= 1)
    previous = os.environ.get(STARTING_ENV)
    os.environ[STARTING_ENV] = "1" if starting else "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(STARTING_ENV, None)
        else:
            os.environ[STARTING_ENV] = previous


def source_contract(source: Source) -> str:
    """The source contract ``source`` implements (``ReplayableSource`` or
    ``AcknowledgingSource``), whatever base classes lie between."""
    for contract in (ReplayableSource, AcknowledgingSource):
        if isinstance(source, contract):
            return contract.__name__
    raise TypeError(f"{type(source).__name__} implements no source contract")


def _reason(part: Source | Sink) -> str:
    """Why a connector gives less than exactly-once (its ``guarantee_reason()``)."""
    return str(part.guarantee_reason() or "")


def _planned_key(part: Part) -> str:
    return f"sinks/{part.part_id}/planned/{part.context.run}"


def _first_plan_of_run(part: Part) -> bool:
    """PySpark plans the write again for every micro-batch; the sink check and the recovery
    belong to the start of a run (before any task of it), so they run once per run."""
    if not part.context.job_dir:
        return True
    return not part.context.store(part.connector).exists(_planned_key(part))


def _settle_gone_sinks(part: Part) -> None:
    """A job's query has one sink. A transactional sink the job's store records under
    another part id (the job's code now writes elsewhere, a connector option changed the
    id) is gone: what it left in doubt is settled now (commit the decided, roll back the
    rest of earlier runs) and its record dropped. When its store cannot be reached the run
    is refused (a ``ConfigError``) with its transactions and the command that settles them:
    no prepared transaction is orphaned silently. A sink planned in this same run (a second
    query of the job) is left alone."""
    from epochal.parts.settling import settle_sinks

    if not part.context.job_dir:
        return
    store = part.context.store(part.connector)
    run = part.context.run
    planned_now = frozenset(
        sink_id
        for sink_id in store.list_dirs("sinks")
        if store.exists(f"sinks/{sink_id}/planned/{run}")
    )
    done, unsettled = settle_sinks(
        store,
        part.context.job,
        part.context.incarnation,
        skip=planned_now | {part.part_id},
        run=run if part.context.fence.active else None,
        fence=part.context.check_fence,
    )
    for sink_id, line in done:
        _trace(part, f"{part.label}: a sink of the job's last run is gone; settled {line}")
        forget_part(store, "sink", sink_id)
    if unsettled:
        snapshot_dir, _, name = part.context.job_dir.rstrip("/").rpartition("/")
        listed = "; ".join(u.describe() for u in unsettled)
        commands = "; ".join(
            f"`python -m epochal in-doubt settle {name} --snapshot-dir {snapshot_dir} "
            f"--sink {u.sink_id} [-o KEY=VALUE ...]`"
            for u in unsettled
        )
        raise ConfigError(
            f"sink {part.label}",
            "part id",
            f"the job's last run wrote to another sink that this query no longer has, and "
            f"what that sink left in doubt could not be settled: {listed}",
            f"Settle it ({commands}), then start the job again; or give this query back the "
            "old sink's connector options (or its epochal.id)",
        )


def _mark_planned(part: Part) -> None:
    if part.context.job_dir:
        store = part.context.store(part.connector)
        for old in store.list(f"sinks/{part.part_id}/planned"):
            store.delete(old)
        store.write_json(_planned_key(part), {"run": part.context.run})


def _trace(part: Part, message: str) -> None:
    """Driver-side workers' stderr is not the driver's log: note key steps in the job's logs."""
    directory = part.context.job_dir
    if not directory or "://" in directory:
        return
    logfiles.append_line(
        f"{directory}/logs/protocol.log",
        f"{time.strftime('%H:%M:%S')} pid {os.getpid()} {message}",
        retention.LOG_BYTES,
        retention.LOG_BACKUPS,
    )


def _planning_worker() -> bool:
    """True in the driver worker that plans the write (once per query start), False in the
    per-batch commit workers and in executors. PySpark starts its driver-side workers as
    ``python -m pyspark.daemon <worker module>`` (or ``-m <worker module>``)."""
    return any("write_into_data_source" in arg for arg in sys.argv) or (
        os.environ.get("EPOCHAL_PLANNING_WORKER") == "1"
    )


@functools.cache
def data_source_class(name: str) -> type[EpochalDataSource]:
    """The data source class of connector ``name``."""
    attributes = {"connector_name": name, "connector_entry_point": registry.entry_point_value(name)}
    return type(f"EpochalDataSource_{name}", (EpochalDataSource,), attributes)


def register(spark: SparkSession, names: list[str] | None = None) -> list[str]:
    """Register every installed connector (or ``names``) on a session:
    ``spark.readStream.format("epochal.<name>")`` and ``writeStream.format(...)`` then work.

    In a plain session (not a driver of ``epochal run``) it also adds a query listener, once
    per session, that checks every query with an epochal source or sink when it starts:
    Spark's own parts of it against the job's guarantee, a warning for each one below it and,
    under exactly-once, a refusal before the first batch
    (:func:`~epochal.parts.spark_plan.check_session_query`). Formats Spark finds by itself
    (``pyspark_epochal_*`` modules) work without ``register``, but then nothing checks
    Spark's own parts of the query. An installed connector that fails to load is registered
    too: a query that names its format is refused with the error that stopped it."""
    failed = registry.failed_connectors()
    chosen = names or sorted({*registry.connectors(), *failed})
    for name in chosen:
        if name not in failed:  # a failed one is registered: its format says why it failed
            registry.connector(name)  # a clear error for an unknown name
        try:
            spark.dataSource.register(data_source_class(name))
        except Exception as exc:  # pyspark 4.0: Spark found the format by itself; keep it
            if not features.found_by_spark(exc):
                raise
    _check_queries_of(spark)
    return [FORMAT_PREFIX + n for n in chosen]


def attach(spark: SparkSession) -> None:
    """Add the session check to ``spark`` as :func:`register` does, without registering any
    format (Spark finds them by itself): what :mod:`epochal.spark.attach` calls when a plain
    session starts its first streaming query."""
    _check_queries_of(spark)


def _check_queries_of(spark: SparkSession) -> None:
    """Add the session check (:class:`_SessionCheck`) to ``spark``, once. Not in a driver of
    ``epochal run``, which judges its query before it starts it, nor in a Spark Connect
    client, which has no JVM to read the query from."""
    supervised = os.environ.get(RUN_TOKEN_ENV) and os.environ.get(RUN_DIR_ENV)
    if supervised or getattr(spark, "_jvm", None) is None:
        return
    if getattr(spark, _SESSION_CHECK, None) is not None:
        return
    session = _jvm_session_id(spark)  # two Python objects of one JVM session: one check
    if session is not None and session in _CHECKED_SESSIONS:
        setattr(spark, _SESSION_CHECK, _CHECKED_SESSIONS[session])
        return
    listener = _SessionCheck(spark)
    spark.streams.addListener(listener)
    setattr(spark, _SESSION_CHECK, listener)
    if session is not None:
        _CHECKED_SESSIONS[session] = listener
    atexit.register(listener.drain, DRAIN_SECONDS)


_CHECKED_SESSIONS: dict[int, Any] = {}
"""The session check of each JVM session of this driver that has one (by its identity)."""


def _jvm_session_id(spark: SparkSession) -> int | None:
    """The identity of ``spark``'s JVM session (None when it cannot be had)."""
    try:
        system = spark.sparkContext._jvm.java.lang.System  # type: ignore[union-attr]
        return int(system.identityHashCode(spark._jsparkSession))
    except Exception:
        return None


DRAIN_SECONDS = 30.0
"""How long an application's exit waits for the session check to have the end of its
stopped queries (:meth:`_SessionCheck.drain`)."""


_SESSION_CHECK = "_epochal_session_check"


class _SessionCheck(StreamingQueryListener):
    """Checks each query of a plain session when it starts, before Spark plans its sources and
    sink (Spark calls ``onQueryStarted`` synchronously there), and has the session's query
    fence (:class:`~epochal.spark.query_fence.QueryFence`) watch the job's lease for it."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.session: SparkSession = spark  # typed: Spark's listener types its own Optional
        self.driver: DriverJvm | None = None
        self.fence = QueryFence(spark)
        self.queries: dict[str, SessionQuery] = {}
        self.unfinished: set[str] = set()
        """The runs of the session's job queries whose end this listener has not yet
        written (Spark delivers it a moment after the query stopped)."""

    def drain(self, seconds: float) -> bool:
        """At the application's exit: wait until this listener has written the end of every
        job query of the session that is no longer running, at most ``seconds``. Spark
        delivers a query's last progress and its end to listeners after
        ``awaitTermination()`` returns; a script that ends right after it would otherwise
        leave its job's record at an earlier batch and never ``COMPLETED``. Returns whether
        nothing was left.

        First it waits for Spark's listener bus to have delivered every event posted so far:
        a query that ended before this listener had even been told of its start (a short
        run on a busy machine) is in no set here yet, and its progress and end are still
        queued."""
        deadline = time.monotonic() + seconds
        self._wait_for_listener_bus(seconds)
        while self.unfinished:
            try:
                active = {str(q.runId) for q in self.session.streams.active}
            except Exception:  # the session is stopped: its listener bus was drained
                return True
            if not self.unfinished - active:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _wait_for_listener_bus(self, seconds: float) -> None:
        """Until Spark's listener bus has delivered (to this listener too) every event posted
        before the call, at most ``seconds``; nothing when it cannot be asked (the session
        is stopped, its bus drained by the stop)."""
        try:
            bus = self.session.sparkContext._jsc.sc().listenerBus()
            bus.waitUntilEmpty(int(seconds * 1000))
        except Exception as exc:  # a stopped session, or a time-out: the loop below decides
            log.debug("epochal: the listener bus was not waited for: %s", exc)

    def onQueryStarted(self, event: Any) -> None:
        try:
            self.driver = self.driver or session_driver(self.spark)
            verdict = check_session_query(self.spark, str(event.id), self.driver)
            if verdict is not None and verdict.get("session_record"):
                record = str(verdict["session_record"])
                self.fence.watch(record, str(event.id), str(event.runId))
                query = self.fence.spark.streams.get(str(event.id))
                if query is not None:  # by run: a restarted query keeps its id
                    self.queries[str(event.runId)] = SessionQuery.of(
                        query, str(verdict["job_dir"]), record
                    )
                    self.unfinished.add(str(event.runId))
        except Exception as exc:  # the check must not break the query; say what it missed
            log.warning(
                "epochal: query %s could not be checked, Spark's own sources and sinks of it "
                "are not judged against the job's guarantee: %s: %s",
                event.id,
                type(exc).__name__,
                secrets.mask(str(exc)),
            )

    def onQueryProgress(self, event: Any) -> None:
        query = self.queries.get(str(event.progress.runId))
        if query is None:
            return
        try:
            query.batch_committed(event.progress)
        except Exception as exc:  # the job's progress must never break the query
            log.warning(
                "epochal: progress of query %s not written: %s: %s",
                event.progress.id,
                type(exc).__name__,
                secrets.mask(str(exc)),
            )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        try:
            self._terminated(event)
        finally:
            self.unfinished.discard(str(event.runId))

    def _terminated(self, event: Any) -> None:
        query = self.queries.pop(str(event.runId), None)
        if query is not None and not event.exception:
            try:
                wait_for_tasks_to_end(self.spark, str(event.runId))
                query.settle_stopped(log.info)
            except Exception as exc:  # the next start's recovery settles what stays
                log.warning(
                    "epochal: what query %s left in doubt is settled at its next start: %s: %s",
                    event.id,
                    type(exc).__name__,
                    secrets.mask(str(exc)),
                )
        self.fence.forget(str(event.runId))
        if query is None:
            return
        try:
            query.ended(str(event.exception) if event.exception else None)
        except Exception as exc:
            log.warning(
                "epochal: the end of query %s not written: %s: %s",
                event.id,
                type(exc).__name__,
                secrets.mask(str(exc)),
            )


def _refuse_what_the_session_check_refused(context: JobContext) -> None:
    """Raise the session check's refusal of the query being planned (plain sessions only:
    :func:`~epochal.parts.spark_plan.session_refusal`), before its job's lease is taken."""
    refusal = session_refusal(context)
    if refusal:
        raise GuaranteeError(refusal)
