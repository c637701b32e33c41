"""Secrets in the runtime: options written down without them, identities that do not depend
on them, and ``${env:...}``/``${file:...}`` references resolved only where a connector
runs. What is secret and how it is masked is :mod:`epochal_sdk.redaction`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from epochal_sdk.redaction import MASK, SECRET_NAME, is_secret, mask

__all__ = ["MASK", "SECRET_NAME", "is_secret", "mask", "recordable", "resolve", "resolved"]


def recordable(
    options: Mapping[str, str], declared: tuple[str, ...] | frozenset[str] = ()
) -> dict[str, str]:
    """The options as they may be written down: secret options left out, secrets inside
    the other values masked."""
    declared = tuple(declared)
    return {k: mask(str(v)) for k, v in options.items() if not is_secret(k, declared)}


def without_secrets(
    options: Mapping[str, str], declared: tuple[str, ...] | frozenset[str] = ()
) -> dict[str, str]:
    """The options that say *where* data goes, for a part's identity: secret options left
    out and secrets inside values masked, so rotating a password keeps the part's id (and
    with it its in-doubt transactions, stored batches and dedupe ids), and no id carries a
    digest of a secret."""
    return recordable(options, declared)


_REFERENCE = re.compile(r"^\$\{(?P<kind>env|file):(?P<name>[^}]+)\}$")


def resolve(option: str, value: str) -> str:
    """The value of ``value``, which may be a reference: ``${env:NAME}`` (an environment
    variable of the process that runs the connector) or ``${file:PATH}`` (a file's content,
    without its trailing newline). Records keep the reference, never what it stands for.
    An unresolvable reference is a ``ConfigError`` naming the option and the reference."""
    found = _REFERENCE.match(value.strip()) if isinstance(value, str) else None
    if found is None:
        return value
    import os

    from epochal_sdk import ConfigError

    kind, name = found.group("kind"), found.group("name")
    if kind == "env":
        if name not in os.environ:
            raise ConfigError(
                "job",
                option,
                f"refers to the environment variable {name!r}, which is not set here",
                f"Set {name} in the environment of the driver and of the executors, or give "
                "the value another way (${file:PATH}).",
            )
        return os.environ[name]
    try:
        with open(name) as fh:
            return fh.read().rstrip("\n")
    except OSError as exc:
        raise ConfigError(
            "job",
            option,
            f"refers to the file {name!r}, which cannot be read ({exc.strerror})",
            "Give a file that the driver and the executors can read (owner-only: chmod 600).",
        ) from None


def resolved(options: Mapping[str, str]) -> dict[str, str]:
    """The options with every ``${env:...}``/``${file:...}`` reference resolved."""
    return {k: resolve(k, v) for k, v in options.items()}
