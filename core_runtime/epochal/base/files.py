"""Files epochal writes are its owner's only: directories 0700, files 0600, whatever the
process's umask (a job's records, lease, snapshot store, logs and metrics name its sources,
sinks and data; see docs/how-to/deployment.md for who may write the snapshot directory)."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600


def makedirs(path: str) -> None:
    """Create ``path`` and its missing parents, each owner-only (existing ones are left as
    they are; ``os.makedirs`` gives its mode to the last one only)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise


def create(path: str, *, exclusive: bool = False) -> int:
    """A new (or truncated) file, owner-only, opened for writing: its descriptor.
    ``exclusive``: fail with ``FileExistsError`` if it exists."""
    flags = os.O_CREAT | os.O_WRONLY | (os.O_EXCL if exclusive else os.O_TRUNC)
    return os.open(path, flags, FILE_MODE)


TMP_MARKER = ".tmp-"
"""In the name of a file :func:`write_whole` is still writing (listings skip those)."""


def write_whole(path: str, data: bytes, *, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one,
    never a part (a temporary file, synced, then renamed or linked into place).
    ``exclusive``: fail with ``FileExistsError`` if ``path`` exists (the first writer wins;
    a hard link, unlike a rename, does not replace)."""
    tmp = f"{path}{TMP_MARKER}{uuid.uuid4().hex}"
    with os.fdopen(create(tmp), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    try:
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
            tmp = ""
    finally:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def open_private(path: str, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for writing or appending, the file owner-only if it is new."""
    flags = os.O_CREAT | os.O_WRONLY | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return open(os.open(path, flags, FILE_MODE), mode, **kwargs)


def private_process() -> None:
    """Make what this process (and the processes it starts: a driver's JVM and Python
    workers) creates from here on owner-only (umask 077)."""
    os.umask(0o077)
