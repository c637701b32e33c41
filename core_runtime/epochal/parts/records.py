"""The records of a job's parts, in one place: each run notes every source and sink of its
query in the run's snapshot store (``parts/<kind>-<part id>``): the connector, the contract
it is driven by, the effective guarantee, its options with secrets left out and its target
(where it writes or reads, without secrets). ``jobs status`` and the metrics show them;
``epochal in-doubt`` builds the job's transactional sinks from them; the next run checks that
a part with the same id still has the same target (:func:`check_target`).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

from epochal.parts import registry
from epochal.state.store import SnapshotStore
from epochal_sdk import ConfigError

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
        target: where the part writes or reads (:meth:`epochal_sdk.Connector.target`),
            without secrets; empty when its connector declares no target.
    """

    kind: str
    part_id: str
    connector: str
    guarantee: str
    contract: str = ""
    options: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    target: dict[str, str] = field(default_factory=dict)

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
            target={str(k): str(v) for k, v in dict(data.get("target") or {}).items()},
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


def part_id_in_job(
    store: SnapshotStore | None, kind: str, connector: str, options: dict[str, str]
) -> str:
    """The id of connector ``connector``'s ``kind`` part with these options in the job whose
    store is ``store`` (None: a query without one): :func:`~epochal.parts.registry.part_id`,
    unless the job already records this part under another id its options gave, which it
    then keeps: earlier runtimes hashed a part's tuning options (now
    :data:`~epochal.parts.registry.TUNING_OPTIONS`) into its id, and its stored batches,
    dedupe ids, decisions and transaction ids are under that id. A record is this part's
    when it names the same kind and connector, its recorded options give today's id (the
    same target; tuning aside) and its id has the shape options give (never an
    ``epochal.id``). Called on the driver when a query plans the part; reads the part
    records only while the job has none under today's id."""
    current = registry.part_id(connector, options)
    if store is None or registry.explicit_part_id(options):
        return current
    if store.exists(f"{PARTS}/{kind}-{current}"):
        return current
    for record in sorted(read_parts(store).values(), key=lambda r: r.part_id):
        if (
            record.kind == kind
            and record.connector == connector
            and record.part_id != current
            and registry.is_options_id(connector, record.part_id)
            and registry.part_id(connector, record.options) == current
        ):
            return record.part_id
    return current


def forget_part(store: SnapshotStore, kind: str, part_id: str) -> None:
    """Drop the record of a part the job no longer has (once what it left is settled)."""
    key = f"{PARTS}/{kind}-{part_id}"
    if store.exists(key):
        store.delete(key)


def check_target(store: SnapshotStore, kind: str, part_id: str, target: dict[str, str]) -> None:
    """Refuse a part whose run's store records it, under the same id, with another target.

    A part's id leaves its secrets out, so a rotated password keeps it, and with it the
    part's commit decisions, in-doubt transactions and stored batches. Those belong to the
    target they were made against: recovering them against another one (an explicit
    ``epochal.id`` kept while the table moved, a ``${env:...}`` reference that now names
    another server) would commit nothing where the data was prepared and skip the batch
    where it now goes. Nothing is refused when either side has no target (a connector that
    declares none, a record from before targets were recorded).

    Raises:
        ConfigError: naming the part, what changed, and how to go on.
    """
    if not target:
        return
    key = f"{kind}-{part_id}"
    try:
        data = store.read_json(f"{PARTS}/{key}") if store.exists(f"{PARTS}/{key}") else None
    except Exception:  # an unreadable record is the store's verification's to report
        return
    before = PartRecord.from_json(key, dict(data)).target if data else {}
    if not before or before == target:
        return
    changed = "; ".join(
        f"{name}: {before.get(name, '(none)')} -> {target.get(name, '(none)')}"
        for name in sorted(set(before) | set(target))
        if before.get(name) != target.get(name)
    )
    raise ConfigError(
        f"{kind} {part_id}",
        "target",
        f"this job's {kind} {part_id!r} ran against another target before this restart "
        f"({changed}), and its snapshot entries (commit decisions, in-doubt transactions, "
        "stored batches) belong to that one",
        "To keep the old target, set the options back. To use the new one as a new part, "
        "give it another .option('epochal.id', ...) (settle what the old one left with "
        "`python -m epochal in-doubt`), or cancel the job and run it afresh",
    )
