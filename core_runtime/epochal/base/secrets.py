"""Secrets in the runtime: options written down without them, identities that do not depend
on them, and ``${env:...}``/``${file:...}`` references resolved only where a connector
runs. What is secret and how it is masked is :mod:`epochal_sdk.redaction`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from epochal_sdk.redaction import MASK, SECRET_NAME, is_secret, mask

__all__ = [
    "MASK",
    "SECRET_NAME",
    "SPARK_SECRET_SETTING",
    "is_reference",
    "is_secret",
    "is_secret_setting",
    "mask",
    "recordable",
    "resolve",
    "resolved",
]

SPARK_SECRET_SETTING = re.compile(r"(?i)secret|password|token|access[._]?key")
"""Spark settings whose values are secrets, by name: Spark's own ``spark.redaction.regex``
(``secret|password|token|access[.]key``), which also catches the S3A and AWS key settings
(``spark.hadoop.fs.s3a.secret.key``, ``spark.executorEnv.AWS_SECRET_ACCESS_KEY``). Narrower
than :data:`SECRET_NAME`: a Spark setting named ``...credentials.provider`` or
``spark.authenticate`` holds a class name or a flag."""


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


def is_reference(value: str) -> bool:
    """Whether ``value`` is a ``${env:NAME}`` or ``${file:PATH}`` reference."""
    return isinstance(value, str) and _REFERENCE.match(value.strip()) is not None


def is_secret_setting(key: str, value: str) -> bool:
    """Whether the Spark setting ``key=value`` holds a secret: its name says so
    (:data:`SPARK_SECRET_SETTING`), or its value shows one (a password in a URL, a
    ``password=`` item, a private key: what :func:`mask` masks)."""
    return bool(SPARK_SECRET_SETTING.search(key)) or mask(str(value)) != str(value)


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
