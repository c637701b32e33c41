"""Steps of a connector run in a process that dies the moment they returned, as the process a
task or a driver runs in does when it is killed (the contract checks of
:mod:`epochal.testing.contract_checks` play their crashes with it).

:func:`run_then_die` runs a step (a module-level function) in a fresh child process, sends
its result back and ends the child with ``os._exit``: no ``close``, no ``finally`` of the
caller, no interpreter clean-up, as SIGKILL leaves it (the kernel closes its files and
sockets, so a broker sees the connection drop). Whatever the step kept in memory (a module's
dictionary, an object's buffer, a thread that had not run yet) is gone; what the next objects
of this process find is what the step made durable.

The children are forked from a ``forkserver`` (one per process, started on first use from a
fresh interpreter, with the runtime and the installed connector modules imported): a child
starts in milliseconds, never inherits this process's threads or client connections, and
takes this process's environment (``EPOCHAL_PLUGINS``, ``${env:...}`` references) and
``sys.path`` as they are at the call.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import multiprocessing
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from epochal_sdk.hookspecs import ENTRY_POINT_GROUP

STEP_TIMEOUT = 300.0
"""Seconds a step may take before its process is killed and the check fails (a step talks
to a real server, on a loaded 2-core machine)."""

_PRELOAD = [
    "epochal.testing.crashing",
    "epochal.protocols.acking",
    "epochal.protocols.keys",
    "epochal.testing.contract_checks",
    "pyarrow",
    "pandas",
]
"""What the forkserver imports once, so that no step imports it again: the contract checks'
steps and pyarrow with pandas (``RecordBatch.from_pylist`` imports pandas on first use: 0.3-0.9
CPU s in every child otherwise). A module that is not installed is skipped."""
_lock = threading.Lock()
_context: Any = None


class StepFailedError(Exception):
    """The step raised in its process; the message carries the error and its traceback."""


def _forkserver() -> Any:
    global _context
    with _lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            connectors = [
                ep.module for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            ]
            context.set_forkserver_preload([*_PRELOAD, *connectors])
            _context = context
    return _context


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Keep multiprocessing from running this process's ``__main__`` again in the child (its
    rule for spawned processes, which the forkserver keeps): a step is a function of an
    importable module and needs none of it, and a main script may be slow to import, or
    not a file at all (``python -``)."""
    main = sys.modules["__main__"]
    saved: dict[str, object] = {
        k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__
    }
    with _lock:
        main.__dict__["__spec__"] = None
        main.__dict__.pop("__file__", None)
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def run_then_die(step: Callable[[dict[str, Any]], Any], request: dict[str, Any]) -> Any:
    """``step(request)`` in a child process that ends without any clean-up once it returned;
    its (picklable) result. A step that raised raises :class:`StepFailedError` here; a child
    that neither answers nor ends within :data:`STEP_TIMEOUT` is killed."""
    context = _forkserver()
    receiver, sender = context.Pipe(duplex=False)
    env = dict(os.environ)
    child = context.Process(target=_child, args=(sender, step, request, env), daemon=True)
    with _main_module_hidden():
        child.start()
    sender.close()
    try:
        if not receiver.poll(STEP_TIMEOUT):
            child.kill()
            raise StepFailedError(f"{step.__name__} did not finish within {STEP_TIMEOUT:.0f} s")
        try:
            status, value = receiver.recv()
        except EOFError:
            raise StepFailedError(
                f"{step.__name__}: its process ended without an answer (exit code {child.exitcode})"
            ) from None
    finally:
        receiver.close()
        child.join(30)
    if status == "error":
        raise StepFailedError(value)
    return value


def _child(
    sender: Any, step: Callable[[dict[str, Any]], Any], request: dict[str, Any], env: dict
) -> None:
    """In the child: run the step, answer, and end at once (see the module doc)."""
    os.environ.clear()
    os.environ.update(env)
    try:
        answer: tuple[str, Any] = ("ok", step(request))
    except BaseException as exc:  # reported to the parent as text: it may not pickle
        answer = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
    try:
        sender.send(answer)
    except Exception as exc:  # an answer that does not pickle
        sender.send(("error", f"the answer of {step.__name__} cannot be sent back: {exc}"))
    os._exit(0)
