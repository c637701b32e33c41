"""The JMS connector: an acknowledging source and a sink, over STOMP 1.2."""

from __future__ import annotations

from epochal_jms.sink import JmsSink
from epochal_jms.source import JmsSource
from epochal_sdk import Connector


class JmsConnector(Connector):
    """``format("epochal.jms")``: JMS queues and topics through a broker's STOMP acceptor."""

    name = "jms"
    description = (
        "JMS broker over STOMP 1.2 (ActiveMQ Artemis): acknowledging source with dedupe, "
        "sink with broker-side duplicate detection"
    )
    source_class = JmsSource
    sink_class = JmsSink
