"""HDFS for snapshots, job records and leases, through the NameNode's WebHDFS REST API.

A snapshot directory ``hdfs://<namenode>:<port>/<path>`` keeps a job where S3 keeps it (see
:mod:`epochal.state.objectstore`): its record, its lease, the connectors' snapshot store and
Spark's checkpoint at the job's shared ``<job>/state`` prefix, fenced by the lease. Spark
reaches the checkpoint through its own Hadoop client (``hdfs://`` as it is); epochal talks
to the NameNode over HTTP (WebHDFS: no JVM, no libhdfs in Python) and builds what the lease
needs from two operations the NameNode orders, one at a time:

- **create-if-absent**: a complete temporary file renamed to its name without overwrite
  (``RENAME`` with ``renameoptions=NONE`` fails when the target exists): commit decisions,
  every entry written ``exclusive=True``, a job's first lease. Readers never see a partial
  file: every file is written whole under a hidden temporary name first.
- **compare-and-swap** of a record at a version: a file's version is its inode id
  (``fileId``), which a rename keeps and which the NameNode never reuses, so no version comes
  back (no ABA). To replace ``<dir>/<name>`` at version ``v`` a writer puts the new bytes in
  a fresh directory of ``<dir>/.epochal-swaps``, then renames that directory to the *claim*
  ``<name>.claim-<v>`` without overwrite: of the writers that read ``v`` exactly one gets the
  claim. It checks that the record is still at ``v`` and renames its file over the record
  (``renameoptions=OVERWRITE``). The record changes only through the claim of its current
  version, so a writer that finds the claim taken loses (it first finishes the winner's
  rename, in case the winner stopped between its claim and its rename: a claim's file moves
  at most once). Claims and temporary files older than :data:`SWEEP_AFTER` are swept.

Settings (none is a secret): ``EPOCHAL_WEBHDFS_URL``, the NameNode's HTTP address (default
``http://<host of the hdfs:// URI>:9870``, Hadoop's default port); ``HADOOP_USER_NAME`` (else
the process's user), sent as WebHDFS's ``user.name`` (simple authentication). The driver hands
both to the executors (:func:`spark_conf`). Kerberos (SPNEGO) and delegation tokens are not
supported here.

A NameNode that is down, restarting or in safe mode is waited for, up to
:data:`RETRY_SECONDS`, then the call fails with ``ConnectionError`` (an ``OSError``): a lease
renewal is then not done this round, a batch fails and is retried.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from epochal.state.objectstore import HDFS_SCHEME, PreconditionFailedError, Versioned
from epochal_sdk import ConfigError

if TYPE_CHECKING:
    import urllib.error

URL_ENV = "EPOCHAL_WEBHDFS_URL"
USER_ENV = "HADOOP_USER_NAME"
DEFAULT_HTTP_PORT = 9870
FORWARDED_ENV = (URL_ENV, USER_ENV)
"""Variables the driver hands on to the executors (only those that are set); none is a
secret."""
RETRY_SECONDS = 10.0
"""How long one call waits for a NameNode that is down, restarting or in safe mode (a lease
keeper's renewal waits as long: keep it below half the lease's TTL)."""
HTTP_TIMEOUT = 10.0
"""Seconds one HTTP request may take."""
SWAPS = ".epochal-swaps"
"""The hidden directory beside a swapped record that holds its claims and new versions."""
SWEEP_AFTER = 3600.0
"""Claims and temporary files older than this (seconds) are deleted by later swaps. A writer
paused for longer in the middle of its own swap may take an older claim for its own."""
_TMP = ".epochal-tmp-"
_TRANSIENT = (
    "SafeModeException",
    "RetriableException",
    "StandbyException",
    "ConnectException",
    "ObserverRetryOnActiveException",
    "IOException",  # a DataNode whose NameNode is away answers with a plain IOException
    "EOFException",  # ... or with the end of its connection to a NameNode that stopped
    "SocketException",
    "SocketTimeoutException",
    "ConnectTimeoutException",
    "NoRouteToHostException",
)


def is_hdfs(path: str) -> bool:
    """Whether ``path`` is an ``hdfs://`` URI."""
    return urlsplit(path).scheme.lower() == HDFS_SCHEME and "://" in path


