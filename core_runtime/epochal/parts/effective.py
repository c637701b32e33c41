"""The effective guarantee: the weakest of the job's, the part's own option, and what the
connector can give. Asking for more than a connector can give is refused before the job runs,
unless the user allows the downgrade."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from epochal_sdk import ConfigError, Guarantee
from epochal_sdk.errors import GuaranteeError

log = logging.getLogger("epochal.guarantee")


def effective(
    asked: Guarantee,
    capable: Guarantee,
    *,
    part: str,
    options: Mapping[str, str],
    allow_downgrade: bool,
    why: str = "",
) -> Guarantee:
    """The guarantee ``part`` (``"sink 'map' (map-1a2b)"``) runs with.

    Args:
        asked: the job's guarantee.
        capable: the strongest the connector can give now (``max_guarantee()``).
        options: the part's options; ``guarantee`` lowers it explicitly.
        allow_downgrade: the job accepts a weaker guarantee than asked.
    """
    lowered = {k.lower(): v for k, v in options.items()}.get("guarantee")
    try:
        wanted = min(asked, Guarantee.parse(lowered)) if lowered else asked
    except ValueError as exc:
        raise ConfigError(
            part, "guarantee", str(exc), "Use exactly-once, at-least-once or none."
        ) from None
    if capable >= wanted:
        return wanted
    message = (
        f"{part} can give at most {capable.label}{f' ({why})' if why else ''}, "
        f"but the job asks for {wanted.label}"
    )
    if allow_downgrade:
        log.warning(
            "%s: running it %s because the job allows the downgrade", message, capable.label
        )
        return capable
    raise GuaranteeError(
        f"{message}. Refusing to start. Either lower this part explicitly with "
        f".option('guarantee', '{capable.label}'), allow the downgrade for the job "
        "(JobConfig(allow_downgrade=True) / --allow-downgrade), or use a connector that "
        f"can give {wanted.label}."
    )
