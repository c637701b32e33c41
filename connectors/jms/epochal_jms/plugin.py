"""The plugin module of earlier versions (the entry point now names the connector class, which
registers itself); kept so that plugin lists that name this module still work."""

from __future__ import annotations

from collections.abc import Callable

from epochal_jms.connector import JmsConnector
from epochal_sdk import hookimpl


@hookimpl
def register_connectors(register: Callable[[type], None]) -> None:
    """Register the JMS connector."""
    register(JmsConnector)