def split_uri(uri: str) -> tuple[str, str]:
    """``hdfs://namenode:8020/some/path`` → ``("namenode:8020", "some/path")``."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != HDFS_SCHEME or not parts.netloc:
        raise ConfigError(
            "job",
            "snapshot_dir",
            f"{uri!r} is not an hdfs:// URI with a NameNode",
            "Write hdfs://<namenode>:<port>/<path> (the NameNode's RPC address, as Spark "
            "names it).",
        )
    if parts.query or "@" in parts.netloc:
        raise ConfigError(
            "job",
            "snapshot_dir",
            f"{uri!r} carries a user or options in the URI",
            f"Give the NameNode and the path only; the user comes from {USER_ENV}.",
        )
    return parts.netloc, parts.path.strip("/")


@dataclass(frozen=True)
class WebHdfsSettings:
    """How to reach the NameNode's WebHDFS: its HTTP address and the user to act as."""

    url: str
    user: str

    @classmethod
    def from_env(cls, authority: str, env: Mapping[str, str] | None = None) -> WebHdfsSettings:
        """The settings for the NameNode ``authority`` (``host:port`` of its RPC address)."""
        env = os.environ if env is None else env
        url = (env.get(URL_ENV) or "").strip().rstrip("/")
        if not url:
            host = authority.rsplit(":", 1)[0] if ":" in authority else authority
            url = f"http://{host}:{DEFAULT_HTTP_PORT}"
        return cls(url, (env.get(USER_ENV) or "").strip() or getpass.getuser())


