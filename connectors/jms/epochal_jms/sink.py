"""A sink that sends records as JMS messages over STOMP, each with a stable duplicate ID.

Contract: :class:`~epochal_sdk.IdempotentSink`. Every message carries an ID derived from the
job, the sink, the batch, the Spark partition and the record's position in the task (never
the attempt or the run: the SDK's :class:`~epochal_sdk.ids.RecordId`), in the header
``idHeader`` (``_AMQ_DUPL_ID`` by default). A task sends its messages inside one STOMP
transaction and ``flush`` commits it with a receipt.

On ActiveMQ Artemis, ``_AMQ_DUPL_ID`` turns on broker-side duplicate detection: a replayed
batch's messages are dropped by the broker, so the sink is exactly-once (within the broker's
duplicate-ID cache, ``id-cache-size``, 20000 IDs per address by default). Artemis rolls back a
whole transaction that contains a duplicate and answers the COMMIT with an ERROR; the task then
sends its messages again outside a transaction, where each duplicate is dropped on its own and
each message that is new is delivered (a replay of a task that was partly sent completes it).
On other brokers the sink is at-least-once; consumers drop duplicates by the ID header (the
JMS source does, with ``.option("idHeader", "_AMQ_DUPL_ID")``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, ClassVar

from stomp.exception import StompException

from epochal_jms.client import (
    BrokerConfig,
    BrokerError,
    StompClient,
    connect_checked,
)
from epochal_jms.source import destination_of
from epochal_sdk import (
    ConnectorContext,
    Guarantee,
    IdempotentSink,
    IdempotentWriter,
    Options,
    PoisonRecordError,
    RestartableError,
    Schema,
    SchemaMismatchError,
)

if TYPE_CHECKING:
    import pyarrow

log = logging.getLogger("epochal.jms")

ARTEMIS_DUPLICATE_HEADER = "_AMQ_DUPL_ID"
ARTEMIS_ID_CACHE_SIZE = 20_000
RESERVED_HEADERS = frozenset(
    {"destination", "content-length", "content-type", "transaction", "receipt", "persistent"}
)


def header_text(value: Any) -> str:
    """A column value as header text: strings as they are, bytes as UTF-8, lists and dicts as
    JSON, anything else with ``str()``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


class JmsSink(IdempotentSink):
    """Sends each record as one persistent message.

    Options: ``url``, ``user``, ``password``, ``destination`` (``/queue/<name>``,
    ``/topic/<name>`` or a queue name) or ``destinationColumn`` (per record), ``bodyColumn``
    (default ``value``; string or binary), ``headersColumn`` (a ``map<string,string>`` column
    whose entries become headers), ``headerColumns`` (comma-separated columns sent as headers;
    default every other column), ``persistent`` (default true), ``idHeader`` (default
    ``_AMQ_DUPL_ID``), ``duplicateIdCacheSize`` (the broker's ``id-cache-size``, default
    20000), ``heartbeatMs``, ``connectTimeoutMs``.
    """

    MAX_GUARANTEE: ClassVar[Guarantee] = Guarantee.EXACTLY_ONCE

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.broker = BrokerConfig.from_options(options)
        self.destination_column = options.str("destinationColumn", "").strip()
        self.destination = "" if self.destination_column else destination_of(options)
        self.body_column = options.str("bodyColumn", "value").strip()
        self.headers_column = options.str("headersColumn", "").strip()
        listed = options.str("headerColumns", "").strip()
        self.header_columns = [c.strip() for c in listed.split(",") if c.strip()] or None
        self.persistent = options.bool("persistent", True)
        self.id_header = options.str("idHeader", ARTEMIS_DUPLICATE_HEADER).strip()
        self.id_cache_size = options.int("duplicateIdCacheSize", ARTEMIS_ID_CACHE_SIZE, minimum=1)
        self._server: str | None = None

    # -- driver side --------------------------------------------------------------------------
    def server(self) -> str:
        """The broker's ``server`` header (connects once; a clear error if unreachable)."""
        if self._server is None:
            client = connect_checked(self.broker)
            self._server = client.server
            client.close()
        return self._server

    def duplicate_detection(self) -> bool:
        """Whether the broker drops messages whose ID it has seen (Artemis, ``_AMQ_DUPL_ID``)."""
        return self.id_header == ARTEMIS_DUPLICATE_HEADER and "artemis" in self.server().lower()

    def max_guarantee(self) -> Guarantee:
        """Exactly-once with broker-side duplicate detection, else at-least-once."""
        if self.duplicate_detection():
            return Guarantee.EXACTLY_ONCE
        return Guarantee.AT_LEAST_ONCE

    def check(self, schema: Schema) -> None:
        """Fail when a named column is missing, the body column is neither string nor binary,
        a header column has a reserved name, or the broker is unreachable."""
        types = {f.name: f.type for f in schema}
        named = [("bodyColumn", self.body_column)]
        if self.destination_column:
            named.append(("destinationColumn", self.destination_column))
        if self.headers_column:
            named.append(("headersColumn", self.headers_column))
        named += [("headerColumns", c) for c in self.header_columns or ()]
        for option, column in named:
            if column not in types:
                raise SchemaMismatchError(
                    f"jms sink: column {column!r} ({option}) is not among the columns "
                    f"{list(types)}. Set .option({option!r}, ...) to one of them or add it."
                )
        if types[self.body_column] not in ("string", "binary"):
            raise SchemaMismatchError(
                f"jms sink: the body column {self.body_column!r} is {types[self.body_column]}; "
                "a message body is string or binary. Cast it, or pick another bodyColumn."
            )
        if self.headers_column and types[self.headers_column] != "map<string,string>":
            raise SchemaMismatchError(
                f"jms sink: headersColumn {self.headers_column!r} is "
                f"{types[self.headers_column]}, not map<string,string>. Cast it."
            )
        clash = sorted(set(self._header_columns(list(types))) & RESERVED_HEADERS)
        if clash:
            raise SchemaMismatchError(
                f"jms sink: column(s) {clash} would be sent as headers, but STOMP reserves "
                "those names. Rename them or list the header columns with headerColumns."
            )
        if self.duplicate_detection():
            log.info(
                "jms sink: exactly-once through Artemis duplicate detection; a batch must stay "
                "within the broker's id-cache-size (%s IDs per address) for a replay to be "
                "dropped",
                self.id_cache_size,
            )

    def key_columns(self) -> tuple[str, ...]:
        """The body (and destination) column: the runtime checks that a replayed batch has
        the same ones, which is what makes the position-based duplicate IDs stable."""
        if self.destination_column:
            return (self.body_column, self.destination_column)
        return (self.body_column,)

    def _header_columns(self, names: list[str]) -> list[str]:
        if self.header_columns is not None:
            return list(self.header_columns)
        skip = {self.body_column, self.destination_column, self.headers_column}
        return [n for n in names if n not in skip]

    # -- tasks --------------------------------------------------------------------------------
    def open(self, task: ConnectorContext) -> IdempotentWriter:
        """A writer for one task."""
        return JmsWriter(self, task)


