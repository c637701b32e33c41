"""Test plugin: registers another connector named ``dup`` (clashes with epochal_unit_dup_a)."""

from __future__ import annotations

from epochal_sdk import Connector
from epochal_sdk.hookspecs import hookimpl


class DupB(Connector):
    name = "dup"
    description = "second plugin that claims the name 'dup'"


@hookimpl
def register_connectors(register) -> None:
    register(DupB)
