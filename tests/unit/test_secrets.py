"""Secrets never reach a record, an error or an id: declared secret options, the name
backstop, values masked by their shape, identities that survive a password rotation, and
``${env:...}``/``${file:...}`` references kept as references."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epochal.base import secrets
from epochal.parts import registry
from epochal.parts.job_context import JobContext
from epochal.spark.common import Part, recordable_options
from epochal_sdk import ConfigError, Connector

SECRET = "s3cr3t-Value"


@pytest.mark.parametrize(
    "option",
    [
        "password",
        "kafka.ssl.key.pem",
        "kafka.ssl.key.password",
        "kafka.sasl.oauthbearer.config",
        "kafka.sasl.jaas.config",
        "aws.access.key.id",
        "apikey",
        "api_key",
        "passwd",
        "pwd",
        "auth",
        "headers",
        "token",
        "clientSecret",
    ],
)
def test_options_named_like_secrets_are_never_recorded(option: str) -> None:
    options = {option: SECRET, "table": "events"}
    recorded = recordable_options("map", options)
    assert recorded == {"table": "events"}
    assert SECRET not in repr(registry.part_id("map", options))


@pytest.mark.parametrize(
    "value",
    [
        f"postgresql://app:{SECRET}@db:5432/orders",
        f"stomp://admin:{SECRET}@broker:61613",
        f"host=db sslpassword={SECRET} user=app",
        f"host=db password='{SECRET}\\'x' user=app",
        f"OAuthBearerLoginModule required clientId=x clientSecret={SECRET};",
        f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----",
    ],
)
def test_secrets_inside_values_are_masked(value: str) -> None:
    recorded = recordable_options("map", {"url": value})
    assert SECRET not in recorded["url"] and secrets.MASK in recorded["url"]
    assert SECRET not in str(ConfigError("jdbc", "url", f"{value} is not reachable", "Fix it."))


def test_a_connector_declares_its_secret_options(monkeypatch: pytest.MonkeyPatch) -> None:
    class Vault(Connector):
        name = "vault"
        secret_options = frozenset({"unlock"})

    monkeypatch.setattr(registry, "connector", lambda name: Vault())
    assert recordable_options("vault", {"unlock": SECRET, "path": "/a"}) == {"path": "/a"}
    assert registry.part_id("vault", {"unlock": "a", "path": "/a"}) == registry.part_id(
        "vault", {"unlock": "b", "path": "/a"}
    )


def test_rotating_a_password_keeps_the_parts_id_a_new_target_does_not() -> None:
    before = {"url": "postgresql://app:old@db/orders", "password": "old", "table": "t"}
    rotated = {"url": "postgresql://app:new@db/orders", "password": "new", "table": "t"}
    elsewhere = {"url": "postgresql://app:new@db/orders", "password": "new", "table": "u"}
    assert registry.part_id("jdbc", before) == registry.part_id("jdbc", rotated)
    assert registry.part_id("jdbc", rotated) != registry.part_id("jdbc", elsewhere)


def test_references_are_resolved_for_the_connector_and_recorded_as_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")
    monkeypatch.setenv("EPOCHAL_TEST_TOKEN", SECRET)
    options = {
        "path": "/a",
        "login": f"${{file:{secret_file}}}",
        "key": "${env:EPOCHAL_TEST_TOKEN}",
    }
    part = Part("map", options, registry.part_id("map", options), JobContext())
    seen = part.connector_options()
    assert seen.str("login", "") == SECRET and seen.str("key", "") == SECRET
    recorded = recordable_options("map", options)
    assert recorded["login"].startswith("${file:") and SECRET not in repr(recorded)
    monkeypatch.delenv("EPOCHAL_TEST_TOKEN")
    with pytest.raises(ConfigError, match=r"EPOCHAL_TEST_TOKEN.*not set"):
        part.connector_options()
    os.unlink(secret_file)
    with pytest.raises(ConfigError, match="cannot be read"):
        secrets.resolve("login", f"${{file:{secret_file}}}")


def test_what_the_store_writes_is_its_owners_only(tmp_path: Path) -> None:
    """Entries, records and the directories they create: 0600 and 0700, whatever the
    process's umask."""
    from epochal.state.store import SnapshotStore, put_record

    old = os.umask(0o022)
    try:
        store = SnapshotStore(str(tmp_path / "job" / "store"))
        store.write_json("sinks/s/decisions/000000000001", {"batch": 1})
        put_record(SnapshotStore(str(tmp_path / "job")), "job.json", {"name": "job"})
    finally:
        os.umask(old)
    for path in tmp_path.joinpath("job").rglob("*"):
        expected = 0o700 if path.is_dir() else 0o600
        assert path.stat().st_mode & 0o777 == expected, path
