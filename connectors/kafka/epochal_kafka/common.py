"""What the Kafka source and sink share: client configuration, broker checks, error mapping."""

from __future__ import annotations

import re
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from epochal_sdk import ConfigError, Options, RestartableError, unreachable

CONNECTOR = "kafka"
CLIENT_PREFIX = "kafka."
"""Options starting with ``kafka.`` go to librdkafka without the prefix (as in Spark's Kafka
connector): ``kafka.bootstrap.servers``, ``kafka.security.protocol``, ..."""

QUIET = {"log_level": 3}
"""librdkafka logs errors only (its warnings about retried requests are noise here)."""

PROMPT_CONNECT = {"reconnect.backoff.ms": 10}
"""A new client's first connection to a broker it learned from the bootstrap metadata waits
librdkafka's reconnect backoff (100 ms by default, jittered), though it never connected to that
broker before; 10 ms (still doubling up to ``reconnect.backoff.max.ms`` while a broker stays
down). Measured against one broker on loopback: a new transactional producer's
``init_transactions()`` 54 → 15 ms (p50), a new marker consumer's first committed-offset read
53 → 14 ms. ``kafka.reconnect.backoff.ms`` overrides it."""


def bootstrap_servers(options: Options) -> str:
    """The brokers: ``kafka.bootstrap.servers``, else its alias ``bootstrapServers``; a clear
    error when neither is given."""
    found = (
        options.str(f"{CLIENT_PREFIX}bootstrap.servers", "").strip()
        or options.str("bootstrapServers", "").strip()
    )
    if not found:
        raise ConfigError(
            CONNECTOR,
            "kafka.bootstrap.servers",
            "is required",
            "Set .option('kafka.bootstrap.servers', 'host:9092[,host2:9092]').",
        )
    return found


def client_config(options: Options) -> dict[str, Any]:
    """The librdkafka configuration from ``kafka.*`` options (``bootstrapServers`` is an alias
    of ``kafka.bootstrap.servers``); a clear error when no broker address is given. The
    properties themselves are checked by librdkafka when the first client is made
    (:func:`admin_client`, at the part's check). :data:`QUIET` and :data:`PROMPT_CONNECT` are
    defaults a ``kafka.*`` option overrides."""
    config: dict[str, Any] = {
        key[len(CLIENT_PREFIX) :]: value
        for key, value in options.items()
        if key.startswith(CLIENT_PREFIX)
    }
    config["bootstrap.servers"] = bootstrap_servers(options)
    return {**QUIET, **PROMPT_CONNECT, **config}


_PROPERTY = re.compile(r'(?:property|for):? "(?P<name>[^"]+)"')


def config_error(exc: KafkaException, config: dict[str, Any]) -> ConfigError | None:
    """librdkafka's refusal of a configuration (``_INVALID_ARG``: an unknown property, a bad
    value) as a :class:`ConfigError` naming the ``kafka.*`` option; None for any other
    error."""
    error = kafka_error(exc)
    if error.code() != KafkaError._INVALID_ARG:
        return None
    said = error.str()
    found = _PROPERTY.search(said)
    name = found.group("name") if found else ""
    option = f"{CLIENT_PREFIX}{name}" if name in config else f"{CLIENT_PREFIX}*"
    return ConfigError(
        CONNECTOR,
        option,
        f"the Kafka client (librdkafka) refused it: {said}",
        "Options starting with 'kafka.' go to librdkafka without the prefix: check the name "
        "and value against librdkafka's CONFIGURATION.md, or drop the option.",
    )


def admin_client(config: dict[str, Any]) -> AdminClient:
    """An admin client for ``config`` (librdkafka ignores consumer-only keys there, but
    checks every property's name and value: a bad one is a :class:`ConfigError` naming the
    option, not librdkafka's raw ``_INVALID_ARG``)."""
    try:
        return AdminClient(dict(config))
    except KafkaException as exc:
        refused = config_error(exc, config)
        if refused is None:
            raise
        raise refused from None


def list_topics(admin: AdminClient, bootstrap: str, timeout: float, *, at_start: bool) -> Any:
    """Cluster metadata. In the checks before a job's batches (``at_start``) an unreachable
    cluster is the SDK's ``unreachable`` error (a :class:`ConfigError` when the job starts: check
    the address; a :class:`RestartableError` on a restart); elsewhere a
    :class:`RestartableError` (the job restarts from its snapshot)."""
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        problem = (
            f"no broker at {bootstrap!r} answered a metadata request within "
            f"{timeout:g}s ({exc.args[0]})"
        )
        if at_start:
            raise unreachable(
                CONNECTOR,
                "kafka.bootstrap.servers",
                problem,
                "Check the address and that the brokers are up (and security settings).",
            ) from None
        raise RestartableError(f"kafka: {problem}") from None


def kafka_error(exc: KafkaException) -> KafkaError:
    """The :class:`KafkaError` inside a :class:`KafkaException`."""
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return error
    return KafkaError(KafkaError._FAIL, str(exc))


def is_transient(error: KafkaError) -> bool:
    """Whether an error is worth a restart (lost connection, timeout, leader change)."""
    transient = {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
    return error.retriable() or error.code() in transient
