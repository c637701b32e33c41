"""Test plugin: registers one connector, ``unitextra``, with a source and no sink."""

from __future__ import annotations

from epochal_sdk import AcknowledgingSource, Connector
from epochal_sdk.hookspecs import hookimpl


class ExtraSource(AcknowledgingSource):
    def schema(self) -> str:
        return "id string"

    def open(self, max_unacknowledged: int) -> None:
        pass

    def receive(self, max_messages: int, timeout: float) -> list:
        return []

    def acknowledge(self, ids) -> None:
        pass


class ExtraConnector(Connector):
    name = "unitextra"
    source_class = ExtraSource


@hookimpl
def register_connectors(register) -> None:
    register(ExtraConnector)
