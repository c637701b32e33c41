"""Connector discovery: pluggy hooks, plugins found through the ``epochal`` entry points.

The runtime never imports a connector by name; it asks the plugins.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from epochal.base import secrets
from epochal_sdk import (
    AcknowledgingSource,
    ConfigError,
    Connector,
    Options,
    ReplayableSource,
)
from epochal_sdk import hookspecs as specs

if TYPE_CHECKING:
    import importlib.metadata

log = logging.getLogger("epochal.parts.registry")

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

BROKEN: dict[str, str] = {}
"""Installed plugins that failed to load, by entry point name, with the error."""

EXTRA_PLUGINS_ENV = "EPOCHAL_PLUGINS"
"""Comma-separated modules to load as plugins besides the installed entry points (for local
connectors and test doubles; inherited by the driver processes the supervisor starts)."""


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The plugin manager with every installed plugin loaded."""
    manager = pluggy.PluginManager(specs.PROJECT)
    manager.add_hookspecs(specs)
    BROKEN.clear()
    for entry_point in _entry_points():
        if manager.get_plugin(entry_point.name) is not None:
            continue
        try:
            plugin = entry_point.load()
        except Exception as exc:  # one broken package must not take the others down
            where = f"{_distribution(entry_point)} ({entry_point.value})"
            BROKEN[entry_point.name] = f"{where}: {type(exc).__name__}: {exc}"
            log.warning("epochal plugin %r failed to load: %s", entry_point.name, exc)
            continue
        manager.register(plugin, name=entry_point.name)
    for module_name in _extra_modules():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            BROKEN[module_name] = f"{EXTRA_PLUGINS_ENV}: {type(exc).__name__}: {exc}"
            log.warning("epochal plugin module %r failed to load: %s", module_name, exc)
            continue
        if not manager.is_registered(module):
            manager.register(module)
    return manager


def _extra_modules() -> list[str]:
    """The module names ``EPOCHAL_PLUGINS`` gives, in order."""
    return [n.strip() for n in os.environ.get(EXTRA_PLUGINS_ENV, "").split(",") if n.strip()]


def _entry_points(name: str = "") -> importlib.metadata.EntryPoints:
    """The installed ``epochal`` entry points (only ``name``'s when given). The processes
    Spark starts for a query load their plugin without them (:func:`_installed_alone`), so
    :mod:`importlib.metadata` is imported only here."""
    from importlib import metadata

    if name:
        return metadata.entry_points(group=specs.ENTRY_POINT_GROUP, name=name)
    return metadata.entry_points(group=specs.ENTRY_POINT_GROUP)


def _distribution(entry_point: importlib.metadata.EntryPoint) -> str:
    """The name of the installed distribution an entry point comes from (``epochal-jsonl``)."""
    dist = getattr(entry_point, "dist", None)
    return str(getattr(dist, "name", None) or f"the package of {entry_point.value}")


def failed_connectors() -> dict[str, str]:
    """Installed connectors whose plugin failed to load (its module raised at import), by
    connector name (the entry point's), with the distribution and the error. Their formats
    are refused with that error (:func:`connector`), never left for Spark to look up."""
    plugin_manager()
    installed = set(installed_names())
    return {name: problem for name, problem in BROKEN.items() if name in installed}


def connectors(manager: pluggy.PluginManager | None = None) -> dict[str, type[Connector]]:
    """Every registered connector class by name."""
    found: dict[str, type[Connector]] = {}

    def register(cls: type) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Connector)):
            raise TypeError(f"register() takes a Connector subclass, got {cls!r}")
        if not _SAFE_ID.match(getattr(cls, "name", "") or ""):
            raise ConfigError(
                "epochal",
                "name",
                f"connector class {cls.__module__}.{cls.__name__} has name "
                f"{getattr(cls, 'name', None)!r}",
                "Name it with letters, digits, '-' and '_'.",
            )
        if cls.name in found and found[cls.name] is not cls:
            raise ConfigError(
                "epochal",
                cls.name,
                f"two plugins register a connector named {cls.name!r} "
                f"({found[cls.name].__module__} and {cls.__module__})",
                "Uninstall one of them.",
            )
        found[cls.name] = cls

    (manager or plugin_manager()).hook.register_connectors(register=register)
    return dict(sorted(found.items()))


