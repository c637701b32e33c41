"""The contract checks of a replayable source: a replay reads the same rows, and once."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochal.testing.contract_checks.common import (
    Part,
    Subject,
    _first,
    _until,
    _violation,
    as_dicts,
)
from epochal_sdk import (
    Guarantee,
    ReplayableSource,
    Split,
)

if TYPE_CHECKING:
    pass


# -- the replayable source --------------------------------------------------------------------
@dataclass
class PlannedBatch:
    """One batch a replayable source's driver object planned, and what its tasks read."""

    number: int
    splits: list[Split]
    rows: list[list[dict[str, Any]]] = field(default_factory=list)


class ReplayDriver:
    """A replayable source's driver side as :class:`~epochal.spark.sources.ReplayableReader`
    plans batches (one object for the query), and its tasks (a new object each)."""

    def __init__(self, subject: Subject, check: str) -> None:
        assert subject.source is not None
        self.subject, self.check = subject, check
        self.under = subject.source
        self.part = Part.of(self.under.connector, self.under.options())
        self.source: ReplayableSource = self.part.build(self.part.context(), "source")
        if not isinstance(self.source, ReplayableSource):
            raise _violation(check, f"{type(self.source).__name__} is not a ReplayableSource")
        self.source.check()
        self.exactly_once = (
            subject.exactly_once and self.source.max_guarantee() == Guarantee.EXACTLY_ONCE
        )
        self.columns = tuple(self.source.columns())
        self.offsets = self._json(self.source.initial_offsets(self.source.partitions()))
        self.initial = dict(self.offsets)
        self.batches: list[PlannedBatch] = []

    def _json(self, offsets: Any) -> dict[str, Any]:
        try:
            again = json.loads(json.dumps(offsets))
        except (TypeError, ValueError) as exc:
            raise _violation(
                self.check,
                f"offsets {offsets!r} are not JSON ({exc}): Spark's offset log keeps them",
            ) from None
        if again != offsets:
            raise _violation(
                self.check,
                f"offsets {offsets!r} come back from JSON as {again!r}: Spark's offset log "
                "keeps them as JSON, so a restart would resume elsewhere",
            )
        return dict(offsets)

    def plan(self) -> PlannedBatch | None:
        """The next batch (at most ``per_batch`` records), or None when nothing is new."""
        partitions = self.source.partitions()
        start = self.offsets
        new = [p for p in partitions if p not in start]
        begin = {**start, **(self.source.initial_offsets(new) if new else {})}
        latest = {**begin, **self.source.latest_offsets(partitions)}
        end = self._json(self.source.limit(begin, latest, self.subject.per_batch))
        for partition in new:
            end[partition] = begin[partition]
        if end == start:
            return None
        batch = PlannedBatch(len(self.batches), self.source.splits(begin, end))
        self.offsets = end
        self.batches.append(batch)
        return batch

    def read(self, batch: PlannedBatch, attempt: int = 0) -> list[list[dict[str, Any]]]:
        """Each split of ``batch`` read by a new source object, as a task attempt reads it."""
        out = []
        for index, split in enumerate(batch.splits):
            context = self.part.context(batch=batch.number, partition=index, attempt=attempt)
            source = self.part.build(context, "source")
            try:
                out.append(as_dicts(source.read(split), self.columns))
            finally:
                source.close()
        return out

    def read_together(self, batch: PlannedBatch) -> list[dict[str, Any]]:
        """Every split of ``batch`` read by one new source object's ``read_splits``, as a task
        given several small splits reads them."""
        context = self.part.context(batch=batch.number, partition=0, attempt=2)
        source = self.part.build(context, "source")
        try:
            return as_dicts(source.read_splits(batch.splits), self.columns)
        finally:
            source.close()

    def covered(self) -> int | None:
        """How many positions the planned offsets cover since the start, for offsets that
        count records (integers); None for other offsets."""
        total = 0
        for partition, end in self.offsets.items():
            start = self.initial.get(partition, 0)
            if not isinstance(end, int) or not isinstance(start, int):
                return None
            total += end - start
        return total

    def read_to_the_end(self, produced: set[int], total: int) -> list[int]:
        """Plan and read batches until every ID of ``produced`` was read; while some are
        missing and the offsets do not yet cover ``total`` records (a server may show
        committed records a moment later), wait for new offsets up to the subject's
        ``arrival_deadline``. The record IDs read, in order."""
        seen: list[int] = []
        deadline = time.monotonic() + self.subject.arrival_deadline
        while _until(deadline):
            batch = self.plan()
            if batch is None:
                covered = self.covered()
                if produced <= set(seen) or (covered is not None and covered >= total):
                    break
                time.sleep(0.05)  # polled with the deadline above
                continue
            batch.rows = self.read(batch)
            for rows in batch.rows:
                seen += self.under.record_ids(rows)
        return seen

    def close(self) -> None:
        """Close the driver object."""
        self.source.close()


