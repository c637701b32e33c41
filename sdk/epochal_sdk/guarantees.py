"""Processing guarantees and how they combine."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Guarantee(enum.IntEnum):
    """A processing guarantee, ordered from weakest to strongest.

    * ``NONE``: no snapshot cooperation; records may be lost or duplicated after a failure.
    * ``AT_LEAST_ONCE``: nothing is lost; records may be processed again after a failure.
    * ``EXACTLY_ONCE``: nothing is lost and every record's effect is visible once.

    A connector says what it can give with ``MAX_GUARANTEE`` or ``max_guarantee()``; the job
    runs at the weakest of its own setting and its parts'. Compare with ``<``/``>=``.
    """

    NONE = 0
    """No snapshot cooperation; records may be lost or duplicated after a failure."""
    AT_LEAST_ONCE = 1
    """Nothing is lost; records may be processed again after a failure."""
    EXACTLY_ONCE = 2
    """Nothing is lost and every record's effect is visible once."""

    @classmethod
    def parse(cls, text: str | Guarantee) -> Guarantee:
        """Parse ``"exactly-once"``, ``"EXACTLY_ONCE"``, ``"at_least_once"``, ``"none"``.

        Args:
            text: the guarantee as a user wrote it (or a Guarantee, returned as it is).

        Returns:
            The guarantee.

        Raises:
            ValueError: ``text`` names no guarantee (the message lists the choices).
        """
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
