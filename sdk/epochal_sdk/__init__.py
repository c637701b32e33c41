"""epochal SDK: the contracts a connector implements.

Four contracts, one per way a system can take part in a snapshot:

* :class:`ReplayableSource`: re-reads ranges; offsets live in the snapshot.
* :class:`AcknowledgingSource`: redelivers what is not acknowledged; the runtime acks after the
  snapshot and drops redeliveries by message ID.
* :class:`TransactionalSink`: two-phase commit driven by the runtime.
* :class:`IdempotentSink`: upsert by a stable key.

Every source and sink gets a :class:`ConnectorContext` (``self.context``: job, part id, run,
query id, batch, partition, attempt, metrics); ids are built by :class:`TransactionId`,
:class:`WriterId` and :class:`RecordId`.
"""

from epochal_sdk.connector import Connector
from epochal_sdk.context import ConnectorContext, Metrics
from epochal_sdk.errors import (
    ConfigError,
    DataGoneError,
    EpochalError,
    FencedError,
    GuaranteeError,
    PoisonRecordError,
    RestartableError,
    SchemaMismatchError,
    SnapshotError,
    job_starting,
    unreachable,
)
from epochal_sdk.guarantees import Guarantee, weakest
from epochal_sdk.hookspecs import hookimpl, hookspec
from epochal_sdk.ids import (
    RecordId,
    RecoveryScope,
    TransactionId,
    WriterId,
    batch_of,
    transaction_prefix,
)
from epochal_sdk.options import Options
from epochal_sdk.schema import Field, Schema, column_names, ddl, parse_ddl, row_of
from epochal_sdk.sinks import (
    IdempotentSink,
    IdempotentWriter,
    Prepared,
    Sink,
    SinkWriter,
    TaskContext,
    Transaction,
    TransactionalSink,
)
from epochal_sdk.sources import (
    AcknowledgingSource,
    Message,
    Offsets,
    ReplayableSource,
    Rows,
    Source,
    Split,
)

__all__ = [
    "AcknowledgingSource",
    "ConfigError",
    "Connector",
    "ConnectorContext",
    "DataGoneError",
    "EpochalError",
    "FencedError",
    "Field",
    "Guarantee",
    "GuaranteeError",
    "IdempotentSink",
    "IdempotentWriter",
    "Message",
    "Metrics",
    "Offsets",
    "Options",
    "PoisonRecordError",
    "Prepared",
    "RecordId",
    "RecoveryScope",
    "ReplayableSource",
    "RestartableError",
    "Rows",
    "Schema",
    "SchemaMismatchError",
    "Sink",
    "SinkWriter",
    "SnapshotError",
    "Source",
    "Split",
    "TaskContext",
    "Transaction",
    "TransactionId",
    "TransactionalSink",
    "WriterId",
    "batch_of",
    "column_names",
    "ddl",
    "hookimpl",
    "hookspec",
    "job_starting",
    "parse_ddl",
    "row_of",
    "transaction_prefix",
    "unreachable",
    "weakest",
]