def _check_once(check: str, seen: list[int], produced: Iterable[int], exactly_once: bool) -> None:
    counts = Counter(seen)
    wanted = set(produced)
    lost = wanted - set(counts)
    if lost:
        raise _violation(
            check,
            f"the planned batches never read {len(lost)} of the {len(wanted)} records "
            f"(IDs {_first(lost)}): a split's start or end is skipped, or latest_offsets runs "
            "ahead of what read returns",
        )
    doubled = {i: n for i, n in counts.items() if n > 1}
    if exactly_once and doubled:
        raise _violation(
            check,
            f"{len(doubled)} records were read by more than one batch (IDs "
            f"{_first(doubled)}): consecutive splits overlap (an end read as inclusive, or a "
            "read past split.end)",
        )


def _same_rows(check: str, first: list[dict[str, Any]], again: list[dict[str, Any]], what: str):
    if first == again:
        return
    if sorted(map(repr, first)) == sorted(map(repr, again)):
        raise _violation(
            check,
            f"{what} gave the same rows in another order: read(split) must yield a split's "
            "records in the same order every time (a replay is the same batch)",
        )
    for index, (a, b) in enumerate(zip(first, again, strict=False)):
        if a != b:
            raise _violation(
                check,
                f"{what} differs at row {index}: {a!r} the first time, {b!r} again "
                f"({len(first)} and {len(again)} rows): read(split) must return exactly the "
                "same records every time",
            )
    raise _violation(
        check,
        f"{what} gave {len(first)} rows the first time and {len(again)} again: read(split) "
        "must return exactly the split's records, every time",
    )


def check_replay_same_rows(subject: Subject) -> None:
    """Every split of a full batch, read twice by new objects, gives the same rows in the same
    order."""
    check = "replay-same-rows"
    assert subject.source is not None
    ids = list(range(2 * subject.per_batch))
    subject.source.produce(ids)
    driver = ReplayDriver(subject, check)
    try:
        deadline = time.monotonic() + subject.arrival_deadline
        batch = driver.plan()
        while batch is None and _until(deadline):  # the server may show the records late
            time.sleep(0.05)
            batch = driver.plan()
        if batch is None:
            raise _violation(check, f"no batch was planned over {len(ids)} produced records")
        first, again = driver.read(batch), driver.read(batch, attempt=1)
        for split, rows, second in zip(batch.splits, first, again, strict=True):
            _same_rows(check, rows, second, f"batch {batch.number}, split {split}")
        if len(batch.splits) > 1:
            _same_rows_together(check, first, driver.read_together(batch), batch)
    finally:
        driver.close()


def _same_rows_together(
    check: str, each: list[list[dict[str, Any]]], together: list[dict[str, Any]], batch: Any
) -> None:
    """``read_splits`` of a batch's splits gives each split's rows, in their order, and no
    other (the runtime gives one task several small splits)."""
    what = f"read_splits of batch {batch.number}'s {len(batch.splits)} splits"
    if sorted(map(repr, together)) != sorted(repr(row) for rows in each for row in rows):
        raise _violation(
            check,
            f"{what} gave {len(together)} rows, read of each split {sum(map(len, each))}, or "
            "other rows: read_splits must give exactly the records read(split) gives for each",
        )
    for split, rows in zip(batch.splits, each, strict=True):
        found = iter(map(repr, together))
        if not all(row in found for row in map(repr, rows)):  # a subsequence, in order
            raise _violation(
                check,
                f"{what}: the rows of {split} came in another order: read_splits must keep "
                "each split's records in order",
            )


def check_replay_once(subject: Subject) -> None:
    """The batches cover every record once; more records arriving change no planned batch."""
    check = "replay-once"
    assert subject.source is not None
    first_ids = list(range(subject.per_batch + subject.per_batch // 2))  # two batches
    subject.source.produce(first_ids)
    driver = ReplayDriver(subject, check)
    try:
        seen = driver.read_to_the_end(set(first_ids), len(first_ids))
        _check_once(check, seen, first_ids, driver.exactly_once)
        more = list(range(len(first_ids), len(first_ids) + subject.per_batch // 2))
        subject.source.produce(more)
        first = driver.batches[0]
        for split, before, after in zip(first.splits, first.rows, driver.read(first), strict=True):
            _same_rows(check, before, after, f"batch 0, split {split}, after more records came")
        seen += driver.read_to_the_end(set(more), len(first_ids) + len(more))
        _check_once(check, seen, first_ids + more, driver.exactly_once)
    finally:
        driver.close()
