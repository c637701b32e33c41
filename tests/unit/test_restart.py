"""The one restart policy: the first restart at once, then a doubling backoff for restarts in
a row without progress, capped; off stays off; a limit; a warm driver needs no long wait."""

from __future__ import annotations

from epochal.config import JobConfig
from epochal.control.restart import decide

CONFIG = JobConfig(restart_backoff=1.0, max_restart_backoff=5.0, max_restarts=6)


def test_the_first_restart_is_at_once_then_the_wait_doubles_up_to_its_cap() -> None:
    waits = [decide(CONFIG, in_a_row, "lost a worker").backoff for in_a_row in range(6)]
    assert waits == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_waiting_warm_driver_caps_the_wait_at_the_first_step() -> None:
    assert decide(CONFIG, 4, "driver killed", warm_driver=True).backoff == 1.0
    assert decide(CONFIG, 0, "driver killed", warm_driver=True).backoff == 0.0


def test_the_limit_and_automatic_restart_off_give_up_with_the_reason() -> None:
    limit = decide(CONFIG, 6, "server down")
    assert not limit.restart and "after 6 restarts in a row" in str(limit.give_up)
    off = decide(JobConfig(auto_restart=False), 0, "server down")
    assert not off.restart and off.give_up == "server down (automatic restart is off)"
