"""A connector: a name, a description, its source and/or sink classes, and what the runtime
checks for it: the options its parts take, which of them are secret, which name the target,
and which of its client library's errors are worth a restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from epochal_sdk.guarantees import Guarantee
from epochal_sdk.hookspecs import hookimpl
from epochal_sdk.options import Options
from epochal_sdk.sinks import IdempotentSink, Sink, TransactionalSink
from epochal_sdk.sources import AcknowledgingSource, ReplayableSource, Source

CONTRACTS: tuple[type, ...] = (
    ReplayableSource,
    AcknowledgingSource,
    TransactionalSink,
    IdempotentSink,
)


class Connector:
    """Subclass this, set the class attributes and name the class in an entry point.

    Example::

        class MapConnector(Connector):
            name = "map"
            description = "Embedded key-value map with an event journal (SQLite)."
            source_class = MapJournalSource
            sink_class = MapSink
            source_options = frozenset({"path", "map", "startingPosition"})
            sink_options = frozenset({"path", "map", "mode", "keyColumn", "valueColumn"})
            target_options = ("path", "map")

    and one line in ``pyproject.toml`` registers it (a connector class is a plugin itself)::

        [project.entry-points.epochal]
        map = "epochal_map.connector:MapConnector"

    ``spark.readStream.format("epochal.map")`` then builds ``MapJournalSource(options)``.
    (A plugin module with a ``register_connectors`` hook, named by the entry point instead,
    works too: it can register several classes.)

    Every class attribute is read by the runtime on the driver (in the Python worker that
    plans a query) and, for :attr:`restartable_errors`, wherever a protocol step fails (the
    driver's workers and the executors' tasks). None of them is needed but :attr:`name` and
    a class: a connector that declares nothing gets no option check, no target check and the
    default classification.

    The class attributes, in short (each has its own docstring below):

    - ``name``: the connector's name: ``format("epochal.<name>")``.
    - ``description``: one line for ``python -m epochal connectors``.
    - ``source_class``, ``sink_class``: the classes :meth:`source` and :meth:`sink` build
      (None: the connector has no source, or no sink).
    - ``secret_options``: options whose values are secrets: never written anywhere, left out
      of the part's identity.
    - ``source_options``, ``sink_options``: every option the source (the sink) takes, or
      None (the default) for "not declared": any option is accepted. When declared, a query
      that gives another option is refused before anything runs, with a "did you mean". The
      runtime's own options need not be listed, they are always accepted: the ``epochal.*``
      options and ``guarantee``; for a source ``maxRecordsPerBatch``, and for an
      acknowledging source also ``receiveTimeoutMs``, ``dedupeWindowBatches`` and
      ``dedupeWindowIds``.
    - ``option_prefixes``: families of options passed on to the client library as they are
      (``("kafka.",)``): accepted by the name check.
    - ``target_options``: the options that name where the data goes or comes from (server,
      database, topic, table): a restart whose part kept its id but whose target changed is
      refused before anything is written.
    - ``restartable_errors``: the client library's exception classes that mean "lost the
      server, try again": raised from a protocol step, they restart the job from its last
      snapshot, like :class:`~epochal_sdk.RestartableError`; anything else but
      ``ConnectionError`` and ``TimeoutError`` fails the job.
    """

    name: ClassVar[str]
    """The connector's name: ``format("epochal.<name>")``. Letters, digits, ``-`` and ``_``."""
    description: ClassVar[str] = ""
    """One line for ``python -m epochal connectors``."""
    source_class: ClassVar[type[Source] | None] = None
    """The class :meth:`source` builds (None: the connector has no source)."""
    sink_class: ClassVar[type[Sink] | None] = None
    """The class :meth:`sink` builds (None: the connector has no sink)."""
    secret_options: ClassVar[frozenset[str]] = frozenset()
    """Options whose values are secrets (passwords, keys, tokens): never written to a
    record, a log, an error, a metric or an id, and left out of the part's identity (a
    rotated password keeps the part's in-doubt transactions). Options named like a secret
    (``password``, ``token``, ``*.pem``, ``sasl.*``, ...) are treated as secret anyway; a
    secret inside a value (``scheme://user:secret@host``, ``password=...``) is masked. A
    declared secret option is an accepted option of the source and of the sink."""
    source_options: ClassVar[frozenset[str] | None] = None
    """Every option the source takes (case-insensitive names), or None (the default) for
    "not declared": then any option is accepted. When declared, a query that
    gives the source any other option is refused before anything runs, with a "did you
    mean" (:meth:`Options.check_names`). The runtime's own options need not be listed: the
    ``epochal.*`` options, ``guarantee``, and for a replayable source ``maxRecordsPerBatch``
    (an acknowledging source also ``receiveTimeoutMs``, ``dedupeWindowBatches``,
    ``dedupeWindowIds``) are always accepted."""
    sink_options: ClassVar[frozenset[str] | None] = None
    """Every option the sink takes; as :attr:`source_options`, for the sink."""
    option_prefixes: ClassVar[tuple[str, ...]] = ()
    """Families of options the connector passes on to its client library as they are, e.g.
    ``("kafka.",)``: any option starting with one of them is accepted by the name check. The
    library checks them when the part starts; turn its refusal into a :class:`ConfigError`
    that names the option (not the library's raw error code)."""
    target_options: ClassVar[tuple[str, ...]] = ()
    """The options that name *where the data goes* (a sink) or *comes from* (a source): the
    server, database, topic, table, file. A run records the target (:meth:`target`), and a
    restart whose part keeps its id but whose target changed (an explicit ``epochal.id``, a
    ``${env:...}`` reference that now says another server) is refused before anything is
    written: the part's snapshot entries (commit decisions, in-doubt transactions, stored
    batches) belong to the old target. Rotating a password changes no target."""
    restartable_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    """The client library's exception classes that mean "lost the server, try again" (a
    dropped connection, a timeout, a leader change): raised from any protocol step of the
    connector's source or sink (or a subclass of them), they restart the job from its last
    snapshot, like :class:`~epochal_sdk.RestartableError`. Everything else a connector
    raises fails the job, unless it is a ``ConnectionError``, ``TimeoutError`` or
    :class:`~epochal_sdk.RestartableError`. Example: ``(psycopg.OperationalError,)``."""

    @classmethod
    def declared_options(cls, kind: str) -> frozenset[str] | None:
        """The option names the connector declares for its ``kind`` (``"source"`` or
        ``"sink"``), its secret options included; None when it declares none for that kind
        (then no name is checked). Called by the runtime on the driver when a query plans a
        part, before it is built.

        Raises:
            ValueError: ``kind`` is neither ``"source"`` nor ``"sink"``.
        """
        if kind not in ("source", "sink"):
            raise ValueError(f"kind is 'source' or 'sink', not {kind!r}")
        declared = cls.source_options if kind == "source" else cls.sink_options
        if declared is None:
            return None
        return frozenset(declared) | frozenset(cls.secret_options)

    def target(self, options: Options, kind: str) -> dict[str, str]:
        """Where a part with these options writes (a sink) or reads (a source), as
        ``{name: value}``, without any secret. Called by the runtime in the Python worker
        that plans a query on the driver, with ``${env:...}``/``${file:...}`` references
        resolved, once per query start.

        Args:
            options: the part's options, references resolved.
            kind: ``"source"`` or ``"sink"``.

        The default takes the :attr:`target_options` that are given, with user names and
        passwords taken out of URLs (``postgresql://app:pw@db/orders`` → ``postgresql://db/
        orders``). Override it when a target is spelled several ways (a URL or a host option)
        or when a value holds more than the target (a connection string with timeouts):
        return what names the server, the database and the object, nothing else. An empty
        dict (the default without :attr:`target_options`) means "not declared": no check.
        """
        from epochal_sdk.redaction import without_userinfo

        return {
            name: without_userinfo(options.str(name, "").strip())
            for name in self.target_options
            if options.str(name, "").strip()
        }

    def source(self, options: Options) -> Source:
        """A new source object for these options: ``source_class(options)``. Override it to
        choose a class by option. Called wherever the runtime needs the source: in the
        driver's Python workers (planning, the long-lived source runner) and in each read
        task on the executors; keep it cheap (no I/O: connect in ``check()`` or lazily).

        Args:
            options: the source's options (names checked, references resolved) and, as
                ``options.context``, where it runs.

        Raises:
            TypeError: the connector has no source.
        """
        if self.source_class is None:
            raise TypeError(f"connector {self.name!r} has no source")
        return self.source_class(options)

    def sink(self, options: Options) -> Sink:
        """A new sink object for these options: ``sink_class(options)``. Override it to
        choose a class by option. Called in the driver's Python workers (planning, each
        batch's commit) and in each write task on the executors; keep it cheap.

        Args:
            options: the sink's options (names checked, references resolved) and, as
                ``options.context``, where it runs.

        Raises:
            TypeError: the connector has no sink.
        """
        if self.sink_class is None:
            raise TypeError(f"connector {self.name!r} has no sink")
        return self.sink_class(options)

    @classmethod
    @hookimpl
    def register_connectors(cls, register: Callable[[type], None]) -> None:
        """The plugin hook of a connector class named by an entry point: registers itself.
        Called by the runtime's plugin discovery in every process that looks connectors up.

        Args:
            register: the runtime's callback that takes a connector class.
        """
        register(cls)

    @classmethod
    def contracts(cls) -> list[str]:
        """Names of the contracts its source and sink classes implement (e.g.
        ``["ReplayableSource", "TransactionalSink"]``), for ``python -m epochal connectors``."""
        found = []
        for part in (cls.source_class, cls.sink_class):
            if part is None:
                continue
            found += [c.__name__ for c in CONTRACTS if issubclass(part, c)]
        return found

    @classmethod
    def guarantees(cls) -> dict[str, Guarantee]:
        """The strongest guarantee of the source and of the sink as their classes declare it
        (``MAX_GUARANTEE``), by ``"source"``/``"sink"``; what a part gives with given options
        and a given server is its ``max_guarantee()``."""
        out = {}
        if cls.source_class is not None:
            out["source"] = cls.source_class.MAX_GUARANTEE
        if cls.sink_class is not None:
            out["sink"] = cls.sink_class.MAX_GUARANTEE
        return out
