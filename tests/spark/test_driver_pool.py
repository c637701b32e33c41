"""A driver pool keeps warm drivers only for the session profiles that jobs still ask for: the
kit retires the others after each test module (:meth:`DriverPool.retire_unasked`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from epochal.control.launcher import DriverPool
from epochal.startup.session import SessionProfile

pytestmark = pytest.mark.spark


def test_a_profile_nobody_asked_for_since_the_last_retirement_loses_its_drivers(
    tmp_path: Path,
) -> None:
    pool = DriverPool(size=1, directory=str(tmp_path / "pool"), warm_up=False)
    asked = SessionProfile("local[1]", (("spark.app.name", "asked"),))
    forgotten = SessionProfile("local[1]", (("spark.app.name", "forgotten"),))
    try:
        pool.prepare(asked)
        pool.prepare(forgotten)
        _wait_for_drivers(pool, asked, forgotten)
        # both were asked for in the phase that ends: both are kept
        assert pool.retire_unasked() == 0
        assert (pool.waiting(asked), pool.waiting(forgotten)) == (1, 1)

        pool.prepare(asked)  # in this phase, only `asked` is
        assert pool.retire_unasked() == 1
        assert pool.waiting(forgotten) == 0, "a retired profile kept its driver"
        assert pool.waiting(asked) == 1, "a profile asked for lost its driver"
    finally:
        pool.close()


def _wait_for_drivers(pool: DriverPool, *profiles: SessionProfile) -> None:
    deadline = time.monotonic() + 60
    while any(pool.waiting(p) < 1 for p in profiles):
        assert time.monotonic() < deadline, "the pool started no driver in 60 s"
        time.sleep(0.05)
