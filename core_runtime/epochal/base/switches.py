"""On/off switches in the environment (``EPOCHAL_ATTACH=0``, ``EPOCHAL_TIMELINE=1`` ...): the
one way every part of epochal reads them, so that each takes the same words."""

from __future__ import annotations

import os

ON = ("1", "true", "yes", "on")
"""What turns a switch on (any case, spaces around ignored)."""
OFF = ("0", "false", "no", "off")
"""What turns a switch off."""


class SwitchError(ValueError):
    """A switch set to something that is neither on nor off."""


def env_switch(name: str, default: bool) -> bool:
    """Whether the switch ``name`` of the environment is on: ``default`` when it is unset or
    empty, else one of :data:`ON` or :data:`OFF`. Anything else raises :class:`SwitchError`
    naming the variable and what to write (a typo must not silently mean the default)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise SwitchError(
        f"{name}={os.environ[name]!r} is neither on nor off: set it to one of "
        f"{', '.join(ON)} (on) or {', '.join(OFF)} (off), or unset it "
        f"(the default: {'on' if default else 'off'})"
    )