def connector(name: str, entry_point: str = "") -> Connector:
    """An instance of the connector ``name``; a clear error naming the installed ones.

    ``entry_point``: the plugin's entry point value (``module:attribute``) as the driver found
    it (:func:`entry_point_value`), carried to the Python processes Spark starts for a query:
    they then load the plugin from it without searching every installed distribution's
    metadata (see :func:`_installed_alone`); the process remembers it for the connector's
    later look-ups."""
    if entry_point:
        _ENTRY_POINTS_GIVEN[name] = entry_point
    alone = _installed_alone(name, _ENTRY_POINTS_GIVEN.get(name, ""))
    if alone is not None:
        return alone()
    available = connectors()
    if name not in available and name in BROKEN:
        raise ConfigError(
            "epochal",
            "format",
            f"format('epochal.{name}'): the connector {name!r} is installed but failed to "
            f"load: {BROKEN[name]}",
            "Fix the error (a connector built for another epochal-sdk release: upgrade it), "
            "or uninstall the package",
        )
    if name not in available:
        installed = ", ".join(available) or "none"
        raise ConfigError(
            "epochal",
            "format",
            f"no connector named {name!r} is installed (installed: {installed})",
            f"pip install epochal-{name}, or check the name after 'epochal.'",
        )
    return available[name]()


def installed_names() -> list[str]:
    """The names of the installed connector plugins (their entry points), without loading
    any of them."""
    return sorted({ep.name for ep in _entry_points()})


_ENTRY_POINTS_GIVEN: dict[str, str] = {}
"""The entry point values this process was given by its driver, by connector name."""


def entry_point_value(name: str) -> str:
    """The value (``module:attribute``) of the installed plugin entry point ``name``, or ""
    when none is installed under that name."""
    found = _entry_points(name=name)
    return next((entry_point.value for entry_point in found), "")


@functools.cache
def _installed_alone(name: str, entry_point: str = "") -> type[Connector] | None:
    """Connector ``name`` loaded from the installed plugin of the same entry point name alone,
    without importing every other installed connector (and its client library): each Python
    process Spark starts for a query (the source runner, the planner and task workers) needs
    one or two connectors, and importing all of them costs it ~0.15 s. None when no such
    plugin registers it (then every plugin is loaded). Two plugins registering one name are
    refused by :func:`connectors`, which :func:`epochal.register` and the CLI run on the
    driver.

    With the ``entry_point`` value the driver found, the plugin is loaded from it directly:
    searching the metadata reads every entry of Python's path, and Spark puts its core jar
    (some 6 000 entries) on the path of each Python process it starts: 0.05 s of CPU in each
    (0.006 s without the jar), some eight processes per query start. A value that no longer
    loads falls back to the search.

    With ``EPOCHAL_PLUGINS`` (local connectors, test doubles), those modules come first: a
    connector they register is loaded from them alone, any other from its installed plugin
    alone. A name registered twice is refused on the driver, whose :func:`register
    <epochal.spark.datasource.register>` loads every plugin."""
    extra = _extra_modules()
    if extra:
        loaded = _load_alone(lambda: [(importlib.import_module(m), None) for m in extra], name)
        if loaded is not None:
            return loaded
    if entry_point:
        # loaded as the entry point would load it, without importing importlib.metadata
        # (and the email and csv packages it needs): 15 ms in each process
        loaded = _load_alone(lambda: [(_load_value(entry_point), name)], name)
        if loaded is not None:
            return loaded  # else moved or gone: search as without it
    installed = next(iter(_entry_points(name=name)), None)
    if installed is None:
        return None
    load = installed.load
    return _load_alone(lambda: [(load(), name)], name)


def _load_value(value: str) -> Any:
    """The object an entry point value (``module:attribute.path``) names."""
    module_name, _, attributes = value.partition(":")
    found: Any = importlib.import_module(module_name.strip())
    for attribute in filter(None, attributes.strip().split(".")):
        found = getattr(found, attribute)
    return found


