"""epochal SDK: the contracts a connector implements.

Four contracts, one per way a system can take part in a snapshot:

* :class:`ReplayableSource`: re-reads ranges; offsets live in the snapshot.
* :class:`AcknowledgingSource`: redelivers what is not acknowledged; the runtime acks after the
  snapshot and drops redeliveries by message ID.
* :class:`TransactionalSink`: two-phase commit driven by the runtime.
* :class:`IdempotentSink`: upsert by a stable key.

Every source and sink gets a :class:`ConnectorContext` (``self.context``: job, part id, run,
query id, batch, partition, attempt, metrics); a sink's tasks get one too, with the ids
derived from it (:class:`TransactionId`, :class:`WriterId`, :class:`RecordId`).

``__all__`` is what a connector author uses; the runtime's own helpers stay in the modules.
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
    unreachable,
)
from epochal_sdk.guarantees import Guarantee
from epochal_sdk.ids import RecordId, RecoveryScope, TransactionId, WriterId
from epochal_sdk.options import Options
from epochal_sdk.schema import Field, Schema, row_of
from epochal_sdk.sinks import (
    IdempotentSink,
    IdempotentWriter,
    Prepared,
    Sink,
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
    "SnapshotError",
    "Source",
    "Split",
    "Transaction",
    "TransactionId",
    "TransactionalSink",
    "WriterId",
    "row_of",
    "unreachable",
]
