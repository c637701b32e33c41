"""Test plugin: registers a connector named ``dup`` (clashes with epochal_unit_dup_b)."""

from __future__ import annotations

from epochal_sdk import Connector
from epochal_sdk.hookspecs import hookimpl


class DupA(Connector):
    name = "dup"
    description = "first plugin that claims the name 'dup'"


@hookimpl
def register_connectors(register) -> None:
    register(DupA)