class JmsWriter(IdempotentWriter):
    """One task's messages: buffered, then sent in one STOMP transaction by :meth:`flush`."""

    def __init__(self, sink: JmsSink, task: ConnectorContext) -> None:
        self.sink = sink
        self.task = task
        self.messages: list[tuple[str, bytes | str, dict[str, str]]] = []

    def write(self, batch: pyarrow.RecordBatch) -> None:
        """Convert and buffer these records (each gets the next position's ID)."""
        sink = self.sink
        header_columns = sink._header_columns(batch.schema.names)
        for row in batch.to_pylist():
            position = len(self.messages)
            body = row[sink.body_column]
            if body is None:
                raise PoisonRecordError(
                    f"jms sink: record {position} of batch {self.task.batch}, partition "
                    f"{self.task.partition} has a null body ({sink.body_column!r}). Filter out "
                    "or fill null bodies."
                )
            destination = sink.destination
            if sink.destination_column:
                value = row.get(sink.destination_column)
                if not value:
                    raise PoisonRecordError(
                        f"jms sink: record {position} of batch {self.task.batch}, partition "
                        f"{self.task.partition} has no destination in "
                        f"{sink.destination_column!r}. Fill it or filter the record out."
                    )
                destination = value if value.startswith("/") else f"/queue/{value}"
            headers = {c: header_text(row[c]) for c in header_columns if row.get(c) is not None}
            if sink.headers_column and row.get(sink.headers_column):
                extra = row[sink.headers_column]
                pairs = extra.items() if isinstance(extra, dict) else extra
                headers.update({str(k): header_text(v) for k, v in pairs if v is not None})
            if sink.persistent:
                headers["persistent"] = "true"
            headers[sink.id_header] = self.task.record_id(position)
            self.messages.append((destination, body, headers))

    def flush(self) -> None:
        """Send the buffered messages in one transaction and commit it with a receipt. If
        Artemis refuses the commit (the batch was sent before: duplicates), send them again
        outside a transaction, where the broker drops each duplicate on its own."""
        if not self.messages:
            return
        client = self._connect()
        detection = self.sink.id_header == ARTEMIS_DUPLICATE_HEADER and client.is_artemis
        try:
            if detection and len(self.messages) > self.sink.id_cache_size:
                raise self.sink.options.error(
                    "duplicateIdCacheSize",
                    f"one task sends {len(self.messages)} messages, more than the broker's "
                    f"duplicate-ID cache ({self.sink.id_cache_size} per address), so a replay "
                    "could not be recognised",
                    "Lower maxRecordsPerBatch of the source, or raise id-cache-size on the "
                    "broker (address settings) and set duplicateIdCacheSize to it.",
                )
            self._send(client, transactional=True)
        except BrokerError as exc:
            if not detection or (client.lost and client.error is None):
                raise RestartableError(f"jms sink: {exc}") from None
            log.info(
                "jms sink: batch %s partition %s: the transaction was refused (%s); sending "
                "again without a transaction, duplicates are dropped by the broker",
                self.task.batch,
                self.task.partition,
                exc,
            )
            client.close()
            client = self._connect()
            try:
                self._send(client, transactional=False)
            except BrokerError as again:
                raise RestartableError(f"jms sink: {again}") from None
        finally:
            client.close()
        self.messages = []

    def _connect(self) -> StompClient:
        client = StompClient(self.sink.broker)
        try:
            return client.connect()
        except BrokerError as exc:
            client.close()
            raise RestartableError(f"jms sink: {exc}") from None

    def _send(self, client: StompClient, transactional: bool) -> None:
        """Send every message (in a transaction committed with a receipt, or each on its own
        with a receipt on the last one) and wait for the receipt."""
        what = f"sending {len(self.messages)} message(s) of batch {self.task.batch}"
        receipt = client.receipt()
        try:
            transaction = client.conn.begin() if transactional else None
            last = len(self.messages) - 1
            for n, (destination, body, headers) in enumerate(self.messages):
                if transaction is None and n == last:
                    headers = {**headers, "receipt": receipt}
                client.conn.send(destination, body, headers=headers, transaction=transaction)
            if transaction is not None:
                client.conn.commit(transaction, headers={"receipt": receipt})
        except (OSError, StompException) as exc:
            raise BrokerError(f"{what}: the connection failed ({exc})") from exc
        client.wait_receipt(receipt, what)

    def close(self) -> None:
        """Drop the buffer."""
        self.messages = []
