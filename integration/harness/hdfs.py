"""HDFS for integration tests: one NameNode and one DataNode, each a local JVM.

The daemons run from the jars of pyspark's Hadoop release (:func:`~.cache.hadoop_hdfs_jars`,
``hadoop-hdfs`` and its runtime dependencies from Maven Central), so Spark's own Hadoop
client (``hadoop-client-api``/``-runtime`` in pyspark's ``jars/``) talks to daemons of its
release. The NameNode is formatted once in a temporary directory; its metadata and the
DataNode's blocks survive a stop, a kill and a start, so :meth:`HdfsServer.restart_namenode`
is a real NameNode restart (it replays its edit log and leaves safe mode once the DataNode
reported its blocks). Replication is 1, permissions are off, every listener is on a free
loopback port. Readiness is a write and a read of a file through WebHDFS (the NameNode, the
DataNode and its block pipeline).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from epochal.startup.classdata import SHORT_LIVED_JVM

from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    free_ports,
    make_temp_dir,
    remove_temp_dir,
    run_checked,
)
from .cache import hadoop_hdfs_jars, hadoop_yarn_version, require_java
from .server import Backend, LocalBackend, Server
from .yarn_conf import LOG4J

JVM_OPTS = [*SHORT_LIVED_JVM, "-XX:+ExitOnOutOfMemoryError", "-Djava.net.preferIPv4Stack=true"]
NAMENODE_CLASS = "org.apache.hadoop.hdfs.server.namenode.NameNode"
DATANODE_CLASS = "org.apache.hadoop.hdfs.server.datanode.DataNode"
USER = "epochal"
"""The user name the harness's WebHDFS calls give (simple authentication, permissions off)."""
NAMENODE_PORTS = ("rpc", "http")
DATANODE_PORTS = ("address", "http.address", "ipc.address")


def _xml(props: dict[str, object]) -> str:
    rows = "".join(
        f"<property><name>{k}</name><value>{v}</value></property>\n" for k, v in props.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{rows}</configuration>\n'


def write_conf(conf: Path, workdir: Path, nn: dict[str, int], dn: dict[str, int]) -> Path:
    """The daemons' (and clients') conf dir: core-site (``fs.defaultFS`` is this HDFS),
    hdfs-site (ports, directories, replication 1, no permissions, no safe-mode wait beyond the
    DataNode's block report) and log4j (to stdout)."""
    conf.mkdir(parents=True, exist_ok=True)
    core = {
        "fs.defaultFS": f"hdfs://{HOST}:{nn['rpc']}",
        "hadoop.tmp.dir": workdir / "hadoop-tmp",
        "hadoop.http.staticuser.user": USER,
    }
    hdfs = {
        "dfs.namenode.rpc-address": f"{HOST}:{nn['rpc']}",
        "dfs.namenode.http-address": f"{HOST}:{nn['http']}",
        "dfs.namenode.name.dir": workdir / "name",
        "dfs.datanode.data.dir": workdir / "data",
        **{f"dfs.datanode.{k}": f"{HOST}:{port}" for k, port in dn.items()},
        "dfs.datanode.hostname": HOST,
        "dfs.namenode.datanode.registration.ip-hostname-check": "false",
        "dfs.replication": 1,
        "dfs.permissions.enabled": "false",
        "dfs.namenode.safemode.extension": 0,
        "dfs.namenode.safemode.min.datanodes": 1,
        "dfs.heartbeat.interval": 1,
        "dfs.namenode.heartbeat.recheck-interval": 5000,
        "dfs.datanode.du.reserved": 0,
        "dfs.namenode.resource.du.reserved": 0,
        "dfs.webhdfs.enabled": "true",
    }
    (conf / "core-site.xml").write_text(_xml(core))
    (conf / "hdfs-site.xml").write_text(_xml(hdfs))
    (conf / "log4j.properties").write_text(LOG4J)
    return conf


def _daemon_argv(conf: Path, workdir: Path, name: str, main: str, heap: str) -> list[str]:
    java = require_java()
    logs = workdir / f"{name}-logs"
    return [
        java,
        f"-Xmx{heap}",
        *JVM_OPTS,
        f"-Dhadoop.log.dir={logs}",
        "-cp",
        f"{conf}:{_webapps(workdir)}:{hadoop_hdfs_jars()}/*",
        main,
    ]


def _webapps(workdir: Path) -> Path:
    """A class path directory with the daemons' ``webapps/<name>`` resource directories.

    The HTTP servers look their web apps up on the class path; the published hadoop-hdfs jar
    carries none. WebHDFS is registered in code, so empty directories serve.
    """
    root = workdir / "web"
    for name in ("hdfs", "datanode", "static"):
        (root / "webapps" / name).mkdir(parents=True, exist_ok=True)
    return root


def _daemon_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("HADOOP_", "HDFS_"))}


