"""A small STOMP 1.2 client on stomp.py: connection options, frames in a queue, receipts.

Both the source and the sink use it. It turns stomp.py's callbacks into a queue of MESSAGE
frames and waits for receipts (or the ERROR frame that answers them) with deadlines.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import stomp
from stomp.exception import StompException

from epochal_sdk import ConfigError, EpochalError, Options, unreachable

CONNECTOR = "jms"
DEFAULT_PORT = 61613
RECEIPT_TIMEOUT_S = 30.0


class BrokerError(EpochalError):
    """The broker answered with an ERROR frame, or the connection is gone."""


@dataclass(frozen=True)
class BrokerConfig:
    """Where the broker is and how to log in: the ``url`` option
    (``stomp://user:password@host:port``) and the optional ``user``/``password`` options,
    which win over the URL's."""

    host: str
    port: int
    user: str
    password: str
    heartbeat_ms: int = 10_000
    connect_timeout_ms: int = 30_000

    @classmethod
    def from_options(cls, options: Options) -> BrokerConfig:
        """Read and check the connection options (no I/O)."""
        url = options.required(
            "url", "Set .option('url', 'stomp://user:password@host:61613') to the STOMP acceptor."
        )
        parts = urlsplit(url if "://" in url else f"stomp://{url}")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            port = -1
        if parts.scheme not in ("stomp", "tcp") or not parts.hostname or port <= 0:
            raise ConfigError(
                CONNECTOR,
                "url",
                f"{url!r} is not a STOMP address",
                "Write it as stomp://user:password@host:port (port 61613 by default).",
            )
        return cls(
            host=parts.hostname,
            port=port,
            user=options.str("user", unquote(parts.username or "")),
            password=options.str("password", unquote(parts.password or "")),
            heartbeat_ms=options.int("heartbeatMs", 10_000, minimum=0),
            connect_timeout_ms=options.int("connectTimeoutMs", 30_000, minimum=0),
        )

    @property
    def address(self) -> str:
        """``host:port`` for messages."""
        return f"{self.host}:{self.port}"


class StompClient(stomp.ConnectionListener):
    """One STOMP 1.2 connection. MESSAGE frames go to :attr:`messages`; receipts and ERROR
    frames are matched by :meth:`wait_receipt`; :attr:`lost` tells that the connection is gone.

    Bodies are kept as bytes (no decoding by stomp.py).
    """

    def __init__(self, config: BrokerConfig, client_id: str | None = None) -> None:
        self.config = config
        self.client_id = client_id
        self.messages: queue.Queue[Any] = queue.Queue()
        self.server = ""
        self.lost = False
        self.error: str | None = None
        self._receipts: set[str] = set()
        self._errors: dict[str, str] = {}
        self._cond = threading.Condition()
        beat = config.heartbeat_ms
        self.conn = stomp.Connection12(
            [(config.host, config.port)],
            heartbeats=(beat, beat),
            reconnect_attempts_max=1,
            auto_decode=False,
            timeout=10,
        )
        self.conn.set_listener("epochal", self)

    # -- stomp.py callbacks -------------------------------------------------------------------
    def on_connected(self, frame: Any) -> None:
        """Remember the broker's ``server`` header."""
        self.server = frame.headers.get("server", "")

    def on_message(self, frame: Any) -> None:
        """Queue a MESSAGE frame."""
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        """Note a RECEIPT."""
        with self._cond:
            self._receipts.add(frame.headers.get("receipt-id", ""))
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        """Note an ERROR frame (the broker closes the connection after it)."""
        body = frame.body.decode("utf-8", "replace") if isinstance(frame.body, bytes) else ""
        text = (frame.headers.get("message", "") + " " + body).strip() or "ERROR frame"
        with self._cond:
            self.error = text
            self._errors[frame.headers.get("receipt-id", "")] = text
            self._cond.notify_all()

    def on_disconnected(self) -> None:
        """The connection is gone."""
        with self._cond:
            self.lost = True
            self._cond.notify_all()

    # -- use ----------------------------------------------------------------------------------
    @property
    def is_artemis(self) -> bool:
        """Whether the broker says it is ActiveMQ Artemis (CONNECTED ``server`` header)."""
        return "artemis" in self.server.lower()

    def connect(self) -> StompClient:
        """Connect and log in; :class:`BrokerError` when that fails."""
        headers = {"client-id": self.client_id} if self.client_id else {}
        try:
            self.conn.connect(self.config.user, self.config.password, wait=True, headers=headers)
        except (StompException, OSError) as exc:
            detail = self.error or type(exc).__name__
            raise BrokerError(
                f"cannot connect to the STOMP broker at {self.config.address} as "
                f"{self.config.user or '<no user>'!r}: {detail}"
            ) from exc
        if not self.conn.is_connected():
            raise BrokerError(
                f"the STOMP broker at {self.config.address} refused the connection: "
                f"{self.error or 'no reason given'}"
            )
        return self

    def receipt(self) -> str:
        """A fresh receipt id."""
        return uuid.uuid4().hex

    def wait_receipt(self, receipt: str, what: str, timeout: float = RECEIPT_TIMEOUT_S) -> None:
        """Wait for the RECEIPT of ``receipt``; :class:`BrokerError` on an ERROR frame, a lost
        connection or the deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while receipt not in self._receipts:
                if receipt in self._errors or self.error is not None:
                    raise BrokerError(f"{what}: the broker answered {self.error!r}")
                if self.lost:
                    raise BrokerError(f"{what}: the connection to {self.config.address} is gone")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerError(f"{what}: no receipt from the broker within {timeout:.0f} s")
                self._cond.wait(min(left, 0.5))
            self._receipts.discard(receipt)

    def close(self) -> None:
        """Disconnect (waiting briefly for the broker's receipt) and never fail."""
        try:
            if self.conn.is_connected() and not self.lost:
                receipt = self.receipt()
                self.conn.disconnect(receipt=receipt)
                with self._cond:  # the receipt says every earlier frame (ACKs) was processed
                    self._cond.wait_for(lambda: receipt in self._receipts or self.lost, 5.0)
        except Exception:  # closing must not fail
            pass
        finally:
            with contextlib.suppress(Exception):
                self.conn.transport.stop()


def connect_checked(config: BrokerConfig, client_id: str | None = None) -> StompClient:
    """Connect for a check or a run's start. An unreachable broker is retried for
    ``connectTimeoutMs`` (a broker that is restarting), then it is the SDK's ``unreachable``
    error (a :class:`ConfigError` that names the address when the job starts, a
    :class:`RestartableError` on a restart); a refused login is a :class:`ConfigError` at once."""
    deadline = time.monotonic() + config.connect_timeout_ms / 1000
    fix = (
        "Check that the broker runs, that the address is its STOMP acceptor, and "
        "the user, password and clientId."
    )
    while True:
        client = StompClient(config, client_id)
        try:
            return client.connect()
        except BrokerError as exc:
            client.close()
            if client.error is not None:  # an ERROR frame: login or client-id refused
                raise ConfigError(CONNECTOR, "url", str(exc), fix) from None
            if time.monotonic() >= deadline:
                raise unreachable(CONNECTOR, "url", str(exc), fix) from None
        time.sleep(0.5)
