"""What every contract check shares: the subject under test, its parts built as the runtime
builds them, types and ids, and the reports of a violation."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from epochal.base import secrets
from epochal.parts import registry
from epochal.spark.common import user_options
from epochal_sdk import ConnectorContext, Options
from epochal_sdk.ids import new_incarnation
from epochal_sdk.schema import Field, parse_ddl

if TYPE_CHECKING:
    from epochal.testing.under_test import SinkUnderTest, SourceUnderTest


SINK_SCHEMA = (Field("key", "string"), Field("value", "string"))
"""The columns the checks write, as the kit's pipelines do: the record ID as text in both."""
SINK_ARROW = pa.schema([("key", pa.string()), ("value", pa.string())])
RECEIVE_TIMEOUT = 0.5
"""Seconds an acknowledging source's ``receive`` may wait for a first message."""
DEADLINE = 60.0
"""Seconds a check waits for records or messages that must arrive (it returns as soon as they
did; only a broken connector waits this long)."""
REQUEUE_WAIT = 5.0
"""Seconds the checks keep polling, once a process that held messages died and the records
produced after its death (the markers) arrived, for the broker to requeue the dead process's
messages and to settle what it acknowledged: a broker does both asynchronously, after it
notices the connection is gone (an AMQP or JMS broker, when the socket closes or a
heartbeat is missed). The checks stop polling as soon as what they wait for is there; only a
source that lost messages, or left them unsettled, waits this long."""
CHUNKS = 3
"""A task's records reach a sink writer in this many Arrow batches."""


class ContractViolationError(AssertionError):
    """A connector broke its contract: what the check did, what it saw, what the contract
    says."""


class CheckNotApplicableError(Exception):
    """A check cannot run against the side under test, which does not give what it needs (a
    suite's test is skipped with this reason)."""


@dataclass(frozen=True)
class ContractCheck:
    """One contract check.

    Attributes:
        name: its id (``ack-crash-before-store``); the test is ``test_contract[<name>]``.
        contract: ``replayable``, ``acknowledging``, ``transactional`` or ``idempotent``.
        does: what it does and what it expects, in one sentence (the docs' table).
        run: the check; raises :class:`ContractViolationError` when the connector breaks the
            contract.
    """

    name: str
    contract: str
    does: str
    run: Callable[[Subject], None] = field(repr=False, compare=False)


@dataclass
class Subject:
    """What a check drives: the source or the sink under test, in one sink mode, in a
    directory of its own.

    Attributes:
        source: the source under test (source checks).
        sink: the sink under test (sink checks).
        mode: the sink mode (``transactional`` or ``idempotent``).
        workdir: a fresh directory (the job's snapshot store lives there).
        per_batch: records per planned batch of a replayable source.
        exactly_once: whether duplicates count (the suite tests exactly-once and the part
            declares it can keep it); else only losses do.
        arrival_deadline: seconds a replayable source's checks wait for produced records to
            show in its offsets (:data:`DEADLINE`: a server may show them late; a source
            over local files shows them at once, and may be given less).
    """

    source: SourceUnderTest | None = None
    sink: SinkUnderTest | None = None
    mode: str = ""
    workdir: str = "."
    per_batch: int = 20
    exactly_once: bool = True
    arrival_deadline: float = DEADLINE