class HdfsDaemon(LocalBackend):
    """The NameNode or the DataNode JVM; ready when ``ready()`` (set by the cluster) is."""

    start_timeout = 120.0

    def __init__(self, name: str, workdir: Path, conf: Path, main: str, heap: str) -> None:
        argv = _daemon_argv(conf, workdir, name, main, heap)
        process = ManagedProcess(
            name, argv, workdir / f"{name}.log", env=_daemon_env(), cwd=workdir
        )
        super().__init__(name, workdir, process)
        self.ready = lambda: False

    def probe(self) -> bool:
        """Whether the cluster reports this daemon ready."""
        return bool(self.ready())

    def close(self) -> None:
        """Kill the daemon (the cluster removes the directory)."""
        with self._lock:
            self.process.forget()


class HdfsBackend(Backend):
    """The NameNode and the DataNode handled as one server."""

    supports_faults = True

    def __init__(self, workdir: Path, namenode: HdfsDaemon, datanode: HdfsDaemon) -> None:
        self.name = "hdfs"
        self.workdir = workdir
        self.namenode, self.datanode = namenode, datanode
        self.daemons = [datanode, namenode]  # stopping order
        self._lock = threading.RLock()

    def start(self) -> None:
        """Start whatever is not running; await both."""
        with self._lock:
            for daemon in reversed(self.daemons):
                daemon.process.start()
            for daemon in reversed(self.daemons):
                daemon.wait_ready()

    def stop(self) -> None:
        """Stop the DataNode, then the NameNode (their data stays)."""
        with self._lock:
            for daemon in self.daemons:
                daemon.stop()

    def kill(self) -> None:
        """SIGKILL both daemons (their data stays)."""
        with self._lock:
            for daemon in self.daemons:
                daemon.kill()

    def is_running(self) -> bool:
        """Whether both daemons are alive."""
        return all(daemon.is_running() for daemon in self.daemons)

    def log_tail(self, lines: int = 80) -> str:
        """The tails of both daemons' logs."""
        each = max(10, lines // 2)
        return "\n".join(f"--- {d.name}\n{d.log_tail(each)}" for d in reversed(self.daemons))

    def close(self) -> None:
        """Kill both daemons and remove their directory."""
        with self._lock:
            try:
                for daemon in self.daemons:
                    daemon.close()
            finally:
                remove_temp_dir(self.workdir)


@dataclass
class HdfsServer(Server):
    """The HDFS provided by ``hdfs_server``: its URIs, WebHDFS, and a NameNode restart.

    ``uri`` is what Spark and epochal name paths with (``hdfs://127.0.0.1:<rpc port>``);
    ``webhdfs_url`` the NameNode's HTTP address, which epochal reaches as
    ``EPOCHAL_WEBHDFS_URL`` (:meth:`env`).
    """

    uri: str = ""
    webhdfs_url: str = ""
    conf_dir: Path = field(default_factory=Path)
    version: str = ""

    @property
    def _backend(self) -> HdfsBackend:
        assert isinstance(self.backend, HdfsBackend)
        return self.backend

    def url(self, path: str = "") -> str:
        """``hdfs://127.0.0.1:<port>/<path>``."""
        return f"{self.uri}/{path.lstrip('/')}"

    def env(self) -> dict[str, str]:
        """Variables for processes that use this HDFS through epochal (no secret among them)."""
        return {"EPOCHAL_WEBHDFS_URL": self.webhdfs_url, "HADOOP_USER_NAME": USER}

    def webhdfs(self, path: str, op: str, method: str = "GET", **params: str) -> bytes:
        """One WebHDFS call on the NameNode (redirects to the DataNode followed for GET)."""
        pairs = {"op": op, "user.name": USER, **params}
        query = "&".join(f"{k}={v}" for k, v in pairs.items())
        request = urllib.request.Request(
            f"{self.webhdfs_url}/webhdfs/v1/{path.lstrip('/')}?{query}", method=method
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return bytes(response.read())

    def list_files(self, path: str) -> list[str]:
        """Names of the files (not directories) directly under ``path``; [] if it is absent."""
        try:
            listing = json.loads(self.webhdfs(path, "LISTSTATUS"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        statuses = listing["FileStatuses"]["FileStatus"]
        return sorted(s["pathSuffix"] for s in statuses if s["type"] == "FILE")

    def restart_namenode(
        self,
        down: float = 0.0,
        *,
        hard: bool = False,
        on_stopped: Callable[[], object] | None = None,
    ) -> None:
        """Stop (or with ``hard`` SIGKILL) the NameNode, call ``on_stopped``, keep it down
        ``down`` seconds, start it again and wait until it serves writes (out of safe mode,
        the DataNode registered)."""
        namenode = self._backend.namenode
        if hard:
            namenode.kill()
        else:
            namenode.stop()
        if on_stopped is not None:
            on_stopped()
        if down:
            threading.Event().wait(down)
        namenode.start()
        self._backend.datanode.wait_ready()


def _writes(webhdfs_url: str) -> bool:
    """One readiness probe: a file created through the NameNode and the DataNode, read back."""
    token = uuid.uuid4().hex.encode()
    base = f"{webhdfs_url}/webhdfs/v1/tmp/epochal-ready"
    try:
        request = urllib.request.Request(
            f"{base}?op=CREATE&overwrite=true&noredirect=true&user.name={USER}", method="PUT"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            location = json.loads(response.read())["Location"]
        write = urllib.request.Request(location, data=token, method="PUT")
        urllib.request.urlopen(write, timeout=10).close()
        with urllib.request.urlopen(f"{base}?op=OPEN&user.name={USER}", timeout=10) as response:
            return bytes(response.read()) == token
    except (OSError, ValueError, KeyError):
        return False


def _namenode_up(webhdfs_url: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        url = f"{webhdfs_url}/webhdfs/v1/?op=GETFILESTATUS&user.name={USER}"
        with urllib.request.urlopen(url, timeout=2) as response:
            return "FileStatus" in json.loads(response.read())
    return False


def start_hdfs() -> HdfsServer:
    """A formatted NameNode and a DataNode on free loopback ports, serving writes."""
    workdir = make_temp_dir("epochal-hdfs-")
    picked = iter(free_ports(len(NAMENODE_PORTS) + len(DATANODE_PORTS)))
    nn = {k: next(picked) for k in NAMENODE_PORTS}
    dn = {k: next(picked) for k in DATANODE_PORTS}
    conf = write_conf(workdir / "conf", workdir, nn, dn)
    run_checked(
        [
            *_daemon_argv(conf, workdir, "format", NAMENODE_CLASS, "256m"),
            "-format",
            "-nonInteractive",
            "-force",
        ],
        "formatting the NameNode",
        timeout=120,
        env=_daemon_env(),
    )
    namenode = HdfsDaemon("namenode", workdir, conf, NAMENODE_CLASS, "384m")
    datanode = HdfsDaemon("datanode", workdir, conf, DATANODE_CLASS, "256m")
    backend = HdfsBackend(workdir, namenode, datanode)
    server = HdfsServer(
        backend,
        uri=f"hdfs://{HOST}:{nn['rpc']}",
        webhdfs_url=f"http://{HOST}:{nn['http']}",
        conf_dir=conf,
        version=hadoop_yarn_version(),
    )
    namenode.ready = lambda: _namenode_up(server.webhdfs_url)
    datanode.ready = lambda: _writes(server.webhdfs_url)
    try:
        backend.start()
    except (HarnessError, TimeoutError):
        backend.close()
        raise
    return server


def main() -> int:
    """``python -m integration.harness.hdfs``: run HDFS until Ctrl-C."""
    from ._process import cleanup_all

    server = start_hdfs()
    print(server, flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.backend.close()
        cleanup_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
