"""The records of a job's parts, in one place: each run notes every source and sink of its
query in the run's snapshot store (``parts/<kind>-<part id>``): the connector, the contract
it is driven by, the effective guarantee and its options with secrets left out. ``jobs
status`` and the metrics show them; ``epochal in-doubt`` builds the job's transactional sinks
from them.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

from epochal.state.store import SnapshotStore

PARTS = "parts"
"""The snapshot store's directory of part records."""


@dataclass(frozen=True)
class PartRecord:
    """What a run noted about one part of its query.

    Attributes:
        kind: ``source`` or ``sink``.
        part_id: the part's id in the job.
        connector: the connector's name.
        guarantee: the effective guarantee of the part (a :class:`~epochal_sdk.Guarantee`
            label).
        contract: the contract the runtime drives (``ReplayableSource``, ``transactional``,
            ...).
        options: the options as they may be written down (secrets left out).
        reason: why the guarantee is below exactly-once, if it is.
    """

    kind: str
    part_id: str
    connector: str
    guarantee: str
    contract: str = ""
    options: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    @property
    def key(self) -> str:
        """``<kind>-<part id>``: the record's name in the store and in status views."""
        return f"{self.kind}-{self.part_id}"

    def write(self, store: SnapshotStore) -> None:
        """Write (or replace) the record in a run's snapshot store."""
        value = {k: v for k, v in asdict(self).items() if k != "part_id"}
        store.write_json(f"{PARTS}/{self.key}", value)

    @classmethod
    def from_json(cls, key: str, data: dict[str, Any]) -> PartRecord:
        """The record of store entry ``key`` (``<kind>-<part id>``)."""
        kind, _, part_id = key.partition("-")
        return cls(
            kind=str(data.get("kind") or kind),
            part_id=part_id,
            connector=str(data.get("connector", "")),
            guarantee=str(data.get("guarantee", "")),
            contract=str(data.get("contract", "")),
            options={str(k): str(v) for k, v in dict(data.get("options") or {}).items()},
            reason=str(data.get("reason", "")),
        )


def read_parts(store: SnapshotStore) -> dict[str, PartRecord]:
    """Every part record of a run's store, by key (empty when there is none, or the store
    cannot be read: the records are informative)."""
    out: dict[str, PartRecord] = {}
    with contextlib.suppress(Exception):
        for key in store.list(PARTS):
            name = key.rsplit("/", 1)[1]
            out[name] = PartRecord.from_json(name, dict(store.read_json(key)))
    return out
