"""An acknowledging source over a JMS queue or a durable topic subscription (STOMP 1.2).

The runtime keeps one instance open on the driver for the life of a query: it stores each
batch's messages and IDs in the snapshot before planning it, acknowledges after the snapshot
and drops redelivered IDs it already stored. This class only receives and acknowledges.
"""

from __future__ import annotations

import logging
import queue
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from epochal_jms.client import BrokerConfig, StompClient, connect_checked
from epochal_sdk import (
    AcknowledgingSource,
    DeliveryHandles,
    Guarantee,
    Message,
    Options,
    PoisonRecordError,
    RestartableError,
)

log = logging.getLogger("epochal.jms")

MIN_MESSAGE_BYTES = 180
"""The smallest size Artemis accounts a message at against a consumer's window (an empty body
to a one-letter queue measures ~185 bytes); the default window is sized from it so that the
broker never dispatches more than ``max_unacknowledged`` messages."""

LINGER_S = 0.02
"""After the first message, a receive keeps taking messages until none arrives for this long
(or the batch is full)."""

DROPPED_HEADERS = frozenset({"ack", "subscription", "content-length", "receipt"})
"""Protocol headers that are not part of the message (not put in the ``headers`` column)."""

_ARTEMIS_ID = re.compile(r"^\d+,(\d+)$")


def destination_of(options: Options, key: str = "destination") -> str:
    """The ``destination`` option as a STOMP destination: ``/queue/x`` and ``/topic/x`` as
    given; a bare name means the queue of that name."""
    value = options.required(key, "Set .option('destination', '/queue/<name>' or '/topic/<name>').")
    return value if value.startswith("/") else f"/queue/{value}"


