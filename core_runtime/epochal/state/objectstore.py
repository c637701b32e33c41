"""Object storage (Amazon S3 and S3-compatible stores) for snapshots, job records and leases.

A snapshot directory ``s3://bucket/prefix`` (or ``s3a://``) keeps everything of a job on the
object store: its record, its lease, the connectors' snapshot store and Spark's checkpoint
(which Spark reaches as ``s3a://``, see :func:`spark_uri`). Nothing on an object store can
be renamed atomically and ``pyarrow.fs`` writes unconditionally, so epochal talks to S3
through boto3 and uses its **conditional writes**:

- ``If-None-Match: *`` creates an object only if the key is free (a second writer gets 412):
  commit decisions and every entry written ``exclusive=True``, a job's first lease.
- ``If-Match: <etag>`` replaces an object only if it is still the version that was read (a
  compare-and-swap: of two writers that read the same version, exactly one wins): the lease
  (renewal, take-over, a new epoch) and the job record (read-modify-write, retried).

An ETag is a digest of the content, so a record swapped with ``If-Match`` must change on every
write (the lease and the job record carry a time stamp, entries their write time), else a
writer could swap against an ETag that came back (ABA).

A write whose response was lost is retried by the client; if the first attempt had landed, the
retry finds its own object and gets 412. :meth:`ObjectStore.put` tells the two apart by
reading the object back: identical bytes are our own write (every body epochal writes is
unique), anything else is another writer's.

Settings come from the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, profiles and instance roles through boto3's
default chain) and two of epochal's own: ``EPOCHAL_S3_ENDPOINT`` (an endpoint for
epochal's snapshot directories only, before the AWS ones) and ``EPOCHAL_S3_PATH_STYLE``
(``true``/``false``; default: path style when an endpoint is set, as S3-compatible stores
want, virtual hosts on AWS). The driver turns the same settings into Spark's
``spark.hadoop.fs.s3a.*`` settings and hands the variables that hold no secret (region,
endpoint, addressing style, the path of a credentials file, a profile's name) to the
executors, which write key digests into the store (:func:`spark_conf`). Credentials never go
into Spark's settings: executors on the driver's machine inherit its environment, and on a
cluster each executor finds its own through the same default chain (an instance role, IRSA,
a credentials file at ``AWS_SHARED_CREDENTIALS_FILE`` on every node): see docs/how-to/cluster.md.

boto3 is an optional dependency: ``pip install 'epochal[s3]'``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from epochal_sdk import ConfigError

SCHEMES = ("s3", "s3a")
"""URI schemes served by this module (``s3a`` is Hadoop's name for the same store)."""
HDFS_SCHEME = "hdfs"
"""HDFS, served by :mod:`epochal.state.webhdfs` with the same layout: a job's state at one
shared prefix, records swapped with a compare-and-swap (:func:`has_conditional_writes`)."""
ENDPOINT_ENV = "EPOCHAL_S3_ENDPOINT"
PATH_STYLE_ENV = "EPOCHAL_S3_PATH_STYLE"
FORWARDED_ENV = (
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_PROFILE",
    ENDPOINT_ENV,
    PATH_STYLE_ENV,
)
"""Variables the driver hands on to the executors (only those that are set): none holds a
secret. ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` are never
forwarded (:data:`NOT_FORWARDED`)."""
NOT_FORWARDED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""Credentials: a Spark setting would show them on the driver JVM's command line (PySpark
passes every setting as ``--conf``) and in Spark's configuration. Executors on this machine
inherit them with the driver's environment; on a cluster each executor's own default chain
finds its credentials (instance role, IRSA, ``AWS_SHARED_CREDENTIALS_FILE``)."""
EPOCHS_SEGMENT = "epochs"
SHARED_STATE = "state"
"""On an object store every lease epoch's state lives at ``<job>/state``: see
:func:`shared_state_dir`."""
INSTALL_HINT = "pip install 'epochal[s3]'"

_EPOCH_DIR = re.compile(r"^(?P<job>.+)/" + EPOCHS_SEGMENT + r"/(?P<epoch>\d+)$")


class PreconditionFailedError(Exception):
    """A conditional write lost: the key exists (create) or changed since it was read
    (compare-and-swap). Read it again and decide."""


def is_object_store(path: str) -> bool:
    """Whether ``path`` is an ``s3://`` or ``s3a://`` URI."""
    return urlsplit(path).scheme.lower() in SCHEMES and "://" in path