# -- parts, built as the runtime builds them ------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One source or sink of a check's job: its connector, options and ids (the job's
    incarnation included, as a job created now gets one)."""

    connector: str
    options: dict[str, str]
    job: str
    part_id: str
    incarnation: str = ""

    @classmethod
    def of(cls, connector: str, options: dict[str, str]) -> Part:
        """A part of a new job (a job name of its own, an incarnation, the part id the
        runtime would give)."""
        return cls(
            connector,
            dict(options),
            f"contract-{uuid.uuid4().hex[:8]}",
            registry.part_id(connector, options),
            new_incarnation(time.time()),
        )

    def with_options(self, options: dict[str, str]) -> Part:
        """This part of the same job with other options, under the id the runtime gives them
        (the job records no part, so it is :func:`~epochal.parts.registry.part_id`)."""
        return replace(
            self, options=dict(options), part_id=registry.part_id(self.connector, options)
        )

    def context(
        self,
        *,
        run: int = 1,
        batch: int | None = None,
        partition: int | None = None,
        attempt: int = 0,
        schema: tuple[Field, ...] = (),
    ) -> ConnectorContext:
        """The context of an object of this part (a task's when ``partition`` is given)."""
        return ConnectorContext(
            job=self.job,
            part_id=self.part_id,
            batch=batch,
            partition=partition,
            attempt=attempt,
            schema=schema,
            run=run,
            incarnation=self.incarnation,
        )

    def build(self, context: ConnectorContext, side: str) -> Any:
        """A new source (``side="source"``) or sink object with ``context``, from the
        options as a job hands them over (references resolved, the runtime's own left out)."""
        options = Options(self.connector, secrets.resolved(user_options(self.options)), context)
        connector = registry.connector(self.connector)
        return connector.source(options) if side == "source" else connector.sink(options)


# -- types and ids ----------------------------------------------------------------------------
_ARROW_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type Spark gives a column of this Spark SQL type (as DDL writes it)."""
    text = spark_type.strip()
    low = text.lower()
    if low.endswith(">"):
        head, inner = text[: text.index("<")].strip().lower(), text[text.index("<") + 1 : -1]
        if head == "array":
            return pa.list_(arrow_type(inner))
        if head == "map":
            key, value = _split_top(inner, ",")
            return pa.map_(arrow_type(key), arrow_type(value))
        if head == "struct":
            fields = []
            for item in _split_top(inner, ","):
                name, _, kind = item.partition(":")
                fields.append(pa.field(name.strip().strip("`"), arrow_type(kind)))
            return pa.struct(fields)
    if low.startswith("decimal"):
        digits = low[len("decimal") :].strip("() ")
        precision, _, scale = digits.partition(",")
        return pa.decimal128(int(precision or 10), int(scale or 0))
    if low.startswith(("varchar(", "char(")):
        return pa.string()
    if low in _ARROW_TYPES:
        return _ARROW_TYPES[low]
    raise ValueError(
        f"the contract checks cannot map the Spark type {spark_type!r} to Arrow; use one of "
        f"{', '.join(_ARROW_TYPES)}, decimal, array, map or struct in the source's schema"
    )


def arrow_schema(ddl: str) -> pa.Schema:
    """A source's schema (a Spark DDL string) as Spark hands it to Arrow."""
    return pa.schema([pa.field(f.name, arrow_type(f.type), f.nullable) for f in parse_ddl(ddl)])


def _split_top(text: str, separator: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def as_dicts(rows: Iterable[Any], columns: Sequence[str]) -> list[dict[str, Any]]:
    """What a source yields (tuples in column order, dicts, Arrow record batches) as dicts."""
    out: list[dict[str, Any]] = []
    for item in rows:
        if isinstance(item, pa.RecordBatch | pa.Table):
            out += item.to_pylist()
        elif isinstance(item, dict):
            out.append({c: item.get(c) for c in columns})
        else:
            out.append(dict(zip(columns, item, strict=True)))
    return out


def _violation(check: str, message: str) -> ContractViolationError:
    return ContractViolationError(f"[{check}] {message}")


def _first(items: Iterable[Any], n: int = 10) -> list[Any]:
    return sorted(items)[:n]


def _until(deadline: float) -> bool:
    return time.monotonic() < deadline


def poll_until_settled(unsettled: Callable[[], list[Any]], seconds: float) -> list[Any]:
    """Call ``unsettled()`` until it returns nothing or ``seconds`` passed; its last answer
    (empty when the source system settled everything in time)."""
    deadline = time.monotonic() + seconds
    while True:
        left = unsettled()
        if not left or not _until(deadline):
            return left
        time.sleep(0.1)
