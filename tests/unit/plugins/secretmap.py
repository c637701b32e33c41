"""Test plugin: ``secretmap``, the map connector taking three options more, which the
secret-scan job test (tests/spark/test_jobs.py) fills with secrets: ``password`` and
``token`` (declared secret) and ``endpoint`` (a URL with a password in it)."""

from __future__ import annotations

from epochal_map.connector import MapConnector
from epochal_sdk.hookspecs import hookimpl


class SecretMapConnector(MapConnector):
    """The map connector, named ``secretmap``, that accepts (and ignores) secret options."""

    name = "secretmap"
    secret_options = frozenset({"password", "token"})
    sink_options = MapConnector.sink_options | {"endpoint"}


@hookimpl
def register_connectors(register) -> None:
    """Register ``secretmap``."""
    register(SecretMapConnector)