def spark_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings that let the executors' Python workers reach WebHDFS as the driver does
    (they write key digests into the snapshot store): :data:`FORWARDED_ENV`, those set."""
    env = os.environ if env is None else env
    return {f"spark.executorEnv.{name}": env[name] for name in FORWARDED_ENV if env.get(name)}


@dataclass(frozen=True)
class _Status:
    file_id: int
    kind: str


class HdfsStore:
    """One HDFS namespace through WebHDFS. Keys are paths without the leading slash.

    ``bucket`` is the NameNode's ``host:port`` (a store's paths are ``<bucket>/<key>``, as on
    an object store).
    """

    def __init__(self, authority: str, settings: WebHdfsSettings | None = None) -> None:
        self.bucket = authority
        self.settings = settings or WebHdfsSettings.from_env(authority)
        self.retry_seconds = RETRY_SECONDS

    def __repr__(self) -> str:
        return f"HdfsStore({self.bucket!r})"

    # -- requests ---------------------------------------------------------------------------
    def _url(self, path: str, op: str, params: Mapping[str, str]) -> str:
        query = {"op": op, "user.name": self.settings.user, **params}
        encoded = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in query.items())
        return f"{self.settings.url}/webhdfs/v1{quote(path)}?{encoded}"

    def _call(
        self,
        method: str,
        path: str,
        op: str,
        params: Mapping[str, str] | None = None,
        *,
        data: bytes | None = None,
    ) -> bytes:
        """One WebHDFS call, repeated while the NameNode is away (up to the retry time).
        ``FileNotFoundError``, ``FileExistsError``; other refusals are ``OSError``."""
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.1
        while True:
            try:
                return self._once(method, path, op, params or {}, data)
            except _TransientError as exc:
                if time.monotonic() + delay > deadline:
                    raise ConnectionError(
                        f"HDFS at {self.settings.url}: {op} {path}: {exc} (for "
                        f"{self.retry_seconds:.0f}s)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _once(
        self, method: str, path: str, op: str, params: Mapping[str, str], data: bytes | None
    ) -> bytes:
        import urllib.error  # here: the Python processes of a query that never reach HDFS skip it

        url = self._url(path, op, params)
        try:
            if op == "CREATE":  # the NameNode names a DataNode; the bytes go there
                location = json.loads(_http("PUT", url + "&noredirect=true"))["Location"]
                return _http("PUT", location, data or b"")
            return _http(method, url, data)
        except urllib.error.HTTPError as exc:
            raise _refusal(exc, op, path) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise _TransientError(str(getattr(exc, "reason", exc))) from None

    def _status(self, path: str) -> _Status | None:
        try:
            found = json.loads(self._call("GET", path, "GETFILESTATUS"))["FileStatus"]
        except FileNotFoundError:
            return None
        return _Status(int(found["fileId"]), str(found["type"]))

    def _listing(self, path: str) -> list[dict[str, Any]]:
        try:
            listing = json.loads(self._call("GET", path, "LISTSTATUS"))
        except FileNotFoundError:
            return []
        return list(listing["FileStatuses"]["FileStatus"])

    def _write(self, path: str, data: bytes) -> int:
        """Write a whole file (a fresh name: overwritten if a retried attempt left it);
        returns its inode id."""
        self._call("PUT", path, "CREATE", {"overwrite": "true"}, data=data)
        status = self._status(path)
        if status is None:
            raise OSError(f"HDFS: {path} vanished right after it was written")
        return status.file_id

    def _rename(self, source: str, target: str, *, overwrite: bool) -> None:
        """Rename atomically; without ``overwrite`` a present target is ``FileExistsError``."""
        options = {"destination": target, "renameoptions": "OVERWRITE" if overwrite else "NONE"}
        self._call("PUT", source, "RENAME", options)

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("DELETE", path, "DELETE", {"recursive": "true"})

    # -- the store --------------------------------------------------------------------------
    def get(self, key: str) -> Versioned:
        """The file's bytes and version (its inode id); ``FileNotFoundError`` when absent."""
        path = "/" + key
        for _ in range(20):
            status = self._status(path)
            if status is None or status.kind != "FILE":
                raise FileNotFoundError(f"hdfs://{self.bucket}{path}")
            try:  # the inode itself: the bytes are of exactly that version
                data = self._call("GET", f"/.reserved/.inodes/{status.file_id}", "OPEN")
            except FileNotFoundError:
                continue  # replaced meanwhile: read the new version
            return Versioned(data, str(status.file_id))
        raise OSError(f"HDFS: hdfs://{self.bucket}{path} kept changing while it was read")

    def exists(self, key: str) -> bool:
        """Whether the file exists."""
        status = self._status("/" + key)
        return status is not None and status.kind == "FILE"

    def put(
        self, key: str, data: bytes, *, create_only: bool = False, if_match: str | None = None
    ) -> str:
        """Write the file whole; returns its new version.

        ``create_only``: only if there is none yet. ``if_match``: only if it is still at that
        version (compare-and-swap; see the module doc). Either raises
        :class:`~epochal.state.objectstore.PreconditionFailedError` when another writer was
        first.
        """
        path = "/" + key
        if if_match is not None:
            return self._swap(path, data, if_match)
        parent, name = _split(path)
        temporary = f"{parent}/.{name}{_TMP}{uuid.uuid4().hex}"
        version = self._write(temporary, data)
        try:
            self._rename(temporary, path, overwrite=not create_only)
        except FileExistsError:
            self._remove(temporary)
            return self._own_write_or_conflict(key, data)
        except FileNotFoundError:  # a retried rename whose first attempt had moved it
            if not self._at_version(path, version):
                raise
        except BaseException:
            self._remove(temporary)
            raise
        return str(version)

    def _at_version(self, path: str, version: int) -> bool:
        status = self._status(path)
        return status is not None and status.file_id == version

    def _own_write_or_conflict(self, key: str, data: bytes) -> str:
        """After a refused create: identical bytes are our own earlier attempt (every body
        epochal writes is unique); anything else is another writer's."""
        with contextlib.suppress(FileNotFoundError):
            current = self.get(key)
            if current.data == data:
                return current.etag
        raise PreconditionFailedError(f"hdfs://{self.bucket}/{key} exists")

    def _swap(self, path: str, data: bytes, version: str) -> str:
        parent, name = _split(path)
        swaps = f"{parent}/{SWAPS}"
        staged = f"{swaps}/{name}{_TMP}{uuid.uuid4().hex}"
        new_version = self._write(f"{staged}/data", data)
        claim = f"{swaps}/{name}.claim-{version}"
        try:
            self._rename(staged, claim, overwrite=False)
        except FileExistsError:
            if not self._claimed_by(path, claim, new_version):  # not a retry of our own
                self._remove(staged)
                self._finish(path, claim, version)  # the winner may have stopped halfway
                raise PreconditionFailedError(f"hdfs://{self.bucket}{path} changed") from None
        except BaseException:
            self._remove(staged)
            raise
        if not self._finish(path, claim, version):
            raise PreconditionFailedError(f"hdfs://{self.bucket}{path} changed")
        if random.random() < 1 / 32:
            self._sweep(swaps)
        return str(new_version)

    def _claimed_by(self, path: str, claim: str, new_version: int) -> bool:
        """Whether the claim holds (or held, and moved over the record) our own new version:
        a retried rename whose first attempt had taken the claim."""
        return self._at_version(f"{claim}/data", new_version) or self._at_version(path, new_version)

    def _finish(self, path: str, claim: str, version: str) -> bool:
        """Move the claim's file over the record if the record is still at ``version``.
        True when the record was at ``version`` (moved now, or by another writer before)."""
        current = self._status(path)
        if current is None or str(current.file_id) != version:
            return current is not None and self._status(f"{claim}/data") is None
        with contextlib.suppress(FileNotFoundError):  # moved by another writer already
            self._rename(f"{claim}/data", path, overwrite=True)
        return True

    def _sweep(self, swaps: str) -> None:
        """Delete claims and staged files older than :data:`SWEEP_AFTER`."""
        cutoff = (time.time() - SWEEP_AFTER) * 1e3
        for item in self._listing(swaps):
            if item["modificationTime"] < cutoff:
                self._remove(f"{swaps}/{item['pathSuffix']}")

    def delete(self, key: str) -> None:
        """Delete the file (gone is fine)."""
        self._remove("/" + key)

    def children(self, directory: str) -> tuple[list[str], list[str]]:
        """Names of the files and of the directories directly under ``directory`` (hidden
        names, starting with a dot, are left out: temporary files, claims)."""
        files: list[str] = []
        dirs: list[str] = []
        for item in self._listing("/" + directory.strip("/")):
            name = str(item["pathSuffix"])
            if name and not name.startswith("."):
                (dirs if item["type"] == "DIRECTORY" else files).append(name)
        return files, dirs

    def walk(self, directory: str) -> list[str]:
        """Every file's key under ``directory`` (recursively, hidden names left out), sorted."""
        found: list[str] = []
        pending = [directory.strip("/")]
        while pending:
            current = pending.pop()
            files, dirs = self.children(current)
            prefix = f"{current}/" if current else ""
            found.extend(prefix + name for name in files)
            pending.extend(prefix + name for name in dirs)
        return sorted(found)

    def delete_tree(self, directory: str) -> int:
        """Delete everything under ``directory``; how many files there were."""
        count = len(self.walk(directory))
        self._remove("/" + directory.strip("/"))
        return count