def has_conditional_writes(path: str) -> bool:
    """Whether ``path`` is on a store whose records epochal swaps with conditional writes
    instead of a lock and renamed state directories: S3 (this module) or HDFS
    (:mod:`epochal.state.webhdfs`)."""
    scheme = urlsplit(path).scheme.lower()
    return "://" in path and (scheme in SCHEMES or scheme == HDFS_SCHEME)


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix")``."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in SCHEMES or not parts.netloc:
        raise ConfigError(
            "job",
            "snapshot_dir",
            f"{uri!r} is not an s3:// URI with a bucket",
            "Write s3://<bucket>/<prefix>.",
        )
    if parts.query or "@" in parts.netloc:
        raise ConfigError(
            "job",
            "snapshot_dir",
            f"{uri!r} carries credentials or options in the URI",
            "Give the bucket and prefix only; credentials and the endpoint come from the "
            f"AWS_* environment variables (and {ENDPOINT_ENV}).",
        )
    return parts.netloc, parts.path.strip("/")


def spark_uri(path: str) -> str:
    """The URI Spark (Hadoop's S3A connector) uses for ``path``: ``s3://`` → ``s3a://``;
    anything else unchanged."""
    if is_object_store(path):
        bucket, key = split_uri(path)
        return f"s3a://{bucket}/{key}".rstrip("/")
    return path


def shared_state_dir(state_dir: str) -> str:
    """Where the state of ``<job>/epochs/<epoch>`` really is.

    On a local (POSIX) file system that directory itself: a take-over renames it to the new
    epoch's name. An object store cannot rename a tree atomically (a "rename" is a copy of
    every object, then a delete), so there every epoch's state stays at one fixed prefix,
    ``<job>/state``, and the epoch in the path is only a name: a store anchored to it is
    fenced by the lease (its state epoch must still be that one), not by the directory's
    presence. HDFS keeps the same layout (one fencing scheme for every store with
    conditional writes). Paths that are not an epoch's directory are returned unchanged.
    """
    if not has_conditional_writes(state_dir):
        return state_dir
    match = _EPOCH_DIR.match(state_dir.rstrip("/"))
    return f"{match.group('job')}/{SHARED_STATE}" if match else state_dir


def epoch_of(state_dir: str) -> tuple[str, int] | None:
    """``(<job path>, epoch)`` of an epoch's state directory ``<job>/epochs/<epoch>``."""
    match = _EPOCH_DIR.match(state_dir.rstrip("/"))
    return (match.group("job"), int(match.group("epoch"))) if match else None


# -- settings -------------------------------------------------------------------------------
def _flag(value: str | None) -> bool | None:
    if value is None or not value.strip():
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class S3Settings:
    """How to reach the object store: endpoint, region, addressing style."""

    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        """The settings the environment gives (see the module doc)."""
        env = os.environ if env is None else env
        endpoint = (
            env.get(ENDPOINT_ENV) or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        )
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if endpoint and not region:
            region = "us-east-1"  # SigV4 needs one; S3-compatible stores accept this one
        style = _flag(env.get(PATH_STYLE_ENV))
        return cls(endpoint or None, region or None, bool(endpoint) if style is None else style)

    @property
    def configured(self) -> bool:
        """Whether anything beyond AWS's defaults is set."""
        return bool(self.endpoint_url or self.region)

    def hadoop_conf(self) -> dict[str, str]:
        """The same settings for Hadoop's S3A connector (``fs.s3a.*``)."""
        conf: dict[str, str] = {}
        if self.endpoint_url:
            conf["fs.s3a.endpoint"] = self.endpoint_url
            secure = urlsplit(self.endpoint_url).scheme.lower() != "http"
            conf["fs.s3a.connection.ssl.enabled"] = "true" if secure else "false"
        if self.region:
            conf["fs.s3a.endpoint.region"] = self.region
        conf["fs.s3a.path.style.access"] = "true" if self.path_style else "false"
        return conf


