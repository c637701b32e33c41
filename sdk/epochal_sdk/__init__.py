"""epochal SDK: the contracts a connector implements.

Four contracts, one per way a system can take part in a snapshot:

* :class:`ReplayableSource`: re-reads ranges; offsets live in the snapshot.
* :class:`AcknowledgingSource`: redelivers what is not acknowledged; the runtime acks after the
  snapshot and drops redeliveries by message ID.
* :class:`TransactionalSink`: two-phase commit driven by the runtime.
* :class:`IdempotentSink`: upsert by a stable key.

Every source and sink gets a :class:`ConnectorContext` (``self.context``: job, part id, run,
query id, batch, partition, attempt, metrics); a sink's tasks get one too, with the ids
derived from it (:class:`TransactionId`, :class:`WriterId`).

``__all__`` is what a connector author imports (the public API: docs/authors/api/index.rst,
"Stability"). The
runtime's own names (the errors only it raises, the base classes ``Source`` and ``Sink``,
``Field``, ``Metrics``) stay in their modules: ``epochal_sdk.errors``, ``epochal_sdk.sources``,
``epochal_sdk.sinks``, ``epochal_sdk.schema``, ``epochal_sdk.context``.

A name an earlier release exported here and no longer does (``Field``, ``TaskContext``, ...)
still imports, with a ``DeprecationWarning`` that names its new home, for two minor releases
(the table: ``epochal_sdk._deprecated``).
"""

from typing import TYPE_CHECKING

from epochal_sdk import _deprecated
from epochal_sdk.connector import Connector
from epochal_sdk.context import ConnectorContext
from epochal_sdk.delivery import DeliveryHandles
from epochal_sdk.errors import (
    ConfigError,
    DataGoneError,
    EpochalError,
    PoisonRecordError,
    RestartableError,
    SchemaMismatchError,
    SnapshotError,
    unreachable,
)
from epochal_sdk.guarantees import Guarantee
from epochal_sdk.ids import RecoveryScope, TransactionId, WriterId
from epochal_sdk.options import Options
from epochal_sdk.schema import Schema
from epochal_sdk.sinks import (
    IdempotentSink,
    IdempotentWriter,
    Prepared,
    Transaction,
    TransactionalSink,
)
from epochal_sdk.sources import (
    AcknowledgingSource,
    Message,
    Offsets,
    ReplayableSource,
    Split,
)
from epochal_sdk.spark_format import define_default_source

__all__ = [
    "AcknowledgingSource",
    "ConfigError",
    "Connector",
    "ConnectorContext",
    "DataGoneError",
    "DeliveryHandles",
    "EpochalError",
    "Guarantee",
    "IdempotentSink",
    "IdempotentWriter",
    "Message",
    "Offsets",
    "Options",
    "PoisonRecordError",
    "Prepared",
    "RecoveryScope",
    "ReplayableSource",
    "RestartableError",
    "Schema",
    "SchemaMismatchError",
    "SnapshotError",
    "Split",
    "Transaction",
    "TransactionId",
    "TransactionalSink",
    "WriterId",
    "define_default_source",
    "unreachable",
]

if not TYPE_CHECKING:  # type checkers see the names above only, and report a deprecated one

    def __getattr__(name: str) -> object:
        """A deprecated name (``epochal_sdk.Field``): from its new home, with a warning."""
        return _deprecated.moved(__name__, name)
