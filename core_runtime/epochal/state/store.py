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
nobody reads.

Paths go through ``pyarrow.fs`` when they are not local, except ``s3://`` (and ``s3a://``),
which go through :mod:`epochal.state.objectstore`: S3's conditional writes make ``exclusive`` an
atomic create-if-absent there (``If-None-Match``), and records can be swapped with a
compare-and-swap (:func:`get_versioned_record`, :func:`put_versioned_record`). An object store
cannot move a directory, so there every epoch's state lives at one shared prefix
(:func:`~epochal.state.objectstore.shared_state_dir`) and an anchored store is fenced by the lease:
each write and delete first checks that the job's lease still shows the anchor's epoch.
``hdfs://`` goes through :mod:`epochal.state.webhdfs` with the same layout and the same
contract: create-if-absent and compare-and-swap built from the NameNode's atomic renames.
Other ``pyarrow.fs`` file systems (GCS, …) have no conditional writes here: an exclusive
write is a check, then a write.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epochal.base import files
from epochal.state import objectstore, webhdfs
from epochal.state.layout import LEASE_RECORD
from epochal.state.lease.record import Lease
from epochal_sdk import SnapshotError
from epochal_sdk.errors import FencedError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

MAGIC = b"EPS1 "
"""The first bytes of every entry file (format version 1)."""