class _TransientError(Exception):
    """The NameNode (or a DataNode) cannot answer now: down, restarting, in safe mode."""


def _http(method: str, url: str, data: bytes | None = None) -> bytes:
    import urllib.request  # here: 10 ms of imports (http, email) that most processes never need

    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/octet-stream")
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
        return bytes(response.read())


def _refusal(exc: urllib.error.HTTPError, op: str, path: str) -> Exception:
    """The exception for a WebHDFS error answer (``RemoteException`` JSON)."""
    try:
        remote = json.loads(exc.read() or b"{}").get("RemoteException") or {}
    except ValueError:
        remote = {}
    kind = str(remote.get("exception", ""))
    message = str(remote.get("message", exc.reason))
    if exc.code == 404 or kind == "FileNotFoundException":
        return FileNotFoundError(f"HDFS: {op} {path}: {message}")
    if kind == "FileAlreadyExistsException":
        return FileExistsError(f"HDFS: {op} {path}: {message}")
    if kind in _TRANSIENT or exc.code in (502, 503, 504):
        return _TransientError(f"{kind or exc.code}: {message}")
    if exc.code in (401, 403) and kind in ("AccessControlException", "SecurityException", ""):
        return PermissionError(f"HDFS: {op} {path}: {message}")
    return OSError(f"HDFS: {op} {path}: {kind or exc.code}: {message}")


def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rstrip("/").rpartition("/")
    return parent, name
