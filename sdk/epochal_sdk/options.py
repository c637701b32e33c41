"""Typed access to the string options a user passes to a connector, and the check of their
names against what the connector declares (:attr:`epochal_sdk.Connector.source_options`)."""

from __future__ import annotations

import builtins
import difflib
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar, overload

from epochal_sdk.errors import ConfigError

if TYPE_CHECKING:
    from epochal_sdk.context import ConnectorContext

T = TypeVar("T")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

INT_MAX = 2**63 - 1
"""The largest value :meth:`Options.int` accepts unless a smaller ``maximum`` is given: a
signed 64-bit integer, what a JVM ``long``, Kafka, PostgreSQL's ``bigint`` and SQLite hold."""
INT_MIN = -(2**63)
"""The smallest value :meth:`Options.int` accepts unless a ``minimum`` is given."""
FLOAT_MAX = 1e15
"""The largest magnitude :meth:`Options.float` accepts unless a ``maximum`` is given: beyond
it a float no longer holds every whole number (milliseconds for 30 000 years)."""


class Options(Mapping[str, str]):
    """Case-insensitive, read-only connector options with typed getters.

    Every getter fails with a :class:`ConfigError` that names the connector, the option, what
    is wrong and what to do, so that a connector never has to write that message itself; for
    checks of your own, raise :meth:`error`. Numbers are bounded: an integer must fit a signed
    64-bit integer (``INT_MAX``) and a float must be finite and within ``FLOAT_MAX``,
    whatever the connector asks for, so ``10**40``, ``nan`` and ``inf`` never reach it.

    The runtime builds one for every source and sink object (on the driver when a query is
    planned and at each commit, on the executors in each task), from the options the user
    gave with ``${env:...}``/``${file:...}`` references already resolved, and checks their
    names against the connector's declaration first (:meth:`check_names`).

    Args:
        connector: the connector's name (it starts every error message).
        values: the options as the user gave them (names in any case).
        context: where the source or sink built with these options runs (the runtime gives
            it; outside a job it is a default context). Read it as ``self.context``.
    """

    def __init__(
        self,
        connector: str,
        values: Mapping[str, str] | None = None,
        context: ConnectorContext | None = None,
    ) -> None:
        from epochal_sdk.context import ConnectorContext

        self.connector = connector
        given = {str(k): str(v) for k, v in (values or {}).items()}
        self._values = {k.lower(): v for k, v in given.items()}
        self._names = {k.lower(): k for k in given}
        """Each option's name as the user wrote it, for messages."""
        self.context = context if context is not None else ConnectorContext()

    def __getitem__(self, key: str) -> str:
        return self._values[key.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        from epochal_sdk.redaction import MASK, is_secret, mask

        shown = {k: MASK if is_secret(k) else mask(v) for k, v in self._values.items()}
        return f"Options({self.connector!r}, {shown!r})"

    def error(self, option: str, problem: str, fix: str) -> ConfigError:
        """The error to raise for a bad option: ``<connector>: option '<option>':
        <problem>. <fix>`` (a :class:`ConfigError`). Example::

            if start > end:
                raise self.options.error("end", f"{end} is before start {start}", "Swap them.")

        Args:
            option: the option's name, as the user writes it.
            problem: what is wrong with it (no secret: the message is masked, but say less).
            fix: what the user should do instead, as a sentence.

        Returns:
            The error; raise it.
        """
        return ConfigError(self.connector, option, problem, fix)

    def check_names(
        self, known: Iterable[str], prefixes: Iterable[str] = (), *, part: str = ""
    ) -> None:
        """Refuse an option that is neither one of ``known`` nor starts with one of
        ``prefixes`` (both case-insensitive), with a "did you mean" when a known name is
        close: a misspelled option (``mod`` for ``mode``) would otherwise be ignored without
        a word. The runtime calls it on the driver, before a source or sink is built, with
        the names the connector declares and the runtime's own; a connector need not call it.

        Args:
            known: the option names that are accepted.
            prefixes: families of names passed on to a client library as they are (e.g.
                ``kafka.``); that library checks them when the part starts.
            part: what the options are for, in the message (e.g. ``"the map sink"``).

        Raises:
            ConfigError: naming the first unknown option (in sorted order), the closest known
                name if there is one, and every accepted name.
        """
        names = {k.lower(): k for k in known}
        families = tuple(p.lower() for p in prefixes)
        for key in sorted(self._values):
            if key in names or any(key.startswith(p) for p in families):
                continue
            close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
            hint = f"Did you mean {names[close[0]]!r}? " if close else ""
            accepted = ", ".join(sorted(names.values(), key=str.lower))
            family = f" and any {', '.join(f'{p}*' for p in prefixes)}" if families else ""
            raise self.error(
                self._names.get(key, key),
                f"is not an option of {part or self.connector}",
                f"{hint}Its options are: {accepted}{family} (names are case-insensitive).",
            )

    def required(self, key: str, hint: str = "") -> str:
        """The option's value, stripped of surrounding blanks.

        Args:
            key: the option's name (case-insensitive).
            hint: what to do when it is missing (default: ``Set .option(key, ...).``).

        Raises:
            ConfigError: the option is missing or blank.
        """
        value = self._values.get(key.lower(), "").strip()
        if not value:
            raise self.error(key, "is required", hint or f"Set .option({key!r}, ...).")
        return value

    def str(self, key: str, default: str) -> str:
        """The option's value as given, or ``default`` when it is absent.

        Args:
            key: the option's name (case-insensitive).
            default: the value when the option is not given.
        """
        return self._values.get(key.lower(), default)

    @overload
    def int(
        self,
        key: builtins.str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int: ...

    @overload
    def int(
        self,
        key: builtins.str,
        default: None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None: ...

    def int(
        self,
        key: builtins.str,
        default: int | None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        """The option as a whole number, or ``default`` when it is absent or empty: an
        ``int`` whenever ``default`` is one (no ``or default`` needed), else ``int | None``.

        Args:
            key: the option's name (case-insensitive).
            default: the value when the option is not given.
            minimum: the smallest value allowed (default ``INT_MIN``).
            maximum: the largest value allowed (default ``INT_MAX``); give the limit of
                what the value goes into (e.g. ``2**31 - 1`` for a 32-bit client setting).

        Raises:
            ConfigError: the value is not a whole number, or out of bounds.
        """
        raw = self._values.get(key.lower())
        if raw is None or raw.strip() == "":
            return default
        try:
            value = builtins.int(raw)
        except ValueError:
            raise self.error(key, f"{raw!r} is not an integer", "Give a whole number.") from None
        low = INT_MIN if minimum is None else max(minimum, INT_MIN)
        high = INT_MAX if maximum is None else min(maximum, INT_MAX)
        if value < low:
            raise self.error(key, f"{_shown(value)} is below {low}", f"Give {low} or more.")
        if value > high:
            raise self.error(key, f"{_shown(value)} is above {high}", f"Give {high} or less.")
        return value

    def float(
        self,
        key: builtins.str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        """The option as a finite number, or ``default`` when it is absent or empty.

        Args:
            key: the option's name (case-insensitive).
            default: the value when the option is not given.
            minimum: the smallest value allowed (default ``-FLOAT_MAX``).
            maximum: the largest value allowed (default ``FLOAT_MAX``).

        Raises:
            ConfigError: the value is not a number, is ``nan`` or infinite, or out of bounds.
        """
        raw = self._values.get(key.lower())
        if raw is None or raw.strip() == "":
            return default
        try:
            value = builtins.float(raw)
        except ValueError:
            raise self.error(key, f"{raw!r} is not a number", "Give a number.") from None
        if not math.isfinite(value):
            raise self.error(key, f"{raw!r} is not a finite number", "Give a number.")
        low = -FLOAT_MAX if minimum is None else max(minimum, -FLOAT_MAX)
        high = FLOAT_MAX if maximum is None else min(maximum, FLOAT_MAX)
        if value < low:
            raise self.error(key, f"{value:g} is below {low:g}", f"Give {low:g} or more.")
        if value > high:
            raise self.error(key, f"{value:g} is above {high:g}", f"Give {high:g} or less.")
        return value

    def bool(self, key: builtins.str, default: bool) -> bool:
        """The option as a boolean: ``true``/``false``, ``yes``/``no``, ``on``/``off`` or
        ``1``/``0`` (any case), or ``default`` when it is absent or empty.

        Args:
            key: the option's name (case-insensitive).
            default: the value when the option is not given.

        Raises:
            ConfigError: the value is none of those words.
        """
        raw = self._values.get(key.lower())
        if raw is None or raw.strip() == "":
            return default
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        raise self.error(key, f"{raw!r} is not a boolean", "Use true or false.")

    def choice(
        self, key: builtins.str, default: builtins.str, choices: tuple[builtins.str, ...]
    ) -> builtins.str:
        """The option as one of ``choices``, lower-cased, or ``default`` when it is absent.

        Args:
            key: the option's name (case-insensitive).
            default: the value when the option is not given.
            choices: the allowed values, in lower case.

        Raises:
            ConfigError: the value is not one of ``choices`` (the message lists them).
        """
        value = self._values.get(key.lower(), default).strip().lower()
        if value not in choices:
            raise self.error(key, f"{value!r} is not allowed", f"Use one of: {', '.join(choices)}.")
        return value


def _shown(value: int) -> str:
    """A number for a message: whole when short, as a power of ten when it is huge."""
    text = builtins.str(value)
    return text if len(text) <= 24 else f"{text[0]}.{text[1:4]}e{len(text) - 1}"
