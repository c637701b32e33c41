"""The job directory's lock files (a local file system: the record and the lease are swapped
under them; an object store swaps them with conditional writes instead) and the errors of a
job's directory."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator

from epochal.base import files
from epochal_sdk import EpochalError

SWAP_ATTEMPTS = 50
"""How often a compare-and-swap of the lease or the job record is tried before giving up."""
STALE_LOCK_SECONDS = 30.0
"""A lock file this old was left by a killed process (or a holder paused this long) and is
broken."""


class JobError(EpochalError):
    """A job cannot be found, taken or run as asked."""


@contextlib.contextmanager
def locked(path: str, what: str, job: str, *, local: bool) -> Iterator[Callable[[], None]]:
    """Hold the job's ``what`` lock (a file created exclusively, holding a token of this
    holder); yields a check that raises ``JobError`` when the lock is no longer ours.

    A lock older than :data:`STALE_LOCK_SECONDS` is taken for one a killed process left
    and broken, so a holder paused that long loses it: it checks right before it writes,
    and never removes a lock that is not its own."""
    if not local:
        yield lambda: None
        return
    directory = path
    files.makedirs(directory)
    path = os.path.join(directory, f".{what}.lock")
    token = f"{os.getpid()}-{uuid.uuid4().hex}".encode()
    deadline = time.monotonic() + STALE_LOCK_SECONDS
    while True:
        try:
            fd = files.create(path, exclusive=True)
            os.write(fd, token)
            break
        except FileExistsError:
            try:
                if time.time() - os.path.getmtime(path) > STALE_LOCK_SECONDS:
                    os.unlink(path)  # left by a killed (or long paused) process
                    continue
            except FileNotFoundError:
                continue
            if time.monotonic() > deadline:
                raise JobError(f"job {job!r}: {path} stays locked") from None
            time.sleep(0.01)

    def ours() -> bool:
        try:
            with open(path, "rb") as fh:
                return fh.read() == token
        except FileNotFoundError:
            return False

    def still_locked() -> None:
        if not ours():
            raise JobError(
                f"job {job!r}: the {what} lock was taken from this process (it was "
                f"held for more than {STALE_LOCK_SECONDS:.0f}s: paused?); nothing written"
            )

    try:
        yield still_locked
    finally:
        os.close(fd)
        if ours():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
