"""epochal SDK: the contracts a connector implements.

Four contracts, one per way a system can take part in a snapshot:

* :class:`ReplayableSource`: re-reads ranges; offsets live in the snapshot.
* :class:`AcknowledgingSource`: redelivers what is not acknowledged; the runtime acks after the
  snapshot and drops redeliveries by message ID.
* :class:`TransactionalSink`: two-phase commit driven by the runtime.
* :class:`IdempotentSink`: upsert by a stable key.
"""

from epochal_sdk.connector import Connector
from epochal_sdk.errors import (
    ConfigError,
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
from epochal_sdk.options import Options
from epochal_sdk.schema import Field, Schema, ddl
from epochal_sdk.sinks import (
    IdempotentSink,
    IdempotentWriter,
    Prepared,
    Sink,
    SinkWriter,
    TaskContext,
    Transaction,
    TransactionalSink,
    TransactionId,
    batch_of,
    transaction_prefix,
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
    "EpochalError",
    "FencedError",
    "Field",
    "Guarantee",
    "GuaranteeError",
    "IdempotentSink",
    "IdempotentWriter",
    "Message",
    "Offsets",
    "Options",
    "PoisonRecordError",
    "Prepared",
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
    "batch_of",
    "ddl",
    "hookimpl",
    "hookspec",
    "job_starting",
    "transaction_prefix",
    "unreachable",
    "weakest",
]
