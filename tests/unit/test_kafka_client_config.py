"""The librdkafka configuration the Kafka connector builds from a part's options: ``kafka.*``
options pass through without the prefix, and the connector's own defaults (quiet logs, a
prompt first connection) give way to a user's option of the same name."""

from __future__ import annotations

from epochal_kafka.common import PROMPT_CONNECT, client_config

from epochal_sdk import Options


def test_the_connectors_defaults_and_the_users_options():
    config = client_config(Options("kafka", {"kafka.bootstrap.servers": "b:9092"}))
    assert config["reconnect.backoff.ms"] == PROMPT_CONNECT["reconnect.backoff.ms"] == 10
    assert config["bootstrap.servers"] == "b:9092"

    given = {
        "bootstrapServers": "b:9092",
        "kafka.reconnect.backoff.ms": "250",
        "kafka.log_level": "6",
    }
    config = client_config(Options("kafka", given))
    assert config["reconnect.backoff.ms"] == "250"  # the user's, not the default
    assert config["log_level"] == "6"
    assert config["bootstrap.servers"] == "b:9092"
