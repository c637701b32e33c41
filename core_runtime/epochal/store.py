"""The snapshot store: the connectors' part of each snapshot, beside Spark's checkpoint.

Every entry is a data file plus a manifest (size, SHA-256, record count). An entry exists once
its manifest exists; a data file without a manifest is an interrupted write and is ignored.
Reads verify the checksum, so corrupt or missing data is refused with a clear error instead of
being used. Paths go through ``pyarrow.fs``: a local path works today, HDFS or S3 later.
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

from epochal_sdk import SnapshotError

MANIFEST = ".manifest"


@dataclass(frozen=True)
class Manifest:
    """What an entry must look like: its size, checksum and how many records it holds."""

    size: int
    sha256: str
    count: int
    written: float


class SnapshotStore:
    """Entries (bytes with manifests) under one root directory."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        if "://" in root:
            self.fs, self.base = pafs.FileSystem.from_uri(root)
        else:
            self.fs, self.base = pafs.LocalFileSystem(), os.path.abspath(root)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"SnapshotStore({self.root!r})"

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def _write_raw(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        if self.local:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        self.fs.move(tmp, path)

    def _read_raw(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as src:
            return src.read()

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    # -- entries ---------------------------------------------------------------------------
    def write(self, key: str, data: bytes, *, count: int = 0) -> Manifest:
        """Write an entry: the data first, then its manifest (which makes it exist)."""
        manifest = Manifest(len(data), hashlib.sha256(data).hexdigest(), count, time.time())
        self._write_raw(self._path(key), data)
        self._write_raw(self._path(key) + MANIFEST, json.dumps(manifest.__dict__).encode())
        return manifest

    def manifest(self, key: str) -> Manifest | None:
        """The manifest of an entry, or None if the entry does not exist."""
        path = self._path(key) + MANIFEST
        try:
            raw = self._read_raw(path)
        except FileNotFoundError:
            return None
        try:
            return Manifest(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise SnapshotError(
                f"snapshot entry {key!r} in {self.root}: its manifest is corrupt ({exc}). "
                "The snapshot cannot be trusted; cancel the job to start over."
            ) from exc

    def exists(self, key: str) -> bool:
        """Whether the entry exists (its manifest was written)."""
        return self._exists(self._path(key) + MANIFEST)

    def read(self, key: str) -> bytes:
        """The entry's data, verified against its manifest."""
        manifest = self.manifest(key)
        if manifest is None:
            raise SnapshotError(f"snapshot entry {key!r} is missing from {self.root}")
        try:
            data = self._read_raw(self._path(key))
        except FileNotFoundError:
            raise SnapshotError(
                f"snapshot entry {key!r} in {self.root}: the manifest exists but the data is "
                "missing. The snapshot is incomplete; refusing to use it."
            ) from None
        problem = _mismatch(manifest, data)
        if problem:
            raise SnapshotError(
                f"snapshot entry {key!r} in {self.root} is corrupt: {problem}. "
                "Refusing to use it; restore the file or cancel the job to start over."
            )
        return data

    def write_json(self, key: str, value: Any, *, count: int = 0) -> Manifest:
        """Write a JSON entry."""
        return self.write(key, json.dumps(value, sort_keys=True).encode(), count=count)

    def read_json(self, key: str) -> Any:
        """Read a JSON entry (verified)."""
        return json.loads(self.read(key))

    def list(self, prefix: str) -> list[str]:
        """Keys of the existing entries directly under ``prefix`` (sorted)."""
        info = self.fs.get_file_info(pafs.FileSelector(self._path(prefix), allow_not_found=True))
        keys = []
        for item in info:
            name = item.path.rsplit("/", 1)[-1]
            if name.endswith(MANIFEST):
                keys.append(f"{prefix}/{name[: -len(MANIFEST)]}")
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Delete an entry (manifest first, so a half-deleted entry reads as absent)."""
        for path in (self._path(key) + MANIFEST, self._path(key)):
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(path)

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
            if not item.path.endswith(MANIFEST):
                continue
            key = item.path[len(self.base) + 1 : -len(MANIFEST)]
            checked += 1
            try:
                self.read(key)
            except SnapshotError as exc:
                problems.append(str(exc))
        return checked, problems


def _mismatch(manifest: Manifest, data: bytes) -> str:
    if len(data) != manifest.size:
        return f"size {len(data)} bytes, manifest says {manifest.size}"
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.sha256:
        return f"checksum {digest[:12]}…, manifest says {manifest.sha256[:12]}…"
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
