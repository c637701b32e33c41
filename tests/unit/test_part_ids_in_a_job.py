"""A part's id in a job (epochal.parts.records.part_id_in_job): a job recorded by an earlier
runtime, which hashed a part's tuning options into its id, keeps the id its entries are under
whatever tuning options the part has now; a new part, a part named by ``epochal.id`` and a
part of another connector or kind are never given another part's id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epochal.parts import registry
from epochal.parts.records import PartRecord, part_id_in_job
from epochal.state.store import SnapshotStore

QUEUE = {"name": "orders"}


EARLIER_IDS = {
    ("map", '{"maxRecordsPerBatch": "100", "name": "orders"}'): "map-928a10a44d",
    ("map", '{"maxRecordsPerBatch": "100", "name": "orders", "receiveTimeoutMs": "500"}'): (
        "map-7080a3bf98"
    ),
    ("map", '{"maxRecordsPerBatch": "100", "name": "other"}'): "map-2e736e5ea5",
    ("kafka", '{"maxRecordsPerBatch": "100", "name": "orders"}'): "kafka-928a10a44d",
}
"""The ids the runtime gave these parts before it left tuning options out (golden)."""


def _recorded(store: SnapshotStore, kind: str, connector: str, options: dict[str, str]) -> str:
    """Record a part as an earlier runtime did: under the id that hashed its tuning options."""
    part_id = EARLIER_IDS[(connector, json.dumps(options, sort_keys=True))]
    PartRecord(kind, part_id, connector, "exactly-once", "acknowledging", dict(options)).write(
        store
    )
    return part_id


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(str(tmp_path / "store"))


def test_a_new_part_gets_the_id_without_its_tuning(store: SnapshotStore) -> None:
    options = {**QUEUE, "maxRecordsPerBatch": "100"}
    assert part_id_in_job(store, "source", "map", options) == registry.part_id("map", QUEUE)
    assert part_id_in_job(None, "source", "map", options) == registry.part_id("map", QUEUE)


@pytest.mark.parametrize(
    "now",
    [
        {"maxRecordsPerBatch": "100", "receiveTimeoutMs": "500"},  # unchanged
        {"maxRecordsPerBatch": "400", "dedupeWindowBatches": "3"},  # retuned at the upgrade
        {},  # tuning dropped
    ],
)
def test_a_part_an_earlier_runtime_recorded_keeps_its_id(
    store: SnapshotStore, now: dict[str, str]
) -> None:
    before = _recorded(
        store, "source", "map", {**QUEUE, "maxRecordsPerBatch": "100", "receiveTimeoutMs": "500"}
    )
    assert before != registry.part_id("map", QUEUE)
    assert part_id_in_job(store, "source", "map", {**QUEUE, **now}) == before


def test_a_kept_id_stays_once_the_part_is_recorded_again_with_new_tuning(
    store: SnapshotStore,
) -> None:
    before = _recorded(store, "source", "map", {**QUEUE, "maxRecordsPerBatch": "100"})
    PartRecord(
        "source",
        before,
        "map",
        "exactly-once",
        "acknowledging",
        {**QUEUE, "maxRecordsPerBatch": "300"},
    ).write(store)  # the next run records it under the id it kept, with its options now
    assert part_id_in_job(store, "source", "map", {**QUEUE, "maxRecordsPerBatch": "50"}) == before


def test_no_other_part_is_taken(store: SnapshotStore) -> None:
    tuned = {**QUEUE, "maxRecordsPerBatch": "100"}
    _recorded(store, "sink", "map", tuned)  # another kind
    _recorded(store, "source", "kafka", tuned)  # another connector
    _recorded(store, "source", "map", {"name": "other", "maxRecordsPerBatch": "100"})
    PartRecord("source", "orders", "map", "exactly-once", "acknowledging", tuned).write(
        store
    )  # named by epochal.id
    assert part_id_in_job(store, "source", "map", tuned) == registry.part_id("map", QUEUE)
    explicit = {**tuned, "epochal.id": "mine"}
    assert part_id_in_job(store, "source", "map", explicit) == "mine"


def test_a_part_recorded_under_todays_id_is_found_first(store: SnapshotStore) -> None:
    _recorded(store, "source", "map", {**QUEUE, "maxRecordsPerBatch": "100"})
    today = registry.part_id("map", QUEUE)
    PartRecord("source", today, "map", "exactly-once", "acknowledging", dict(QUEUE)).write(store)
    assert part_id_in_job(store, "source", "map", {**QUEUE, "maxRecordsPerBatch": "1"}) == today


def test_the_driver_plans_a_part_under_the_id_its_job_knows(tmp_path: Path) -> None:
    """The data source's reader and writer and the foreachBatch writer build their part with
    Part.in_job: under the job's store, the earlier id; without a job directory, today's."""
    from epochal.parts.job_context import JobContext
    from epochal.spark.common import Part

    context = JobContext(job="upgraded", job_dir=str(tmp_path / "upgraded"))
    store = context.store("map")
    before = _recorded(store, "source", "map", {**QUEUE, "maxRecordsPerBatch": "100"})
    retuned = {**QUEUE, "maxRecordsPerBatch": "20"}
    assert Part.in_job("source", "map", retuned, context).part_id == before
    assert Part.in_job("sink", "map", retuned, context).part_id == registry.part_id("map", QUEUE)
    assert Part.in_job("source", "map", retuned, JobContext(job="plain")).part_id == (
        registry.part_id("map", QUEUE)
    )
