"""The conformance kit on the acknowledging-source protocol, with the broker test double
(``testqueue``): each crash point of the ack protocol, both guarantees. The JMS connector runs
the same suite against a real broker."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from epochal.parts import registry
from epochal.testing import ConformanceSuite, SourceUnderTest
from epochal.testing.broker import TestBroker
from epochal_map.testing import MapSinkUnderTest
from epochal_sdk import Guarantee


class QueueUnderTest(SourceUnderTest):
    """A queue of the broker double: message IDs are the record IDs."""

    connector = "testqueue"
    id_expr = "CAST(id AS BIGINT)"

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def options(self) -> dict[str, str]:
        return {"path": self.path, "queue": "orders", "receiveTimeoutMs": "300"}

    def produce(self, ids: Sequence[int]) -> None:
        broker = TestBroker(self.path)
        broker.send("orders", [(str(i), f"order {i}") for i in ids])
        broker.close()

    def unsettled(self) -> list[str]:
        broker = TestBroker(self.path)
        states = broker.states("orders")
        broker.close()
        return [f"{n} message(s) {state}" for state, n in states.items() if state != "acked"]


class TestAckConformance(ConformanceSuite):
    """Broker double → Spark → map sink (transactional)."""

    source_contract = "acknowledging"
    sink_modes = ("transactional",)
    scope = "source"
    # The JMS connector runs this suite at both guarantees against a real broker; with the
    # double, exactly-once (the stored-batch and dedupe path) is what the runtime adds.
    guarantees = (Guarantee.EXACTLY_ONCE,)
    whole_driver_kills = True
    real_failures = False  # the JMS suite runs them against a real broker
    source_connector = "testqueue"
    sink_connector = "map"

    @pytest.fixture(autouse=True)
    def _broker_plugin(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.setenv(registry.EXTRA_PLUGINS_ENV, "epochal.testing.broker")
        registry.plugin_manager.cache_clear()
        yield
        registry.plugin_manager.cache_clear()

    @pytest.fixture
    def epochal_source(self, tmp_path: Path) -> QueueUnderTest:
        return QueueUnderTest(tmp_path / "queue.sqlite")

    @pytest.fixture
    def epochal_sink(self, epochal_map_sink: MapSinkUnderTest) -> MapSinkUnderTest:
        return epochal_map_sink
