"""The harness's local servers, the way for machines without a Docker engine (with one, the
suite's server fixtures are containers: integration.harness.containers). Each local server
starts from the harness cache and the machine's packages, answers its own client, is killed
(SIGKILL) and frozen (SIGSTOP) and comes back with its data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from integration.harness.jms import PASSWORD as JMS_PASSWORD
from integration.harness.jms import USER as JMS_USER
from integration.harness.jms import LocalArtemis, stomp_ready
from integration.harness.kafka import LocalKafka, kafka_ready
from integration.harness.postgres import LocalPostgres, postgres_ready
from integration.harness.server import LocalBackend

pytestmark = pytest.mark.integration


def _kafka() -> tuple[LocalBackend, Callable[[], Any]]:
    server = LocalKafka("kafka-local-test")
    return server, lambda: kafka_ready(server.bootstrap_servers)


def _postgres() -> tuple[LocalBackend, Callable[[], Any]]:
    server = LocalPostgres("postgres-local-test")
    return server, lambda: postgres_ready(server.dsn)


def _artemis() -> tuple[LocalBackend, Callable[[], Any]]:
    server = LocalArtemis("jms-local-test")
    return server, lambda: stomp_ready("127.0.0.1", server.stomp_port, JMS_USER, JMS_PASSWORD)


@pytest.mark.parametrize("make", [_kafka, _postgres, _artemis], ids=["kafka", "postgres", "jms"])
def test_a_local_server_starts_and_comes_back_after_a_kill_and_a_freeze(
    make: Callable[[], tuple[LocalBackend, Callable[[], Any]]],
) -> None:
    server, answers = make()
    try:
        server.start()
        assert answers()
        server.kill()
        assert not server.is_running()
        server.start()
        assert answers()
        server.pause()
        try:
            answered = answers()
        except Exception:  # a frozen server answers nothing: the client times out
            answered = False
        assert not answered, "a frozen server answered"
        server.unpause()
        server.wait_ready()
        assert answers()
    finally:
        server.close()