def _load_alone(
    load: Callable[[], list[tuple[Any, str | None]]], name: str
) -> type[Connector] | None:
    """Connector ``name`` of the plugins ``load`` returns (each with its plugin name, None for
    pluggy's own), alone; None when one fails to load or none registers ``name`` (the full
    discovery then reports why)."""
    manager = pluggy.PluginManager(specs.PROJECT)
    manager.add_hookspecs(specs)
    try:
        for plugin, plugin_name in load():
            manager.register(plugin, name=plugin_name)
        return connectors(manager).get(name)
    except Exception:  # reported, with the others, by the full discovery
        return None


SPARK_OWN_OPTIONS = frozenset({"checkpointlocation", "queryname"})
"""Options Spark hands to a data source that are not the connector's (lower case): a
streaming write's ``checkpointLocation`` and ``queryName`` (``writeStream.queryName(...)`` is
an option to Spark). Neither is part of a part's id: the checkpoint moves with the job's lease
epoch, and a query renamed is the same query."""

RUNTIME_OPTIONS = frozenset(
    {
        "epochal.job",
        "epochal.snapshotDir",
        "epochal.guarantee",
        "epochal.allowDowngrade",
        "epochal.faults",
        "epochal.checkpointLocation",
        "epochal.leaseTtl",
        "epochal.id",
        "epochal.foreachBatchIdempotent",
        "epochal.timeline",
    }
)
"""Every ``epochal.*`` option of a query, the runtime's own: the one list the name check
uses (an ``epochal.*`` option not in it is refused with a "did you mean")."""
PART_OPTIONS = frozenset({"guarantee"})
"""Options the runtime reads from every source and sink (``guarantee``: lower the part's)."""
CONTRACT_OPTIONS: dict[type, frozenset[str]] = {
    ReplayableSource: frozenset({"maxRecordsPerBatch", "minRecordsPerTask"}),
    AcknowledgingSource: frozenset(
        {"maxRecordsPerBatch", "receiveTimeoutMs", "dedupeWindowBatches", "dedupeWindowIds"}
    ),
}
"""Options the runtime reads from a source of each contract (admission control, a replayable
source's tasks per batch, the acknowledging source's receive timeout and dedupe window)."""


def check_runtime_options(options: Mapping[str, str]) -> None:
    """Refuse an ``epochal.*`` option that is not one of :data:`RUNTIME_OPTIONS`, and a job
    name (the ``epochal.job`` option, else ``$EPOCHAL_JOB``) that cannot name a job (it
    names a directory and prefixes transaction ids): before anything is written. Called by
    the data source when Spark creates it on the driver."""
    from epochal.parts.job_context import ENV_JOB
    from epochal.state.layout import check_job_name

    runtime = {k: v for k, v in options.items() if k.lower().startswith("epochal.")}
    Options("epochal", runtime).check_names(RUNTIME_OPTIONS, part="the runtime")
    given = {k.lower(): v for k, v in runtime.items()}.get("epochal.job")
    name = given or os.environ.get(ENV_JOB)
    if name is None:
        return
    try:
        check_job_name(name)
    except ValueError:
        where = "" if given else f" (from the environment variable {ENV_JOB})"
        raise ConfigError(
            "job",
            "epochal.job" if given else ENV_JOB,
            f"{name!r}{where} cannot name a job: it names the job's directory and prefixes "
            "its transaction ids",
            "Use letters, digits, '-' and '_' only.",
        ) from None


def check_options(name: str, kind: str, options: Mapping[str, str]) -> None:
    """Refuse an option connector ``name``'s ``kind`` (``"source"`` or ``"sink"``) does not
    take, with a "did you mean": the connector's declared options
    (:meth:`~epochal_sdk.Connector.declared_options`), its pass-through families
    (``option_prefixes``), the runtime's options of the part (:data:`PART_OPTIONS`,
    :data:`CONTRACT_OPTIONS`) and Spark's own. A connector that declares nothing for ``kind``
    is not checked. Called on the driver when a query plans the part, before it is built."""
    cls = type(connector(name))
    declared = cls.declared_options(kind)
    if declared is None:
        return
    klass = cls.source_class if kind == "source" else cls.sink_class
    runtime = set(PART_OPTIONS)
    for contract, names in CONTRACT_OPTIONS.items():
        if klass is None or issubclass(klass, contract):
            runtime |= names
    user = {
        k: v
        for k, v in options.items()
        if not k.lower().startswith("epochal.") and k.lower() not in SPARK_OWN_OPTIONS
    }
    Options(name, user).check_names(
        declared | runtime, cls.option_prefixes, part=f"the {name} {kind}"
    )


