"""The plugin hook. A connector package is a pluggy plugin found through the ``epochal``
entry point group, named after the connector. The entry point names the
:class:`~epochal_sdk.Connector` class, which implements the hook itself
(:meth:`Connector.register_connectors <epochal_sdk.Connector.register_connectors>`)::

    # pyproject.toml
    [project.entry-points.epochal]
    jsonl = "epochal_jsonl.connector:JsonlConnector"

A plugin module that registers several connectors implements the hook with the marker::

    # pyproject.toml:  jsonl = "epochal_jsonl.plugin"
    # epochal_jsonl/plugin.py
    from epochal_sdk.hookspecs import hookimpl

    @hookimpl
    def register_connectors(register):
        register(JsonlConnector)
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT = "epochal"
ENTRY_POINT_GROUP = "epochal"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_connectors(register: Callable[[type], None]) -> None:
    """Register connector classes (subclasses of :class:`epochal_sdk.Connector`) by calling
    ``register(ConnectorClass)`` once for each."""
