"""Key stability for idempotent sinks: a replayed batch must produce the same keys.

Each task records an order-independent digest of the keys it wrote for (batch, partition).
When the same (batch, partition) is written again (a replay or a task retry), the new digest
must match; otherwise the pipeline makes unstable keys (random UUIDs, wall-clock time) and an
idempotent sink cannot keep exactly-once, so the task fails with a clear error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochal.state.store import SnapshotStore
from epochal_sdk import EpochalError

if TYPE_CHECKING:
    import pyarrow as pa

_MASK = (1 << 64) - 1


class KeyStabilityError(EpochalError):
    """A replayed batch produced different keys than the first time."""


@dataclass
class KeyDigest:
    """Count and sum of 64-bit key hashes: the same for the same multiset of keys."""

    count: int = 0
    total: int = 0

    def add_batch(self, batch: pa.RecordBatch, key_columns: Iterable[str]) -> None:
        """Add the keys of an Arrow batch."""
        columns = [batch.column(name).to_pylist() for name in key_columns]
        for key in zip(*columns, strict=True):
            digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
            self.total = (self.total + int.from_bytes(digest, "big")) & _MASK
            self.count += 1

    def as_dict(self) -> dict[str, int]:
        """JSON form."""
        return {"count": self.count, "total": self.total}


def check_and_record(
    store: SnapshotStore, sink_id: str, batch: int, partition: int, digest: KeyDigest
) -> None:
    """Record the digest of (batch, partition), or compare it with the one recorded before."""
    key = f"sinks/{sink_id}/keys/{batch:012d}-{partition:05d}"
    if store.exists(key):
        before = store.read_json(key)
        if before != digest.as_dict():
            raise KeyStabilityError(
                f"sink {sink_id}, batch {batch}, partition {partition}: the replay produced "
                f"different keys ({digest.count} keys, digest {digest.total:x}) than the first "
                f"run ({before['count']} keys, digest {before['total']:x}). An idempotent sink "
                "needs stable keys: derive keys from the data, not from random or time values."
            )
        return
    store.write_json(key, digest.as_dict(), count=digest.count)


def prune(store: SnapshotStore, sink_id: str, keep_after: int) -> None:
    """Forget digests of batches before ``keep_after``."""
    for key in store.list(f"sinks/{sink_id}/keys"):
        if int(key.rsplit("/", 1)[1].split("-")[0]) < keep_after:
            store.delete(key)