def restartable_errors(name: str) -> tuple[type[BaseException], ...]:
    """The client library errors connector ``name`` declares restartable
    (:attr:`~epochal_sdk.Connector.restartable_errors`); none for an unknown connector."""
    try:
        return tuple(type(connector(name)).restartable_errors)
    except Exception:  # an unknown connector: its own error comes where it is built
        return ()


def target_of(name: str, kind: str, options: Options) -> dict[str, str]:
    """Where connector ``name``'s ``kind`` with these (resolved) options writes or reads
    (:meth:`~epochal_sdk.Connector.target`), as it may be written down: secret entries left
    out and secrets in values masked (a backstop: a target names no secret). Empty when the
    connector declares no target."""
    found = connector(name).target(options, kind)
    return secrets.recordable({str(k): str(v) for k, v in found.items()})


TUNING_OPTIONS = frozenset(name.lower() for name in PART_OPTIONS.union(*CONTRACT_OPTIONS.values()))
"""The runtime's options of a part (lower case): they tune how the runtime drives it (its
guarantee, admission control, tasks per batch, receive timeout, dedupe window), not what it
reads or writes, so none is part of its id: changing one keeps the part's snapshot entries
(an acknowledging source's stored batches and dedupe ids, a sink's decisions)."""


def _identity(name: str, options: Mapping[str, str]) -> dict[str, str]:
    """The options that say what a part reads or writes (lower-case names): its user options
    without secrets (:func:`~epochal.base.secrets.without_secrets`)."""
    user = {
        k.lower(): v
        for k, v in options.items()
        if not k.lower().startswith("epochal.") and k.lower() not in SPARK_OWN_OPTIONS
    }
    return secrets.without_secrets(user, declared_secrets(name))


def _digest_id(name: str, identity: Mapping[str, str]) -> str:
    digest = hashlib.sha1(json.dumps(dict(identity), sort_keys=True).encode()).hexdigest()[:10]
    return f"{name}-{digest}"


def part_id(name: str, options: Mapping[str, str]) -> str:
    """A stable id for one source or sink of a query: ``epochal.id`` if given, else the
    connector name and a hash of the options that say what it reads or writes: not
    :data:`TUNING_OPTIONS`, Spark's own or secrets (the same target gives the same id after
    a restart, so the snapshot entries are found again). A part a job knows under the id an
    earlier runtime gave it keeps that id (:func:`epochal.parts.records.part_id_in_job`)."""
    explicit = explicit_part_id(options)
    if explicit:
        if not _SAFE_ID.match(explicit):
            raise ConfigError(
                name,
                "epochal.id",
                f"{explicit!r} is not allowed",
                "Use letters, digits, '-' and '_' (it names snapshot entries and prefixes "
                "transaction ids).",
            )
        return explicit
    identity = _identity(name, options)
    return _digest_id(name, {k: v for k, v in identity.items() if k not in TUNING_OPTIONS})


def explicit_part_id(options: Mapping[str, str]) -> str | None:
    """The ``epochal.id`` option (any case), if given and not empty."""
    return {k.lower(): v for k, v in options.items()}.get("epochal.id") or None


def is_options_id(name: str, part_id: str) -> bool:
    """Whether ``part_id`` has the shape of an id connector ``name``'s options give (the
    name and a 10-digit hash; every runtime's), not one a user gave with ``epochal.id``."""
    return re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{10}}", part_id) is not None


def declared_secrets(name: str) -> frozenset[str]:
    """The options connector ``name`` declares secret (none for an unknown connector)."""
    try:
        return frozenset(getattr(type(connector(name)), "secret_options", frozenset()))
    except Exception:  # an unknown connector: its error comes where it is built
        return frozenset()
