"""Masking secrets in text, in one place for the SDK and the runtime: which option names are
secret, and how a message or a value is masked before it is written anywhere (a record, a
log line, an error, a metric label, an id). Every :class:`~epochal_sdk.EpochalError` masks
its message with :func:`mask`.

An option is secret when its connector declares it (:attr:`Connector.secret_options
<epochal_sdk.Connector.secret_options>`) or, as a backstop, when its name looks like one
(:data:`SECRET_NAME`: Spark's ``spark.redaction.regex`` words and Flink's sensitive keys,
matched anywhere in the name).
Values are masked by what they look like (:func:`mask`): a password in a URL
(``scheme://user:secret@host``), ``password=``/``sslpassword=``/``clientSecret=`` items in a
connection string or a JAAS/OAuth config, and PEM private keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
"""What a secret value is replaced with."""

SECRET_NAME = re.compile(
    r"(?i)secret|passw(?:or)?d|(?:^|[._-])pwd(?:$|[._-])|token|access[._-]?key|api[._-]?key"
    r"|credential|jaas|private|\.pem(?:$|[._-])|(?:^|[._-])auth|(?:^|[._-])headers?(?:$|[._-])"
    r"|sasl|signature"
)
"""Option names that are treated as secret whatever the connector declares."""

_URL_LOGIN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*):[^@/\s]*@")
_ASSIGNED = re.compile(
    r"(?i)(?P<key>\b[\w.-]*(?:passw(?:or)?d|pwd|secret|token|api[_-]?key|access[_-]?key)"
    r"[\w.-]*)(?P<sep>\s*[=:]\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s;&,'\"]+)"
)
_PEM = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S
)


def is_secret(name: str, declared: Iterable[str] = ()) -> bool:
    """Whether option ``name`` is secret: declared by its connector, or named like one.

    Args:
        name: an option's name (any case).
        declared: the connector's ``secret_options``.

    Returns:
        True for a secret option.
    """
    lowered = name.lower()
    return lowered in {d.lower() for d in declared} or bool(SECRET_NAME.search(lowered))


def without_userinfo(value: str) -> str:
    """``value`` with the user name and password taken out of every URL in it
    (``postgresql://app:pw@db/orders`` → ``postgresql://db/orders``), and any other secret it
    shows masked: what names a server, for a part's target (who logs in is not where)."""
    return mask(_URL_LOGIN.sub(lambda m: m.group("scheme"), value))


def mask(text: str) -> str:
    """``text`` with every secret value it shows replaced by :data:`MASK`.

    Args:
        text: a message, a log line, a value.

    Returns:
        The text with URL passwords, ``password=``-like items and PEM private keys masked.
    """
    text = _PEM.sub(MASK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    return _ASSIGNED.sub(lambda m: f"{m.group('key')}{m.group('sep')}{MASK}", text)
