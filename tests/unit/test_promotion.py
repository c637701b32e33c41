"""A warm driver's promotion carries the supervisor's environment as it is at that moment."""

from __future__ import annotations

from epochal.control.messages import Promotion


def test_a_promotion_drops_what_the_supervisor_dropped_since_the_launch() -> None:
    """A variable the supervisor had when the warm driver was launched and has since removed
    (a test's or an operator's setting) is gone from the promoted driver; the others take
    the supervisor's values. Without ``unset``, a pipeline run on a warm driver read a setting
    its supervisor no longer had (and wrote to another map)."""
    sent = Promotion(3, "/snapshots", "job", {"KEPT": "new", "ADDED": "1"}, ("DROPPED",))
    received = Promotion.parse(sent.to_line())
    assert received == sent
    driver_env = {"KEPT": "old", "DROPPED": "stale", "DRIVER_OWN": "x"}
    received.apply_env(driver_env)
    assert driver_env == {"KEPT": "new", "ADDED": "1", "DRIVER_OWN": "x"}


def test_a_promotion_from_an_older_supervisor_without_unset_still_parses() -> None:
    line = '{"promote": true, "epoch": 1, "snapshot_dir": "/s", "job": "j", "env": {}}'
    promotion = Promotion.parse(line)
    assert promotion is not None and promotion.unset == ()
