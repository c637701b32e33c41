"""Processing guarantees and how they combine."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Guarantee(enum.IntEnum):
    """A processing guarantee, ordered from weakest to strongest.

    * ``NONE``: no snapshot cooperation; records may be lost or duplicated after a failure.
    * ``AT_LEAST_ONCE``: nothing is lost; records may be processed again after a failure.
    * ``EXACTLY_ONCE``: nothing is lost and every record's effect is visible once.
    """

    NONE = 0
    AT_LEAST_ONCE = 1
    EXACTLY_ONCE = 2

    @classmethod
    def parse(cls, text: str | Guarantee) -> Guarantee:
        """Parse ``"exactly-once"``, ``"EXACTLY_ONCE"``, ``"at_least_once"``, ``"none"``."""
        if isinstance(text, Guarantee):
            return text
        key = str(text).strip().upper().replace("-", "_").replace(" ", "_")
        try:
            return cls[key]
        except KeyError:
            choices = ", ".join(g.label for g in cls)
            raise ValueError(
                f"unknown processing guarantee {text!r}; use one of: {choices}"
            ) from None

    @property
    def label(self) -> str:
        """The guarantee as users write it: ``exactly-once``, ``at-least-once``, ``none``."""
        return self.name.lower().replace("_", "-")


def weakest(guarantees: Iterable[Guarantee]) -> Guarantee:
    """The effective guarantee of a pipeline: the weakest of its parts."""
    return min(guarantees, default=Guarantee.EXACTLY_ONCE)
