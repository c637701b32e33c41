"""The plugin hooks. A connector package is a pluggy plugin found through the ``epochal``
entry point group::

    # pyproject.toml
    [project.entry-points.epochal]
    map = "epochal_map.plugin"

    # epochal_map/plugin.py
    from epochal_sdk.hookspecs import hookimpl

    @hookimpl
    def register_connectors(register):
        register(MapConnector)
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
