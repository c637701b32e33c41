"""A connector: a name, a description, and its source and/or sink classes."""

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

    and one line in ``pyproject.toml`` registers it (a connector class is a plugin itself)::

        [project.entry-points.epochal]
        map = "epochal_map.connector:MapConnector"

    ``spark.readStream.format("epochal.map")`` then builds ``MapJournalSource(options)``.
    (A plugin module with a ``register_connectors`` hook, named by the entry point instead,
    works as before: it can register several classes.)
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    source_class: ClassVar[type[Source] | None] = None
    sink_class: ClassVar[type[Sink] | None] = None
    secret_options: ClassVar[frozenset[str]] = frozenset()
    """Options whose values are secrets (passwords, keys, tokens): never written to a
    record, a log, an error, a metric or an id, and left out of the part's identity (a
    rotated password keeps the part's in-doubt transactions). Options named like a secret
    (``password``, ``token``, ``*.pem``, ``sasl.*``, ...) are treated as secret anyway; a
    secret inside a value (``scheme://user:secret@host``, ``password=...``) is masked."""

    def source(self, options: Options) -> Source:
        """Build the source for these options (override to choose a class by option)."""
        if self.source_class is None:
            raise TypeError(f"connector {self.name!r} has no source")
        return self.source_class(options)

    def sink(self, options: Options) -> Sink:
        """Build the sink for these options (override to choose a class by option)."""
        if self.sink_class is None:
            raise TypeError(f"connector {self.name!r} has no sink")
        return self.sink_class(options)

    @classmethod
    @hookimpl
    def register_connectors(cls, register: Callable[[type], None]) -> None:
        """The plugin hook of a connector class named by an entry point: registers itself."""
        register(cls)

    @classmethod
    def contracts(cls) -> list[str]:
        """Names of the contracts this connector implements."""
        found = []
        for part in (cls.source_class, cls.sink_class):
            if part is None:
                continue
            found += [c.__name__ for c in CONTRACTS if issubclass(part, c)]
        return found

    @classmethod
    def guarantees(cls) -> dict[str, Guarantee]:
        """The strongest guarantee of the source and of the sink, as declared."""
        out = {}
        if cls.source_class is not None:
            out["source"] = cls.source_class.MAX_GUARANTEE
        if cls.sink_class is not None:
            out["sink"] = cls.sink_class.MAX_GUARANTEE
        return out
