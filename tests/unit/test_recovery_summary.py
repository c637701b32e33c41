"""A job's recoveries, phase by phase, from its run history: the phases add up to the whole,
in the order they happen, with the kill when a crash point's marker gives it."""

from __future__ import annotations

import pytest

from epochal.ops.recovery import recoveries

RUNS = [
    {"run": 1, "kind": "cold", "started": 100.0, "ended": 130.0, "phases": {"bind": 1.0}},
    {
        "run": 2,
        "kind": "standby",
        "failed_at": 130.0,
        "started": 130.5,
        "first_batch_at": 133.0,
        "phases": {"query start": 0.3, "quorum": 0.1, "bind": 0.1, "first batch": 2.0},
        "first_batch_spark_ms": {"addBatch": 1500, "queryPlanning": 100, "walCommit": 50},
        "standby": {"ready": False, "up_s": 12.0},
    },
    {
        "run": 3,
        "kind": "in-place",
        "failed_at": 140.0,
        "started": 140.0,
        "first_batch_at": 142.0,
        "phases": {"restart": 0.2, "quorum": 0.0, "query start": 0.3, "first batch": 1.5},
    },
]


def test_each_recovery_adds_up_from_the_kill_to_its_first_batch_in_order() -> None:
    standby, in_place = recoveries(RUNS, kills=[129.8, 139.0])
    assert [name for name, _ in standby.phases] == [
        "kill → failure seen",
        "new run started",
        "bind",
        "quorum",
        "query start",
        "first batch",
    ]
    assert standby.seconds == pytest.approx(3.2)
    assert sum(s for _, s in standby.phases) == pytest.approx(standby.seconds)
    assert dict(standby.batch) == {
        "planning": 0.1,
        "the batch's tasks and commit": 1.5,
        "offset log": 0.05,
    }
    assert "still warming up (12.0 s after its launch)" in standby.describe()
    assert in_place.seconds == pytest.approx(3.0)
    assert sum(s for _, s in in_place.phases) == pytest.approx(in_place.seconds)
    assert in_place.phases[1][0] == "restart"


def test_without_a_known_kill_it_counts_from_the_failure_seen() -> None:
    standby, _ = recoveries(RUNS)
    assert standby.seconds == pytest.approx(3.0)
    assert standby.phases[0] == ("new run started", 0.5)
