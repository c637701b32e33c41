"""The names a released ``epochal-sdk`` exported where it no longer does, and each one's home.

A connector written against an earlier SDK keeps importing them from where they were:
``from epochal_sdk import Field`` works, and warns::

    DeprecationWarning: epochal_sdk.Field is deprecated: import it from epochal_sdk.schema
    (from epochal_sdk.schema import Field); the old name goes in epochal-sdk 0.3.0

:data:`MOVED` is the one table of these names. The modules that lost a name
(``epochal_sdk`` itself, ``epochal_sdk.sinks``) look their unknown attributes up in it
through a module ``__getattr__`` (:func:`moved`), which imports the name from its new home
when it is used, every use warning again. A deprecated name is in no ``__all__`` (neither
``from epochal_sdk import *`` nor the API reference shows it), and type checkers do not see
it: they report the old import, so the one-line fix shows there too.

A deprecated name is kept for two minor releases after the one that moved it, and removed
in the release :attr:`Moved.removed_in` names at the earliest: the names moved in 0.1 go no
earlier than 0.3.0. ``tests/unit/test_sdk_compatibility.py`` holds every public name and
signature the SDK has exported (``tests/unit/sdk_api.json``) and fails when one goes from
its module without an entry here.
"""

from __future__ import annotations

import importlib
import warnings
from typing import NamedTuple


class Moved(NamedTuple):
    """Where a deprecated name is now.

    Attributes:
        module: the module to import it from (``epochal_sdk`` when it is in its ``__all__``).
        name: its name there (another one when it was renamed).
        removed_in: the first release that may drop the old name.
    """

    module: str
    name: str
    removed_in: str


REMOVED_IN = "0.3.0"
"""When the names deprecated in 0.1 go: two minor releases later, at the earliest."""

MOVED: dict[str, Moved] = {
    # epochal_sdk's top level, cut to what a connector author imports: the runtime's names
    # stay in their modules
    "epochal_sdk.FencedError": Moved("epochal_sdk.errors", "FencedError", REMOVED_IN),
    "epochal_sdk.Field": Moved("epochal_sdk.schema", "Field", REMOVED_IN),
    "epochal_sdk.GuaranteeError": Moved("epochal_sdk.errors", "GuaranteeError", REMOVED_IN),
    "epochal_sdk.Metrics": Moved("epochal_sdk.context", "Metrics", REMOVED_IN),
    "epochal_sdk.RecordId": Moved("epochal_sdk.ids", "RecordId", REMOVED_IN),
    "epochal_sdk.Rows": Moved("epochal_sdk.sources", "Rows", REMOVED_IN),
    "epochal_sdk.Sink": Moved("epochal_sdk.sinks", "Sink", REMOVED_IN),
    "epochal_sdk.SinkWriter": Moved("epochal_sdk.sinks", "SinkWriter", REMOVED_IN),
    "epochal_sdk.Source": Moved("epochal_sdk.sources", "Source", REMOVED_IN),
    "epochal_sdk.batch_of": Moved("epochal_sdk.ids", "batch_of", REMOVED_IN),
    "epochal_sdk.column_names": Moved("epochal_sdk.schema", "column_names", REMOVED_IN),
    "epochal_sdk.ddl": Moved("epochal_sdk.schema", "ddl", REMOVED_IN),
    "epochal_sdk.hookimpl": Moved("epochal_sdk.hookspecs", "hookimpl", REMOVED_IN),
    "epochal_sdk.hookspec": Moved("epochal_sdk.hookspecs", "hookspec", REMOVED_IN),
    "epochal_sdk.job_starting": Moved("epochal_sdk.errors", "job_starting", REMOVED_IN),
    "epochal_sdk.parse_ddl": Moved("epochal_sdk.schema", "parse_ddl", REMOVED_IN),
    "epochal_sdk.row_of": Moved("epochal_sdk.schema", "row_of", REMOVED_IN),
    "epochal_sdk.transaction_prefix": Moved("epochal_sdk.ids", "transaction_prefix", REMOVED_IN),
    "epochal_sdk.weakest": Moved("epochal_sdk.guarantees", "weakest", REMOVED_IN),
    # one context for sources, sinks and tasks: a sink task's TaskContext is a ConnectorContext
    "epochal_sdk.TaskContext": Moved("epochal_sdk", "ConnectorContext", REMOVED_IN),
    "epochal_sdk.sinks.TaskContext": Moved("epochal_sdk", "ConnectorContext", REMOVED_IN),
    # the ids, once in epochal_sdk.sinks, are in epochal_sdk.ids
    "epochal_sdk.sinks.RecordId": Moved("epochal_sdk.ids", "RecordId", REMOVED_IN),
    "epochal_sdk.sinks.TransactionId": Moved("epochal_sdk", "TransactionId", REMOVED_IN),
    "epochal_sdk.sinks.WriterId": Moved("epochal_sdk", "WriterId", REMOVED_IN),
    "epochal_sdk.sinks.batch_of": Moved("epochal_sdk.ids", "batch_of", REMOVED_IN),
    "epochal_sdk.sinks.transaction_prefix": Moved(
        "epochal_sdk.ids", "transaction_prefix", REMOVED_IN
    ),
}
"""Every deprecated name, as ``<old module>.<name>``, and where it is now."""


def message(old: str) -> str:
    """The warning a use of the deprecated name ``old`` (``epochal_sdk.Field``) gives: its
    new home, the import that replaces it, and the release that drops it.

    Args:
        old: the name as it was, ``<module>.<name>``: a key of :data:`MOVED`.

    Returns:
        The text of the ``DeprecationWarning``.
    """
    new = MOVED[old]
    if new.name == old.rpartition(".")[2]:
        where = f"import it from {new.module}"
    else:
        where = f"it is {new.module}.{new.name} now"
    return (
        f"{old} is deprecated: {where} (from {new.module} import {new.name}); "
        f"the old name goes in epochal-sdk {new.removed_in}"
    )


def moved(module: str, name: str) -> object:
    """What the ``__getattr__`` of ``module`` gives for ``name``, a name it no longer has: the
    object from its new home, with a ``DeprecationWarning`` (:func:`message`) that points at
    the code using it.

    Args:
        module: the module asked (its ``__name__``).
        name: the attribute asked for.

    Returns:
        The object the deprecated name stands for.

    Raises:
        AttributeError: ``name`` is not a deprecated name of ``module`` either.
    """
    old = f"{module}.{name}"
    new = MOVED.get(old)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    # 1: here, 2: the module's __getattr__, 3: the code that imports the name
    warnings.warn(message(old), DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new.module), new.name)
