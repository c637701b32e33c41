"""A plain session is a full job without ``epochal.register``: the session check attaches itself
to a session when the session starts its first streaming query.

epochal's distribution installs ``epochal-attach.pth`` into site-packages; Python runs its one
line at every interpreter start, which calls :func:`install`. That imports nothing but this
module (the standard library only) and watches for PySpark's classic ``DataStreamWriter``
module: once something imports it, ``DataStreamWriter.start`` and ``toTable`` first add the
session check to their session (:func:`epochal.spark.datasource.attach`: the listener that
``epochal.register`` adds), then start the query as before. The check then gives a query whose
epochal formats Spark found by itself what it gives one of a session that called
``register``: the job's lease held by this driver and its query fence, a new run at each
start, the job's progress and metrics after each batch, ``COMPLETED`` at the end of a finished
available-now run, and Spark's own parts judged against the job's guarantee. It does nothing
for a query without an epochal part (the check looks and leaves it alone), in a driver of
``epochal run`` (its supervisor does all of that), or on Spark Connect (no JVM here).

``EPOCHAL_ATTACH=0`` in the environment turns it off. Nothing here may break an interpreter
or a query: every failure is swallowed (and logged at debug level once epochal runs).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from epochal.base.switches import SwitchError, env_switch

ENV = "EPOCHAL_ATTACH"
"""A switch (:func:`epochal.base.switches.env_switch`), on unless set off (``0``)."""
WRITER_MODULE = "pyspark.sql.streaming.readwriter"
"""PySpark classic's module of ``DataStreamWriter``."""
STARTS = ("start", "toTable")
"""The methods of ``DataStreamWriter`` that start a query."""
_PATCHED = "_epochal_attaches"


def enabled() -> bool:
    """Whether the environment leaves the attachment on (a value that is neither on nor off
    leaves it on, with a warning: nothing here may break an interpreter)."""
    try:
        return env_switch(ENV, True)
    except SwitchError as exc:
        warnings.warn(f"{exc}; epochal attaches its session check", stacklevel=2)
        return True


def install() -> None:
    """Watch for PySpark's ``DataStreamWriter`` (patched at once if it is imported already).
    Called by ``epochal-attach.pth`` at interpreter start; never raises."""
    try:
        if not enabled():
            return
        module = sys.modules.get(WRITER_MODULE)
        if module is not None:
            patch(module)
        elif not any(isinstance(f, _WriterFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _WriterFinder())
    except Exception:  # an interpreter must start whatever happens here
        return


def patch(module: ModuleType) -> None:
    """Make the query starts of ``module.DataStreamWriter`` attach the session check first."""
    writer = getattr(module, "DataStreamWriter", None)
    if writer is None or getattr(writer, _PATCHED, False):
        return
    for name in STARTS:
        original = getattr(writer, name, None)
        if callable(original):
            setattr(writer, name, _attaching(original))
    setattr(writer, _PATCHED, True)


def _attaching(start: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(start)
    def attached_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        attach_to(getattr(self, "_spark", None))
        return start(self, *args, **kwargs)

    return attached_start


def attach_to(spark: Any) -> None:
    """Add the session check to ``spark`` (once; see the module doc). Never raises."""
    if spark is None or getattr(spark, "_jvm", None) is None or not enabled():
        return
    try:
        from epochal.spark.datasource import attach

        attach(spark)
    except Exception as exc:  # the query must start whatever happens here
        import logging

        logging.getLogger("epochal.attach").debug("epochal: session check not attached: %s", exc)


class _WriterFinder(importlib.abc.MetaPathFinder):
    """Finds PySpark's ``DataStreamWriter`` module as the other finders do, and patches it
    once it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != WRITER_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """Runs the module as its own loader does, then patches it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            patch(module)
        except Exception:  # PySpark must import whatever happens here
            return

    def __getattr__(self, name: str) -> Any:
        """Everything else (``get_source``, ``get_data``, ...) is the module's own loader's."""
        return getattr(self.loader, name)
