"""The JMS connector: an acknowledging source and a sink, over STOMP 1.2."""

from __future__ import annotations

from epochal_jms.client import BrokerConfig
from epochal_jms.sink import JmsSink
from epochal_jms.source import JmsSource, destination_of
from epochal_sdk import Connector, Options

_CONNECTION = frozenset({"url", "user", "password", "heartbeatMs", "connectTimeoutMs"})


class JmsConnector(Connector):
    """``format("epochal.jms")``: JMS queues and topics through a broker's STOMP acceptor."""

    name = "jms"
    description = (
        "JMS broker over STOMP 1.2 (ActiveMQ Artemis): acknowledging source with dedupe, "
        "sink with broker-side duplicate detection"
    )
    source_class = JmsSource
    sink_class = JmsSink
    secret_options = frozenset({"password"})
    source_options = _CONNECTION | {
        "destination",
        "durableSubscription",
        "clientId",
        "idHeader",
        "bodyType",
        "consumerWindowSize",
    }
    sink_options = _CONNECTION | {
        "destination",
        "destinationColumn",
        "bodyColumn",
        "headersColumn",
        "headerColumns",
        "persistent",
        "idHeader",
        "duplicateIdCacheSize",
    }
    target_options = ("url", "destination", "destinationColumn")

    def target(self, options: Options, kind: str) -> dict[str, str]:
        """The broker (``host:port``, without who logs in) and the destination (a sink that
        takes each record's destination from a column names the column)."""
        found = {"broker": BrokerConfig.from_options(options).address}
        column = options.str("destinationColumn", "").strip() if kind == "sink" else ""
        if column:
            found["destinationColumn"] = column
        else:
            found["destination"] = destination_of(options)
        return found
