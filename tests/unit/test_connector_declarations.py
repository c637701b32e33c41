"""What a connector declares and the runtime acts on: the client library errors that are
worth a restart (``Connector.restartable_errors``), the options its parts take
(``source_options``/``sink_options``), the target its parts write to or read from
(``target()``), and options shown without their secrets."""

from __future__ import annotations

import traceback

import pytest

from epochal.control import failures
from epochal.parts import registry
from epochal.parts.job_context import JobContext
from epochal.spark.common import Part, protocol_step
from epochal_map.connector import MapConnector
from epochal_sdk import ConfigError, Connector, Options


class ClientGoneError(Exception):
    """A client library's "the server went away" (not a builtin ConnectionError)."""


class _Flaky(Connector):
    name = "flaky"
    restartable_errors = (ClientGoneError,)


def test_a_client_error_a_connector_declares_restartable_restarts_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "connector", lambda name: _Flaky())
    part = Part("flaky", {}, "flaky-1", JobContext())

    def failure(error: Exception) -> failures.Failure:
        with pytest.raises(type(error)) as raised, protocol_step(part, 3, "task 0 write"):
            raise error
        return failures.classify("".join(traceback.format_exception(raised.value)))

    assert failure(ClientGoneError("server went away")) == failures.Failure.RESTARTABLE
    assert failure(ValueError("a bug")) == failures.Failure.FATAL


def test_options_are_shown_without_their_secrets() -> None:
    shown = repr(Options("jdbc", {"password": "pw-5ecret", "url": "postgresql://a:u-5ecret@h/d"}))
    assert "5ecret" not in shown and "'url': 'postgresql://a:***@h/d'" in shown, shown


def test_declared_options_include_the_secret_ones_and_undeclared_means_unchecked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert {"password", "token"} <= set(_Vault.declared_options("sink") or ())
    assert _Vault.declared_options("source") is None
    monkeypatch.setattr(registry, "connector", lambda name: _Vault())
    registry.check_options("vault", "source", {"anything": "1"})  # not declared: not checked
    registry.check_options("vault", "sink", {"path": "/a", "token": "t", "guarantee": "none"})
    with pytest.raises(ConfigError, match="option 'anything': is not an option of the vault"):
        registry.check_options("vault", "sink", {"anything": "1"})
    assert MapConnector.declared_options("sink") >= {"mode", "path", "map"}
    with pytest.raises(ValueError, match="'source' or 'sink'"):
        MapConnector.declared_options("both")


class _Vault(Connector):
    name = "vault"
    secret_options = frozenset({"password", "token"})
    sink_options = frozenset({"path"})
    target_options = ("path", "endpoint")


def test_the_default_target_is_the_declared_options_without_who_logs_in() -> None:
    options = Options("vault", {"path": "/a", "endpoint": "https://me:pw-5ecret@vault:8200/v1"})
    assert _Vault().target(options, "sink") == {"path": "/a", "endpoint": "https://vault:8200/v1"}
    assert Connector.target(_Vault(), Options("vault", {}), "sink") == {}