def spark_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings that let the driver's checkpoint and the executors reach the object
    store as epochal does: the S3A endpoint, region and addressing style (credentials: S3A's
    default chain reads the same ``AWS_*`` variables, instance roles and profiles), and the
    :data:`FORWARDED_ENV` variables that are set, for the executors' Python workers (they
    write key digests into the snapshot store). No credential is among them
    (:data:`NOT_FORWARDED`). Empty when the environment names no object store settings at
    all. Called by the driver when it builds its session."""
    env = os.environ if env is None else env
    settings = S3Settings.from_env(env)
    forwarded = {name: env[name] for name in FORWARDED_ENV if env.get(name)}
    if not settings.configured and not forwarded:
        return {}
    conf = {f"spark.hadoop.{key}": value for key, value in settings.hadoop_conf().items()}
    # S3A makes create(overwrite=false) an atomic create-if-absent (If-None-Match) when it
    # may skip its own existence probes; a checkpoint file manager that creates log entries
    # directly (not through a temporary file and a rename) then gets a real fence.
    conf["spark.hadoop.fs.s3a.create.conditional.enabled"] = "true"
    for name, value in forwarded.items():
        conf[f"spark.executorEnv.{name}"] = value
    return conf


# -- the client -----------------------------------------------------------------------------
_CLIENTS: dict[tuple[int, S3Settings], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _boto3() -> tuple[Any, Any]:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError(
            "job",
            "snapshot_dir",
            "an s3:// snapshot directory needs boto3 (conditional writes), which is not "
            "installed in this Python",
            f"Install it: {INSTALL_HINT} (on the driver's machine and on every executor).",
        ) from None
    return boto3, Config


def client(settings: S3Settings | None = None) -> Any:
    """A boto3 S3 client for ``settings`` (default: the environment's), one per process
    (a forked PySpark worker makes its own: connection pools must not cross a fork)."""
    settings = settings or S3Settings.from_env()
    key = (os.getpid(), settings)
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is not None:
            return found
        boto3, config_class = _boto3()
        config = config_class(
            s3={"addressing_style": "path" if settings.path_style else "auto"},
            signature_version="s3v4",
            connect_timeout=5,
            read_timeout=30,
            retries={"mode": "standard", "total_max_attempts": 5},
        )
        made = boto3.session.Session().client(
            "s3",
            endpoint_url=settings.endpoint_url,
            region_name=settings.region,
            config=config,
        )
        _CLIENTS[key] = made
        return made


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the version (ETag) they were read at."""

    data: bytes
    etag: str


def _code(error: Any) -> tuple[int, str]:
    response = getattr(error, "response", None) or {}
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return status, str(response.get("Error", {}).get("Code", ""))


class ObjectStore:
    """One bucket, through boto3. Keys are plain strings (no leading slash)."""

    def __init__(self, bucket: str, settings: S3Settings | None = None) -> None:
        self.bucket = bucket
        self.settings = settings or S3Settings.from_env()

    @property
    def client(self) -> Any:
        """This process's client."""
        return client(self.settings)

    def _error(self, exc: Exception, doing: str) -> Exception:
        status, code = _code(exc)
        if status in (403,) or code in ("AccessDenied", "InvalidAccessKeyId"):
            return PermissionError(f"{doing}: access denied by the object store ({code})")
        if code == "NoSuchBucket":
            return ConfigError(
                "job",
                "snapshot_dir",
                f"{doing}: the bucket {self.bucket!r} does not exist",
                "Create it (epochal creates keys, never buckets), or name another one.",
            )
        return exc

    def get(self, key: str) -> Versioned:
        """The object's bytes and ETag; ``FileNotFoundError`` when there is none."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            status, code = _code(exc)
            if (status == 404 and code != "NoSuchBucket") or code == "NoSuchKey":
                raise FileNotFoundError(f"s3://{self.bucket}/{key}") from None
            raise self._error(exc, f"reading s3://{self.bucket}/{key}") from exc
        return Versioned(bytes(response["Body"].read()), str(response["ETag"]))

    def exists(self, key: str) -> bool:
        """Whether the object exists."""
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            status, code = _code(exc)
            if (status == 404 and code != "NoSuchBucket") or code in ("NoSuchKey", "NotFound"):
                return False
            raise self._error(exc, f"looking for s3://{self.bucket}/{key}") from exc
        return True

    def put(
        self, key: str, data: bytes, *, create_only: bool = False, if_match: str | None = None
    ) -> str:
        """Write the object; returns its new ETag.

        ``create_only``: only if the key is free (``If-None-Match: *``). ``if_match``: only
        if the object is still at that ETag (compare-and-swap; a missing object fails too).
        Either raises :class:`PreconditionFailedError` when another writer was first.
        """
        condition: dict[str, str] = {}
        if create_only:
            condition["IfNoneMatch"] = "*"
        if if_match is not None:
            condition["IfMatch"] = if_match
        try:
            response = self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **condition)
        except Exception as exc:
            status, code = _code(exc)
            # 412: the condition failed. 409 (AWS): a concurrent conditional write on the
            # key. 404 on If-Match (AWS): the object is gone; SeaweedFS answers 412.
            conflict = status in (409, 412) or code in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            )
            if condition and (conflict or (if_match is not None and status == 404)):
                return self._own_write_or_conflict(key, data, exc)
            raise self._error(exc, f"writing s3://{self.bucket}/{key}") from exc
        return str(response["ETag"])

    def _own_write_or_conflict(self, key: str, data: bytes, exc: Exception) -> str:
        """After a failed condition: our own earlier attempt (a lost response, retried by
        the client) left exactly our bytes; anything else is another writer's."""
        try:
            current = self.get(key)
        except FileNotFoundError:
            current = None
        if current is not None and current.data == data:
            return current.etag
        raise PreconditionFailedError(f"s3://{self.bucket}/{key}: {exc}") from None

    def delete(self, key: str) -> None:
        """Delete the object (gone is fine)."""
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            status, code = _code(exc)
            if status == 404 and code != "NoSuchBucket":
                return
            raise self._error(exc, f"deleting s3://{self.bucket}/{key}") from exc

    def _pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            yield from paginator.paginate(Bucket=self.bucket, **kwargs)
        except Exception as exc:
            raise self._error(
                exc, f"listing s3://{self.bucket}/{kwargs.get('Prefix', '')}"
            ) from exc

    def children(self, directory: str) -> tuple[list[str], list[str]]:
        """Names of the objects and of the "directories" (common prefixes) directly under
        ``directory`` (empty for the bucket's top level)."""
        prefix = f"{directory.strip('/')}/" if directory.strip("/") else ""
        files: list[str] = []
        dirs: list[str] = []
        for page in self._pages(Prefix=prefix, Delimiter="/"):
            for item in page.get("Contents", []):
                name = str(item["Key"])[len(prefix) :]
                if name:  # "dir/" markers left by other tools are not files
                    files.append(name)
            for common in page.get("CommonPrefixes", []):
                dirs.append(str(common["Prefix"])[len(prefix) :].rstrip("/"))
        return files, dirs

    def walk(self, directory: str) -> list[str]:
        """Every key under ``directory`` (recursively), sorted."""
        prefix = f"{directory.strip('/')}/" if directory.strip("/") else ""
        keys = [
            str(item["Key"])
            for page in self._pages(Prefix=prefix)
            for item in page.get("Contents", [])
            if not str(item["Key"]).endswith("/")
        ]
        return sorted(keys)

    def delete_tree(self, directory: str) -> int:
        """Delete every object under ``directory``; how many there were."""
        prefix = f"{directory.strip('/')}/"
        keys = [
            str(item["Key"])
            for page in self._pages(Prefix=prefix)
            for item in page.get("Contents", [])
        ]
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
        return len(keys)
