"""The plugin epochal finds through the ``epochal`` entry point group."""

from __future__ import annotations

from collections.abc import Callable

from epochal_jdbc.connector import JdbcConnector
from epochal_sdk import hookimpl


@hookimpl
def register_connectors(register: Callable[[type], None]) -> None:
    """Register the jdbc connector."""
    register(JdbcConnector)
