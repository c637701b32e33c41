"""The snapshot store: the connectors' part of each snapshot, beside Spark's checkpoint.

Every entry is one self-checking file: a header line (size, SHA-256, record count) and the
data, written to a temporary name, fsync'd once and moved into place, so an entry either
exists whole or not at all, and a torn or corrupt file is refused with a clear error instead
of being used. Protocol records that must never be overwritten (commit decisions) are
written with ``exclusive=True``: the first writer wins, a second one gets
:class:`EntryExistsError`.

A store may be *anchored* to the directory of the run's state (the job's live epoch): when
another driver takes the job over, that directory is moved, and every later read or write
through the old path fails with :class:`StateMovedError` instead of landing somewhere that
nobody reads. Paths go through ``pyarrow.fs`` when they are not local.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from epochal_sdk import FencedError, SnapshotError

MAGIC = b"EPS1 "
"""The first bytes of every entry file (format version 1)."""

_TMP = ".tmp-"


class EntryExistsError(FileExistsError):
    """An exclusive write found the entry already written (by another writer)."""


class StateMovedError(FencedError):
    """The run's state directory is gone: another driver took the job over (this run is
    fenced), or the job was cancelled."""


@dataclass(frozen=True)
class Manifest:
    """What an entry must look like: its size, checksum and how many records it holds."""

    size: int
    sha256: str
    count: int
    written: float


class SnapshotStore:
    """Entries (self-checking files) under one root directory.

    Args:
        root: a local path or a ``pyarrow.fs`` URI.
        anchor: a directory that must exist for any read or write (the run's state
            directory); when it is gone the store raises :class:`StateMovedError`.
    """

    def __init__(self, root: str, *, anchor: str | None = None) -> None:
        self.root = root.rstrip("/")
        if "://" in root:
            self.fs, self.base = pafs.FileSystem.from_uri(root)
        else:
            self.fs, self.base = pafs.LocalFileSystem(), os.path.abspath(root)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.anchor = (os.path.abspath(anchor) if self.local else anchor) if anchor else None

    def __repr__(self) -> str:
        return f"SnapshotStore({self.root!r})"

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def check_anchor(self) -> None:
        """Raise :class:`StateMovedError` if the run's state directory is gone."""
        if self.anchor is None or not self.local:
            return
        if not os.path.isdir(self.anchor):
            raise StateMovedError(
                f"the state directory {self.anchor} is gone: another driver took this job "
                "over (this run is fenced) or the job was cancelled; not reading or writing"
            )

    # -- raw files -------------------------------------------------------------------------
    def _write_raw(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        self.check_anchor()
        parent = path.rsplit("/", 1)[0]
        if self.local:
            os.makedirs(parent, exist_ok=True)
            self.check_anchor()  # the makedirs must not have re-created a moved directory
            tmp = f"{path}{_TMP}{uuid.uuid4().hex}"
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            try:
                if exclusive:
                    try:
                        os.link(tmp, path)  # fails if the entry exists: first writer wins
                    except FileExistsError:
                        raise EntryExistsError(path) from None
                else:
                    os.replace(tmp, path)
                    tmp = ""
            finally:
                if tmp:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
            return
        self.fs.create_dir(parent, recursive=True)
        if exclusive and self._exists(path):
            raise EntryExistsError(path)
        tmp = f"{path}{_TMP}{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)

    def _read_raw(self, path: str) -> bytes:
        self.check_anchor()
        with self.fs.open_input_stream(path) as src:
            return src.read()

    def _exists(self, path: str) -> bool:
        if self.local:
            return os.path.exists(path)
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    # -- entries ---------------------------------------------------------------------------
    def write(self, key: str, data: bytes, *, count: int = 0, exclusive: bool = False) -> Manifest:
        """Write an entry in one file (one fsync). With ``exclusive`` an existing entry is
        never replaced: :class:`EntryExistsError` says another writer was first."""
        manifest = Manifest(len(data), hashlib.sha256(data).hexdigest(), count, time.time())
        header = json.dumps(manifest.__dict__, sort_keys=True).encode()
        self._write_raw(self._path(key), MAGIC + header + b"\n" + data, exclusive=exclusive)
        return manifest

    def _load(self, key: str) -> tuple[Manifest, bytes] | None:
        try:
            raw = self._read_raw(self._path(key))
        except FileNotFoundError:
            self.check_anchor()
            return None
        head, sep, data = raw.partition(b"\n")
        if not head.startswith(MAGIC) or not sep:
            raise SnapshotError(
                f"snapshot entry {key!r} in {self.root} is not an epochal entry (no header): "
                "it was written by something else or torn. Refusing to use it; restore the "
                "file or cancel the job to start over."
            )
        try:
            manifest = Manifest(**json.loads(head[len(MAGIC) :]))
        except (ValueError, TypeError) as exc:
            raise SnapshotError(
                f"snapshot entry {key!r} in {self.root}: its header is corrupt ({exc}). "
                "The snapshot cannot be trusted; cancel the job to start over."
            ) from exc
        return manifest, data

    def manifest(self, key: str) -> Manifest | None:
        """The header of an entry, or None if the entry does not exist."""
        loaded = self._load(key)
        return loaded[0] if loaded else None

    def exists(self, key: str) -> bool:
        """Whether the entry exists."""
        self.check_anchor()
        return self._exists(self._path(key))

    def read(self, key: str) -> bytes:
        """The entry's data, verified against its header."""
        loaded = self._load(key)
        if loaded is None:
            raise SnapshotError(f"snapshot entry {key!r} is missing from {self.root}")
        manifest, data = loaded
        problem = _mismatch(manifest, data)
        if problem:
            raise SnapshotError(
                f"snapshot entry {key!r} in {self.root} is corrupt: {problem}. "
                "Refusing to use it; restore the file or cancel the job to start over."
            )
        return data

    def write_json(
        self, key: str, value: Any, *, count: int = 0, exclusive: bool = False
    ) -> Manifest:
        """Write a JSON entry."""
        data = json.dumps(value, sort_keys=True).encode()
        return self.write(key, data, count=count, exclusive=exclusive)

    def read_json(self, key: str) -> Any:
        """Read a JSON entry (verified)."""
        return json.loads(self.read(key))

    def list(self, prefix: str) -> list[str]:
        """Keys of the existing entries directly under ``prefix`` (sorted)."""
        self.check_anchor()
        path = self._path(prefix)
        if self.local:
            try:
                names = os.listdir(path)
            except (FileNotFoundError, NotADirectoryError):
                self.check_anchor()
                return []
            return sorted(
                f"{prefix}/{n}" for n in names if _TMP not in n and os.path.isfile(f"{path}/{n}")
            )
        info = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(
            f"{prefix}/{item.path.rsplit('/', 1)[-1]}"
            for item in info
            if item.type == pafs.FileType.File and _TMP not in item.path
        )

    def delete(self, key: str) -> None:
        """Delete an entry (gone is fine)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._path(key))

    def delete_tree(self, prefix: str = "") -> None:
        """Delete everything under ``prefix`` (the whole store when empty)."""
        path = self._path(prefix)
        if self._exists(path):
            self.fs.delete_dir(path)

    def verify(self, prefix: str = "") -> tuple[int, list[str]]:
        """Check every entry under ``prefix``; return (entries checked, problems found)."""
        selector = pafs.FileSelector(self._path(prefix), recursive=True, allow_not_found=True)
        checked, problems = 0, []
        for item in self.fs.get_file_info(selector):
            if item.type != pafs.FileType.File or _TMP in item.path:
                continue
            key = item.path[len(self.base) + 1 :]
            checked += 1
            try:
                self.read(key)
            except SnapshotError as exc:
                problems.append(str(exc))
        return checked, problems


def _mismatch(manifest: Manifest, data: bytes) -> str:
    if len(data) != manifest.size:
        return f"size {len(data)} bytes, header says {manifest.size}"
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.sha256:
        return f"checksum {digest[:12]}…, header says {manifest.sha256[:12]}…"
    return ""


def put_record(store: SnapshotStore, key: str, value: Any) -> None:
    """Replace a mutable record (job record, lease) in one atomic file that carries its own
    checksum, so a torn write is detected rather than half-read."""
    body = json.dumps(value, sort_keys=True)
    envelope = {"sha256": hashlib.sha256(body.encode()).hexdigest(), "body": body}
    store._write_raw(store._path(key), json.dumps(envelope).encode())


def get_record(store: SnapshotStore, key: str) -> Any | None:
    """A record written by :func:`put_record`, or None if there is none."""
    try:
        raw = store._read_raw(store._path(key))
    except FileNotFoundError:
        return None
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if hashlib.sha256(body.encode()).hexdigest() != envelope["sha256"]:
            raise ValueError("checksum mismatch")
        return json.loads(body)
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"record {key!r} in {store.root} is corrupt ({exc})") from exc
