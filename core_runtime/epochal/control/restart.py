"""The restart policy of a job, in one place: whether a failed run is restarted, and after
how long. The supervisor asks it when a driver ended (a new driver, or the standby); the
driver asks it when its query failed and the session survived (an in-place restart)."""

from __future__ import annotations

from dataclasses import dataclass

from epochal.config import JobConfig


@dataclass(frozen=True)
class RestartDecision:
    """What to do after a restartable failure: restart after ``backoff`` seconds, or give
    up (``give_up`` says why, for the job's record)."""

    backoff: float = 0.0
    give_up: str | None = None

    @property
    def restart(self) -> bool:
        """Whether the job is restarted."""
        return self.give_up is None


def decide(
    config: JobConfig, restarts_in_a_row: int, why: str, *, warm_driver: bool = False
) -> RestartDecision:
    """The decision for a job whose run failed restartably (``why``), after
    ``restarts_in_a_row`` restarts without progress.

    Off (``auto_restart=False``): give up. At the limit (``max_restarts`` in a row): give
    up. Else restart at once the first time (the job is down meanwhile, and most failures a
    restart cures are over: a killed process, a crashed worker), then back off
    ``restart_backoff * 2**(restarts_in_a_row - 1)`` seconds, at most ``max_restart_backoff``,
    for each further restart in a row without progress (a server that stays down); only the
    first step when a warm driver is waiting (it needs no time to start).
    """
    if not config.auto_restart:
        return RestartDecision(give_up=f"{why} (automatic restart is off)")
    if restarts_in_a_row >= config.max_restarts:
        return RestartDecision(
            give_up=f"{why}; gave up after {restarts_in_a_row} restarts in a row without "
            "progress (max_restarts)"
        )
    if restarts_in_a_row == 0:
        return RestartDecision(backoff=0.0)
    backoff = min(config.max_restart_backoff, config.restart_backoff * 2 ** (restarts_in_a_row - 1))
    if warm_driver:
        backoff = min(backoff, config.restart_backoff)
    return RestartDecision(backoff=backoff)