class JmsSource(AcknowledgingSource):
    """Messages of a queue (or a durable topic subscription), acknowledged one by one
    (``ack:client-individual``) after the snapshot that stores them.

    Options: ``url`` (``stomp://user:password@host:port``), ``user``, ``password``,
    ``destination`` (``/queue/<name>``, ``/topic/<name>``, or a queue name),
    ``durableSubscription`` (a name; topics only) and ``clientId``, ``idHeader`` (``auto``:
    the broker's stable message ID; or a header that carries a stable ID, e.g.
    ``_AMQ_DUPL_ID``), ``bodyType`` (``string`` or ``binary``), ``consumerWindowSize``
    (bytes; default sized from the runtime's bound), ``heartbeatMs``; the runtime's
    ``maxRecordsPerBatch``, ``receiveTimeoutMs``, ``dedupeWindowBatches``, ``dedupeWindowIds``.
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.broker = BrokerConfig.from_options(options)
        self.destination = destination_of(options)
        self.subscription_name = options.str("durableSubscription", "").strip()
        self.client_id = options.str("clientId", "").strip() or (
            f"epochal-{self.subscription_name}" if self.subscription_name else ""
        )
        self.id_header = options.str("idHeader", "auto").strip() or "auto"
        self.body_type = options.choice("bodyType", "string", ("string", "binary"))
        self.window_bytes = options.int("consumerWindowSize", None, minimum=-1)
        self.client: StompClient | None = None
        self.window = 0
        self.deliveries: DeliveryHandles[str] = DeliveryHandles()
        """This session's STOMP ``ack`` ids by message ID (each acknowledged once)."""
        self._queued_bytes = 0

    def schema(self) -> str:
        """``id``, ``body`` (string or binary), ``destination``, ``headers``, ``timestamp``
        (the broker's JMSTimestamp as UTC wall-clock time, ``timestamp_ntz``: the runtime's
        acknowledging reader cannot store a ``timestamp`` column yet) and ``redelivered``."""
        return (
            f"id string, body {self.body_type}, destination string, "
            "headers map<string,string>, timestamp timestamp_ntz, redelivered boolean"
        )

    def check(self) -> None:
        """Fail on bad options and an unreachable broker (or a refused login)."""
        if self.subscription_name and not self.destination.startswith("/topic/"):
            raise self.options.error(
                "durableSubscription",
                f"a durable subscription needs a topic, and {self.destination!r} is not one",
                "Use a /topic/<name> destination, or drop the option to read a queue.",
            )
        if self.window_bytes == 0:
            raise self.options.error(
                "consumerWindowSize",
                "0 would stop the broker from sending anything",
                "Give a size in bytes, or -1 for no flow control (no bound on unacked messages).",
            )
        client = connect_checked(self.broker)
        client.close()

    # -- the contract -------------------------------------------------------------------------
    def open(self, max_unacknowledged: int) -> None:
        """Connect and subscribe with ``ack:client-individual`` and a consumer window sized so
        that the broker never dispatches more than ``max_unacknowledged`` messages (see
        :data:`MIN_MESSAGE_BYTES`), unless ``consumerWindowSize`` says otherwise."""
        self.client = connect_checked(self.broker, self.client_id or None)
        self.window = self.window_bytes or max(1, max_unacknowledged - 1) * MIN_MESSAGE_BYTES
        headers = {"consumer-window-size": str(self.window)}
        if self.subscription_name:
            headers["durable-subscription-name"] = self.subscription_name
        self.client.conn.subscribe(
            self.destination, id="epochal", ack="client-individual", headers=headers
        )
        log.info(
            "jms source: subscribed to %s at %s (window %s bytes, at most %s unacked)",
            self.destination,
            self.broker.address,
            self.window,
            max_unacknowledged,
        )

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` s for the first; then
        until none comes for a moment. A batch takes at most half the consumer window (so
        that the next batch can be received while this one waits for its snapshot)."""
        client = self._client()
        out: list[Message] = []
        budget = self.window // 2 if self.window > 0 else None
        taken = 0
        deadline = time.monotonic() + timeout
        while len(out) < max_messages:
            wait = deadline - time.monotonic() if not out else LINGER_S
            try:
                frame = client.messages.get(timeout=max(0.0, wait))
            except queue.Empty:
                break
            message = self._message(frame)
            out.append(message)
            taken += self._size(frame)
            if budget is not None and taken >= budget:
                break
        if not out and client.lost:
            raise self._lost()
        return out

    def acknowledge(self, ids: Sequence[str]) -> None:
        """ACK every delivery of these IDs in this session; unknown IDs (acknowledged already,
        or delivered to an earlier session) are ignored. The last ACK carries a receipt, so the
        broker has processed them all when this returns."""
        client = self._client()
        ack_ids = self.deliveries.take(ids)
        if not ack_ids:
            return
        try:
            for ack_id in ack_ids[:-1]:
                client.conn.ack(ack_id)
            receipt = client.receipt()
            client.conn.ack(ack_ids[-1], receipt=receipt)
            client.wait_receipt(receipt, f"acknowledging {len(ack_ids)} message(s)")
        except RestartableError:
            raise
        except Exception as exc:  # any failure here is a lost session
            raise self._lost(str(exc)) from None

    def close(self) -> None:
        """Disconnect; what was not acknowledged is redelivered to the next session."""
        if self.client is not None:
            self.client.close()
            self.client = None
        self.deliveries.forget()

    # -- helpers ------------------------------------------------------------------------------
    def _client(self) -> StompClient:
        if self.client is None:
            raise RuntimeError("jms source: open() was not called")
        if self.client.lost and self.client.messages.empty():
            raise self._lost()
        return self.client

    def _lost(self, detail: str = "") -> RestartableError:
        reason = detail or (self.client.error if self.client else "") or ""
        return RestartableError(
            f"jms source: the connection to {self.broker.address} ({self.destination}) was "
            f"lost{': ' + reason if reason else ''}; unacknowledged messages will be "
            "redelivered and deduplicated after the restart"
        )

    @staticmethod
    def _size(frame: Any) -> int:
        """About what the broker accounts a message at against the window: the body and the
        headers as received (these include the ones the broker adds, which stand for its own
        per-message overhead), at least :data:`MIN_MESSAGE_BYTES`."""
        headers = sum(len(k) + len(v) + 2 for k, v in frame.headers.items())
        return max(MIN_MESSAGE_BYTES, len(frame.body or b"") + headers)

    def _message_id(self, headers: dict[str, str]) -> str:
        if self.id_header == "auto":
            raw = headers.get("message-id", "")
            match = _ARTEMIS_ID.match(raw) if self.client and self.client.is_artemis else None
            # Artemis sends "<consumer id>,<message id>": only the second part is stable
            # across redeliveries (and broker restarts).
            value = match.group(1) if match else raw
        else:
            value = headers.get(self.id_header, "")
        if not value:
            where = self.id_header if self.id_header != "auto" else "message-id"
            raise PoisonRecordError(
                f"jms source: a message on {self.destination} (message-id "
                f"{headers.get('message-id', '?')!r}) has no {where!r} header to use as its ID, "
                "and exactly-once needs a stable ID per message. Set .option('idHeader', ...) "
                "to a header every message carries, or remove this message from the queue."
            )
        return value

    def _message(self, frame: Any) -> Message:
        headers = {k: v for k, v in frame.headers.items() if k not in DROPPED_HEADERS}
        message_id = self._message_id(headers)
        ack_id = frame.headers.get("ack") or frame.headers.get("message-id", "")
        self.deliveries.received(message_id, ack_id)
        body: Any = frame.body or b""
        if self.body_type == "string":
            try:
                body = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PoisonRecordError(
                    f"jms source: message {message_id!r} on {self.destination} has a body that "
                    f"is not UTF-8 ({exc}). Set .option('bodyType', 'binary') to read bodies as "
                    "bytes, or remove the message."
                ) from None
        stamp = headers.get("timestamp", "")
        timestamp = None  # UTC wall-clock time (timestamp_ntz): see schema()
        if stamp.isdigit():
            timestamp = datetime.fromtimestamp(int(stamp) / 1000, tz=UTC).replace(tzinfo=None)
        row = (
            message_id,
            body,
            headers.get("destination", self.destination),
            headers,
            timestamp,
            headers.get("redelivered") == "true",
        )
        return Message(
            message_id, row, redelivered=headers.get("redelivered") == "true", headers=headers
        )
