"""Log files that stay within a size however long a job runs: a log rotates at ``max_bytes``
(``<log>`` is written, ``<log>.1`` is the part before it, ... up to ``<log>.<backups>``), and
the logs of ended drivers are pruned to the newest few (:func:`keep_newest`). Files are owner-
only (:mod:`epochal.base.files`). The bounds a job uses are :mod:`epochal.state.retention`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import threading
from collections.abc import Iterable

from epochal.base import files


def rotate(path: str, backups: int) -> None:
    """Move ``path`` to ``path.1`` (``.1`` to ``.2`` ..., the oldest beyond ``backups``
    dropped). A writer that still has ``path`` open goes on writing into ``path.1``."""
    for number in range(backups - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}.{number}", f"{path}.{number + 1}")
    if backups > 0:
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, f"{path}.1")
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def parts(path: str) -> list[str]:
    """The files of the log ``path`` that exist: itself and its rotated parts, newest first."""
    found = [path] if os.path.exists(path) else []
    numbered = []
    for name in glob.glob(glob.escape(path) + ".*"):
        suffix = name[len(path) + 1 :]
        if suffix.isdigit():
            numbered.append((int(suffix), name))
    return found + [name for _, name in sorted(numbered)]


class RotatingLog:
    """A log that one process writes (from any of its threads), rotated at ``max_bytes``.

    Args:
        path: the log file (created owner-only; written from its end when it exists).
        max_bytes: the size at which it rotates (a line is never split across parts).
        backups: how many rotated parts are kept.
    """

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._lock = threading.Lock()
        files.makedirs(os.path.dirname(path) or ".")
        self._file = files.open_private(path, "a")
        self._size = self._file.tell()
        self._closed = False

    def write(self, text: str) -> None:
        """Append ``text`` (whole lines); rotate first if it would pass the size."""
        with self._lock:
            if self._closed:
                return
            if self._size and self._size + len(text) > self.max_bytes:
                self._file.close()
                rotate(self.path, self.backups)
                self._file = files.open_private(self.path, "a")
                self._size = 0
            self._file.write(text)
            self._file.flush()
            self._size += len(text)

    def close(self) -> None:
        """Close the file (later writes are dropped)."""
        with self._lock:
            self._closed = True
            self._file.close()


def append_line(path: str, line: str, max_bytes: int, backups: int) -> None:
    """Append one line to a log that several processes write, rotating it first (under a
    lock file beside it) when it has reached ``max_bytes``."""
    files.makedirs(os.path.dirname(path) or ".")
    with contextlib.suppress(FileNotFoundError):
        if os.path.getsize(path) >= max_bytes:
            descriptor = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, files.FILE_MODE)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                if os.path.getsize(path) >= max_bytes:  # not rotated by another process
                    rotate(path, backups)
            finally:
                os.close(descriptor)
    with files.open_private(path, "a") as fh:
        fh.write(line if line.endswith("\n") else line + "\n")


def keep_newest(paths: Iterable[str], keep: int) -> list[str]:
    """Delete all but the ``keep`` newest (by modification time) of ``paths``; returns what
    was deleted. A path that is gone meanwhile is skipped."""
    dated = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            dated.append((os.lstat(path).st_mtime, path))
    dated.sort(reverse=True)
    deleted = []
    for _, path in dated[keep:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            deleted.append(path)
    return deleted