_TMP = files.TMP_MARKER


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
        root: a local path, an ``s3://`` or ``hdfs://`` URI or another ``pyarrow.fs`` URI.
        anchor: a directory that must exist for any read or write (the run's state
            directory); when it is gone the store raises :class:`StateMovedError`. On an
            object store the anchor is an epoch's directory ``<job>/epochs/<n>``: the store
            then lives at the job's shared state prefix, and every write and delete first
            checks that the job's lease still shows epoch ``n``.
    """

    def __init__(self, root: str, *, anchor: str | None = None) -> None:
        self.root = root.rstrip("/")
        self.objects: objectstore.ObjectStore | webhdfs.HdfsStore | None = None
        self._lease_key: str | None = None
        self._anchor_epoch = 0
        if objectstore.has_conditional_writes(root):
            self._init_object_store(anchor)
            return
        # a local root goes through the os module: a Spark worker that only plans or commits
        # on local disk never imports pyarrow (0.1 s of CPU in each such process)
        self.fs: pafs.FileSystem | None = None
        self.base = os.path.abspath(root)
        self.local = True
        if "://" in root:
            import pyarrow.fs as pafs

            fs, self.base = pafs.FileSystem.from_uri(root)
            self.local = isinstance(fs, pafs.LocalFileSystem)
            self.fs = None if self.local else fs
        self.anchor = (os.path.abspath(anchor) if self.local else anchor) if anchor else None

    def _init_object_store(self, anchor: str | None) -> None:
        """An ``s3://`` or ``hdfs://`` root. Anchored to an epoch's directory
        ``<job>/epochs/<n>``, the store lives at the job's shared state prefix and checks the
        lease's epoch."""
        root = self.root
        self.anchor = anchor.rstrip("/") if anchor else None
        if self.anchor:
            leased = objectstore.epoch_of(self.anchor)
            if leased is not None and (root == self.anchor or root.startswith(self.anchor + "/")):
                job, self._anchor_epoch = leased
                root = objectstore.shared_state_dir(self.anchor) + root[len(self.anchor) :]
                self._lease_key = _split(f"{job}/{LEASE_RECORD}")[1]
        bucket, prefix = _split(root)
        self.objects = (
            webhdfs.HdfsStore(bucket) if webhdfs.is_hdfs(root) else objectstore.ObjectStore(bucket)
        )
        self.fs = None
        self.local = False
        self.base = f"{bucket}/{prefix}".rstrip("/")

    def __repr__(self) -> str:
        return f"SnapshotStore({self.root!r})"

    @property
    def conditional(self) -> bool:
        """Whether records can be swapped with a compare-and-swap (S3 or HDFS)."""
        return self.objects is not None

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def _remote(self) -> pafs.FileSystem:
        """The ``pyarrow.fs`` file system of a root that is neither local nor on an object
        store (a local root goes through the os module, an object store through
        :attr:`objects`)."""
        if self.fs is None:
            raise RuntimeError(f"{self!r} has no pyarrow file system (a local or object store)")
        return self.fs

    def _key(self, path: str) -> str:
        """The object key of a path (``<bucket>/<key>``) of this store."""
        assert self.objects is not None
        return path[len(self.objects.bucket) + 1 :]

    def check_anchor(self) -> None:
        """Raise :class:`StateMovedError` if the run's state directory is gone (on an object
        store: the job's lease no longer shows the anchor's epoch)."""
        if self.anchor is None:
            return
        if self.objects is not None:
            self._check_lease()
            return
        if not self.local:
            return
        if not os.path.isdir(self.anchor):
            raise StateMovedError(
                f"the state directory {self.anchor} is gone: another driver took this job "
                "over (this run is fenced) or the job was cancelled; not reading or writing"
            )

    def _check_lease(self) -> None:
        if self._lease_key is None or self.objects is None:
            return
        try:
            record = _decode_record(self.objects.get(self._lease_key).data, LEASE_RECORD, self.root)
        except FileNotFoundError:
            record = None
        state = Lease.from_record(record).state if record else None
        if state != self._anchor_epoch:
            raise StateMovedError(
                f"the state of lease epoch {self._anchor_epoch} ({self.anchor}) is no longer "
                f"the job's: its lease is at epoch {state}. Another driver took this job over "
                "(this run is fenced) or the job was cancelled; not writing"
            )

    # -- raw files -------------------------------------------------------------------------
    def _write_raw(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        self.check_anchor()
        if self.objects is not None:  # one PUT is atomic; If-None-Match makes it exclusive
            try:
                self.objects.put(self._key(path), data, create_only=exclusive)
            except objectstore.PreconditionFailedError:
                raise EntryExistsError(path) from None
            return
        parent = path.rsplit("/", 1)[0]
        if self.local:
            files.makedirs(parent)
            self.check_anchor()  # the makedirs must not have re-created a moved directory
            try:
                files.write_whole(path, data, exclusive=exclusive)
            except FileExistsError:
                raise EntryExistsError(path) from None
            return
        fs = self._remote()
        fs.create_dir(parent, recursive=True)
        if exclusive and self._exists(path):
            raise EntryExistsError(path)
        tmp = f"{path}{_TMP}{uuid.uuid4().hex}"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)

    def _read_raw(self, path: str) -> bytes:
        if self.objects is not None:  # a fenced run reads, but cannot write (see the doc)
            return self.objects.get(self._key(path)).data
        self.check_anchor()
        if self.local:
            with open(path, "rb") as local:
                return local.read()
        with self._remote().open_input_stream(path) as src:
            return src.read()

    def _exists(self, path: str) -> bool:
        if self.objects is not None:
            return self.objects.exists(self._key(path))
        if self.local:
            return os.path.exists(path)
        import pyarrow.fs as pafs

        return self._remote().get_file_info(path).type != pafs.FileType.NotFound

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
        if self.objects is None:
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
        path = self._path(prefix)
        if self.objects is not None:
            names, _ = self.objects.children(self._key(path))
            return sorted(f"{prefix}/{n}" for n in names if _TMP not in n)
        self.check_anchor()
        if self.local:
            try:
                names = os.listdir(path)
            except (FileNotFoundError, NotADirectoryError):
                self.check_anchor()
                return []
            return sorted(
                f"{prefix}/{n}" for n in names if _TMP not in n and os.path.isfile(f"{path}/{n}")
            )
        import pyarrow.fs as pafs

        info = self._remote().get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(
            f"{prefix}/{item.path.rsplit('/', 1)[-1]}"
            for item in info
            if item.type == pafs.FileType.File and _TMP not in item.path
        )

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Names of the directories directly under ``prefix`` (sorted)."""
        path = self._path(prefix)
        if self.objects is not None:
            return sorted(self.objects.children(self._key(path))[1])
        if self.local:
            try:
                return sorted(entry.name for entry in os.scandir(path) if entry.is_dir())
            except (FileNotFoundError, NotADirectoryError):
                return []
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(path, allow_not_found=True)
        return sorted(
            info.path.rsplit("/", 1)[-1]
            for info in self._remote().get_file_info(selector)
            if info.type == pafs.FileType.Directory
        )

    def delete(self, key: str) -> None:
        """Delete an entry (gone is fine). On an object store an anchored (fenced) store
        refuses to: the state there is shared with the run that took the job over."""
        if self.objects is not None:
            self.check_anchor()
            self.objects.delete(self._key(self._path(key)))
            return
        with contextlib.suppress(FileNotFoundError):
            if self.local:
                os.unlink(self._path(key))
            else:
                self._remote().delete_file(self._path(key))

    def delete_tree(self, prefix: str = "") -> None:
        """Delete everything under ``prefix`` (the whole store when empty)."""
        path = self._path(prefix)
        if self.objects is not None:
            self.check_anchor()
            self.objects.delete_tree(self._key(path))
            return
        if self.local:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(path)
        elif self._exists(path):
            self._remote().delete_dir(path)

    def _files(self, prefix: str, skip: tuple[str, ...] = ()) -> builtins.list[str]:
        """Paths of every file under ``prefix`` (recursively), but those under the directories
        ``skip`` names (directly under the store's root; they are not listed either)."""
        path = self._path(prefix)
        if skip and not prefix:
            names, directories = self._children("")
            found = [self._path(name) for name in names]
            for directory in directories:
                if directory not in skip:
                    found += self._files(directory)
            return found
        if self.objects is not None:
            return [f"{self.objects.bucket}/{k}" for k in self.objects.walk(self._key(path))]
        if self.local:
            return [
                os.path.join(directory, name)
                for directory, _, names in os.walk(path)
                for name in names
            ]
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        files = self._remote().get_file_info(selector)
        return [i.path for i in files if i.type == pafs.FileType.File]

    def _children(self, prefix: str) -> tuple[builtins.list[str], builtins.list[str]]:
        """The names of the files and of the directories directly under ``prefix``."""
        if self.objects is not None:
            names, directories = self.objects.children(self._key(self._path(prefix)))
            return sorted(n for n in names if _TMP not in n), sorted(directories)
        directories = self.list_dirs(prefix)
        return [key.rsplit("/", 1)[1] for key in self.list(prefix)], directories

    def verify(
        self, prefix: str = "", skip: tuple[str, ...] = ()
    ) -> tuple[int, builtins.list[str]]:
        """Check every entry under ``prefix`` (but those under the top directories ``skip``
        names); return (entries checked, problems found)."""
        checked, problems = 0, []
        for path in self._files(prefix, skip):
            if _TMP in path:
                continue
            key = path[len(self.base) + 1 :]
            checked += 1
            try:
                self.read(key)
            except SnapshotError as exc:
                problems.append(str(exc))
        return checked, problems


def _split(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://`` URI, ``(namenode, path)`` of an ``hdfs://`` one."""
    return webhdfs.split_uri(uri) if webhdfs.is_hdfs(uri) else objectstore.split_uri(uri)


def _mismatch(manifest: Manifest, data: bytes) -> str:
    if len(data) != manifest.size:
        return f"size {len(data)} bytes, header says {manifest.size}"
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.sha256:
        return f"checksum {digest[:12]}…, header says {manifest.sha256[:12]}…"
    return ""


def _encode_record(value: Any) -> bytes:
    body = json.dumps(value, sort_keys=True)
    envelope = {"sha256": hashlib.sha256(body.encode()).hexdigest(), "body": body}
    return json.dumps(envelope).encode()


def _decode_record(raw: bytes, key: str, where: str) -> Any:
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if hashlib.sha256(body.encode()).hexdigest() != envelope["sha256"]:
            raise ValueError("checksum mismatch")
        return json.loads(body)
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"record {key!r} in {where} is corrupt ({exc})") from exc


def put_record(store: SnapshotStore, key: str, value: Any) -> None:
    """Replace a mutable record (job record, lease) in one atomic file that carries its own
    checksum, so a torn write is detected rather than half-read."""
    store._write_raw(store._path(key), _encode_record(value))


def get_record(store: SnapshotStore, key: str) -> Any | None:
    """A record written by :func:`put_record`, or None if there is none."""
    try:
        raw = store._read_raw(store._path(key))
    except FileNotFoundError:
        return None
    return _decode_record(raw, key, store.root)


class RecordChangedError(Exception):
    """A compare-and-swap of a record lost: another writer changed (or created) it since it
    was read. Read it again and decide again."""


def get_versioned_record(store: SnapshotStore, key: str) -> tuple[Any | None, str | None]:
    """A record and its version (for :func:`put_versioned_record`); ``(None, None)`` when
    there is none. Stores with conditional writes only (:attr:`SnapshotStore.conditional`)."""
    assert store.objects is not None, "versioned records need conditional writes"
    try:
        found = store.objects.get(store._key(store._path(key)))
    except FileNotFoundError:
        return None, None
    return _decode_record(found.data, key, store.root), found.etag


def put_versioned_record(store: SnapshotStore, key: str, value: Any, version: str | None) -> str:
    """Write a record only if it is still at ``version`` (``None``: only if there is none
    yet): a compare-and-swap. Returns the new version; raises :class:`RecordChangedError`
    when another writer was first. ``value`` must differ from every earlier value (carry a
    time stamp or a counter): versions are content digests on S3."""
    assert store.objects is not None, "versioned records need conditional writes"
    store.check_anchor()
    try:
        return store.objects.put(
            store._key(store._path(key)),
            _encode_record(value),
            create_only=version is None,
            if_match=version,
        )
    except objectstore.PreconditionFailedError as exc:
        raise RecordChangedError(f"record {key!r} in {store.root} changed meanwhile") from exc
