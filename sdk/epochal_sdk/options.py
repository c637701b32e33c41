"""Typed access to the string options a user passes to a connector."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar, overload

from epochal_sdk.errors import ConfigError

if TYPE_CHECKING:
    from epochal_sdk.context import ConnectorContext

T = TypeVar("T")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class Options(Mapping[str, str]):
    """Case-insensitive, read-only connector options with typed getters.

    Every getter fails with a :class:`ConfigError` that names the connector, the option, what
    is wrong and what to do, so that a connector never has to write that message itself; for
    checks of your own, raise :meth:`error`.

    Args:
        connector: the connector's name (it starts every error message).
        values: the options as the user gave them.
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
        self._values = {str(k).lower(): str(v) for k, v in (values or {}).items()}
        self.context = context if context is not None else ConnectorContext()

    def __getitem__(self, key: str) -> str:
        return self._values[key.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Options({self.connector!r}, {self._values!r})"

    def error(self, option: str, problem: str, fix: str) -> ConfigError:
        """The error to raise for a bad ``option``: ``<connector>: option '<option>':
        <problem>. <fix>`` (a :class:`ConfigError`). Example::

            if start > end:
                raise self.options.error("end", f"{end} is before start {start}", "Swap them.")
        """
        return ConfigError(self.connector, option, problem, fix)

    def required(self, key: str, hint: str = "") -> str:
        """The option's value; a clear error if it is missing or empty."""
        value = self._values.get(key.lower(), "").strip()
        if not value:
            raise self.error(key, "is required", hint or f"Set .option({key!r}, ...).")
        return value

    def str(self, key: str, default: str) -> str:
        """The option's value, or ``default``."""
        return self._values.get(key.lower(), default)

    @overload
    def int(self, key: str, default: int, *, minimum: int | None = None) -> int: ...

    @overload
    def int(self, key: str, default: None, *, minimum: int | None = None) -> int | None: ...

    def int(self, key: str, default: int | None, *, minimum: int | None = None) -> int | None:
        """The option as an integer (at least ``minimum``), or ``default`` when absent: an
        ``int`` whenever ``default`` is one (no ``or default`` needed), else ``int | None``."""
        raw = self._values.get(key.lower())
        if raw is None or raw.strip() == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise self.error(key, f"{raw!r} is not an integer", "Give a whole number.") from None
        if minimum is not None and value < minimum:
            raise self.error(key, f"{value} is below {minimum}", f"Give {minimum} or more.")
        return value

    def float(self, key: str, default: float, *, minimum: float | None = None) -> float:
        """The option as a number (at least ``minimum``), or ``default`` when absent."""
        raw = self._values.get(key.lower())
        if raw is None or raw.strip() == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise self.error(key, f"{raw!r} is not a number", "Give a number.") from None
        if minimum is not None and value < minimum:
            raise self.error(key, f"{value} is below {minimum}", f"Give {minimum} or more.")
        return value

    def bool(self, key: str, default: bool) -> bool:
        """The option as a boolean (true/false, yes/no, on/off, 1/0)."""
        raw = self._values.get(key.lower())
        if raw is None or raw.strip() == "":
            return default
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        raise self.error(key, f"{raw!r} is not a boolean", "Use true or false.")

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        """The option as one of ``choices`` (case-insensitive)."""
        value = self._values.get(key.lower(), default).strip().lower()
        if value not in choices:
            raise self.error(key, f"{value!r} is not allowed", f"Use one of: {', '.join(choices)}.")
        return value
