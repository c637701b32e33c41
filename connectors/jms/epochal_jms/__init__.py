"""epochal-jms: JMS brokers over STOMP 1.2.

An acknowledging source (queues, durable topic subscriptions; ``ack:client-individual``) and a
sink that sends each task's messages in one STOMP transaction with stable duplicate IDs
(``_AMQ_DUPL_ID``), exactly-once on ActiveMQ Artemis.
"""

from epochal_jms.client import BrokerConfig, BrokerError, StompClient
from epochal_jms.connector import JmsConnector
from epochal_jms.sink import JmsSink
from epochal_jms.source import JmsSource

__all__ = ["BrokerConfig", "BrokerError", "JmsConnector", "JmsSink", "JmsSource", "StompClient"]
