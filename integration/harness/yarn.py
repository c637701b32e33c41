"""A YARN cluster for integration tests: one ResourceManager and two NodeManagers.

Each daemon is its own JVM (``java -cp <conf>:<jars>/* ...ResourceManager|NodeManager``,
jars of pyspark's Hadoop release fetched by :func:`~.cache.hadoop_yarn_jars`) in its own
process group with its own log, on free loopback ports; each NodeManager has its own conf
dir, local dirs and log dirs. Containers run as this user (``DefaultContainerExecutor``).
A stopped NodeManager (:meth:`YarnCluster.pause_node`) is declared ``LOST`` after
:data:`NM_EXPIRY_MS`; its containers go on running. :meth:`YarnCluster.submit` runs
pyspark's own ``bin/spark-submit --master yarn --deploy-mode cluster``; Spark's jars and
Python zips are used in place (``local:``), nothing big is uploaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    _descendants,
    free_port,
    make_temp_dir,
    remove_temp_dir,
    tail_file,
    wait_until,
)
from .cache import hadoop_yarn_jars, hadoop_yarn_version, pyspark_home, require_java
from .server import Backend, LocalBackend, Server

NM_MEMORY_MB = 3072
NM_VCORES = 2
MIN_ALLOCATION_MB = 256
AM_MAX_ATTEMPTS = 4
#: The RM declares a NodeManager LOST after this long without a heartbeat (default 600 s).
NM_EXPIRY_MS = 10_000
#: The RM fails an attempt whose AM did not heartbeat for this long (default 600 s).
AM_EXPIRY_MS = 10_000
JVM_OPTS = ["-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError", "-Djava.net.preferIPv4Stack=true"]
JVM_OPENS = [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in ("java.lang", "java.util", "java.io")]
RM_CLASS = "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager"
NM_CLASS = "org.apache.hadoop.yarn.server.nodemanager.NodeManager"
AM_CLASS = "org.apache.spark.deploy.yarn.ApplicationMaster"
LOG4J = """log4j.rootLogger=INFO,console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.out
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{1}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
"""


def _xml(props: dict[str, Any]) -> str:
    body = "".join(
        f"  <property><name>{k}</name><value>{v}</value></property>\n" for k, v in props.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


def _write_conf(conf: Path, yarn: dict[str, Any], workdir: Path) -> None:
    conf.mkdir(parents=True, exist_ok=True)
    core = {
        "fs.defaultFS": "file:///",
        "hadoop.tmp.dir": workdir / "hadoop-tmp",
        # ``?user.name=`` names the caller of the REST API (kill_app needs one)
        "hadoop.http.filter.initializers": "org.apache.hadoop.security.AuthenticationFilterInitializer",
        "hadoop.http.authentication.type": "simple",
        "hadoop.http.authentication.simple.anonymous.allowed": "true",
        "hadoop.http.authentication.signature.secret.file": workdir / "http-secret",
    }
    capacity = {
        "yarn.scheduler.capacity.root.queues": "default",
        "yarn.scheduler.capacity.root.default.capacity": 100,
        "yarn.scheduler.capacity.root.default.maximum-capacity": 100,
        "yarn.scheduler.capacity.maximum-am-resource-percent": 0.5,
    }
    (conf / "core-site.xml").write_text(_xml(core))
    (conf / "yarn-site.xml").write_text(_xml(yarn))
    (conf / "capacity-scheduler.xml").write_text(_xml(capacity))
    (conf / "log4j.properties").write_text(LOG4J)


def _get(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return dict(json.loads(response.read().decode()))


def _proc_text(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b"\n").decode(errors="replace")
    except OSError:
        return ""


def container_processes(prefix: str) -> list[int]:
    """Pids whose environment has ``CONTAINER_ID=<prefix>...``, and their descendants."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and f"\nCONTAINER_ID={prefix}" in "\n" + _proc_text(
            int(entry.name), "environ"
        ):
            found.update([int(entry.name), *_descendants(int(entry.name))])
    return sorted(found)


def _container_prefix(app_or_container: str) -> str:
    if app_or_container.startswith("application_"):
        return "container_" + app_or_container.removeprefix("application_") + "_"
    return app_or_container


class YarnDaemon(LocalBackend):
    """A ResourceManager or NodeManager JVM; ``probe`` is set by :class:`YarnClusterBackend`."""

    start_timeout = 120.0

    def __init__(self, name: str, workdir: Path, conf: Path, main: str, heap: str) -> None:
        java = require_java()
        self.conf = conf
        logs = workdir / f"{name}-logs"
        argv = [
            java,
            f"-Xmx{heap}",
            *JVM_OPTS,
            *JVM_OPENS,
            f"-Dhadoop.log.dir={logs}",
            f"-Dyarn.log.dir={logs}",
            f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
            "-cp",
            f"{conf}:{hadoop_yarn_jars()}/*",
            main,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HADOOP_", "YARN_"))}
        # the NM hands JAVA_HOME to the containers ({{JAVA_HOME}}/bin/java)
        env["JAVA_HOME"] = str(Path(java).resolve().parents[1])
        process = ManagedProcess(name, argv, workdir / f"{name}.log", env=env, cwd=workdir)
        super().__init__(name, workdir, process)
        self.ready = lambda: False

    def probe(self) -> bool:
        """Whether the RM reports this daemon ready."""
        return bool(self.ready())

    def close(self) -> None:
        """Kill the daemon (the cluster removes the directory)."""
        with self._lock:
            self.resume()
            self.process.forget()

    def resume(self) -> None:
        """SIGCONT the JVM (no-op when it is not stopped)."""
        if self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGCONT)


class YarnClusterBackend(Backend):
    """The RM and its NMs handled as one server; also kills leftover container processes."""

    supports_faults = True

    def __init__(self, workdir: Path, rm: YarnDaemon, nms: list[YarnDaemon]) -> None:
        self.name = "yarn-cluster"
        self.workdir = workdir
        self.rm = rm
        self.nms = nms
        self.submissions: list[subprocess.Popen[bytes]] = []
        self._lock = threading.RLock()

    def start(self) -> None:
        """Start whatever is not running, and wait until the RM lists every NM RUNNING."""
        with self._lock:
            for daemon in [self.rm, *self.nms]:  # the NMs retry until the RM listens
                if not daemon.process.running:
                    daemon.process.start()
            for daemon in [self.rm, *self.nms]:
                daemon.wait_ready()

    def stop(self) -> None:
        """Stop the NMs (their containers with them), then the RM."""
        with self._lock:
            for daemon in [*self.nms, self.rm]:
                daemon.resume()
                daemon.stop()
            self._kill_containers()

    def kill(self) -> None:
        """SIGKILL every daemon and every container process."""
        with self._lock:
            for daemon in [*self.nms, self.rm]:
                daemon.kill()
            self._kill_containers()

    def _kill_containers(self) -> None:
        for pid in container_processes("container_"):
            if str(self.workdir) in _proc_text(pid, "environ"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def is_running(self) -> bool:
        """Whether the RM and every NM process are alive (a paused NM counts as alive)."""
        return self.rm.is_running() and all(nm.is_running() for nm in self.nms)

    def log_tail(self, lines: int = 80) -> str:
        """The tails of the daemons' logs."""
        each = max(10, lines // (1 + len(self.nms)))
        return "\n".join(f"--- {d.name}\n{d.log_tail(each)}" for d in [self.rm, *self.nms])

    def close(self) -> None:
        """Kill submissions, daemons and containers; remove the cluster's directory."""
        with self._lock:
            try:
                for proc in self.submissions:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                for daemon in [*self.nms, self.rm]:
                    daemon.close()
                self._kill_containers()
            finally:
                remove_temp_dir(self.workdir)


@dataclass
class YarnCluster(Server):
    """Controls of the local YARN cluster provided by ``yarn_cluster`` (see module doc)."""

    conf_dir: Path = field(default_factory=Path)
    web_url: str = ""
    version: str = ""
    node_ids: list[str] = field(default_factory=list)
    nm_log_dirs: list[Path] = field(default_factory=list)

    @property
    def _backend(self) -> YarnClusterBackend:
        assert isinstance(self.backend, YarnClusterBackend)
        return self.backend

    def rest(self, path: str) -> dict[str, Any]:
        """GET ``/ws/v1/cluster/<path>`` of the RM as JSON."""
        return _get(f"{self.web_url}/ws/v1/cluster/{path}")

    def nodes(self) -> list[dict[str, Any]]:
        """The RM's node reports (every state)."""
        return list((self.rest("nodes").get("nodes") or {}).get("node") or [])

    def node_state(self, index: int) -> str:
        """The RM's state of NM ``index`` (``RUNNING``, ``LOST``, ...; ``ABSENT`` if unknown)."""
        port = self.node_ids[index].rsplit(":", 1)[1]
        states = [n["state"] for n in self.nodes() if n["id"].endswith(f":{port}")]
        return str(states[-1]) if states else "ABSENT"

    def nm_pid(self, index: int) -> int | None:
        """The process id of NM ``index``'s JVM."""
        return self._backend.nms[index].process.pid

    def pause_node(self, index: int) -> None:
        """SIGSTOP NM ``index``'s JVM only (its containers keep running)."""
        os.kill(self._backend.nms[index].process.pid or 0, signal.SIGSTOP)

    def resume_node(self, index: int) -> None:
        """SIGCONT NM ``index``'s JVM."""
        self._backend.nms[index].resume()

    def applications(self) -> list[dict[str, Any]]:
        """The RM's application reports."""
        return list((self.rest("apps").get("apps") or {}).get("app") or [])

    def app(self, app_id: str) -> dict[str, Any]:
        """The RM's report of one application."""
        return dict(self.rest(f"apps/{app_id}")["app"])

    def app_state(self, app_id: str) -> str:
        """``ACCEPTED``, ``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``, ..."""
        return str(self.app(app_id)["state"])

    def attempts(self, app_id: str) -> list[dict[str, Any]]:
        """The application's attempts, oldest first (``id``, ``containerId``, ``nodeId``...)."""
        attempts = (self.rest(f"apps/{app_id}/appattempts").get("appAttempts") or {}).get(
            "appAttempt"
        ) or []
        return sorted(attempts, key=lambda a: int(a["id"]))

    def wait_for_attempt(self, app_id: str, n: int, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until attempt ``n`` has its AM container on a node; return the attempt."""

        def found() -> dict[str, Any] | None:
            attempts = [a for a in self.attempts(app_id) if int(a["id"]) == n]
            if attempts and attempts[0].get("nodeId"):
                return attempts[0]
            if self.app_state(app_id) in ("FINISHED", "FAILED", "KILLED"):
                raise HarnessError(f"{app_id} ended before attempt {n}:\n{self.logs(app_id)}")
            return None

        return wait_until(
            found, timeout, f"attempt {n} of {app_id}", on_timeout=lambda: self.logs(app_id)
        )

    def node_index(self, node_id: str) -> int:
        """The index of the NM with RM node id ``node_id`` (``host:port``)."""
        ports = [n.rsplit(":", 1)[1] for n in self.node_ids]
        return ports.index(node_id.rsplit(":", 1)[1])

    def am_node(self, app_id: str) -> int:
        """The index of the NM hosting the current (newest) attempt's AM container."""
        return self.node_index(self.attempts(app_id)[-1]["nodeId"])

    def container_pids(self, app_or_container_id: str) -> list[int]:
        """The processes of a container (or of every container of an application) here."""
        return container_processes(_container_prefix(app_or_container_id))

    def am_pid(self, app_id: str, attempt: int | None = None) -> int | None:
        """The AM JVM (the driver, in cluster mode) of an attempt (default: the newest)."""
        attempts = self.attempts(app_id)
        chosen = attempts[-1] if attempt is None else attempts[attempt - 1]
        for pid in self.container_pids(chosen["containerId"]):
            if AM_CLASS in _proc_text(pid, "cmdline"):
                return pid
        return None

    def kill_am_driver(self, app_id: str) -> int:
        """SIGKILL the newest attempt's AM JVM (the driver); return its pid."""
        pid = self.am_pid(app_id)
        if pid is None:
            raise HarnessError(f"no AM JVM of {app_id} found:\n{self.logs(app_id)}")
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_app(self, app_id: str) -> None:
        """Ask the RM to kill the application (REST ``PUT .../state``)."""
        request = urllib.request.Request(
            f"{self.web_url}/ws/v1/cluster/apps/{app_id}/state?user.name={_user()}",
            data=b'{"state": "KILLED"}',
            headers={"Content-Type": "application/json"},
            method="PUT",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def logs(self, app_id: str, lines: int = 30) -> str:
        """Tails of the containers' ``stdout``/``stderr`` from the NMs' log dirs."""
        parts = []
        for log_dir in self.nm_log_dirs:
            for path in sorted(log_dir.glob(f"{app_id}/container_*/std*")):
                parts.append(f"--- {path.relative_to(log_dir)}\n{tail_file(path, lines)}")
        return "\n".join(parts) or f"<no container logs of {app_id}>"

    def submit_env(self) -> dict[str, str]:
        """Environment of ``spark-submit`` for this cluster."""
        home = pyspark_home()
        zips = sorted((home / "python" / "lib").glob("*.zip"))
        return {
            **os.environ,
            "SPARK_HOME": str(home),
            "HADOOP_CONF_DIR": str(self.conf_dir),
            "YARN_CONF_DIR": str(self.conf_dir),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_ARCHIVES_PATH": ",".join(f"local:{z}" for z in zips),
            "SPARK_LOCAL_IP": HOST,
        }

    def submit_conf(self, tag: str, wait: bool) -> dict[str, str]:
        """Default Spark settings of :meth:`submit` (a caller's ``conf`` overrides them)."""
        python = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": HOST}
        if os.environ.get("PYTHONPATH"):
            python["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return {
            "spark.yarn.jars": f"local:{pyspark_home() / 'jars'}/*",
            "spark.yarn.stagingDir": f"file://{self._backend.workdir / 'staging'}",
            "spark.yarn.submit.waitAppCompletion": str(wait).lower(),
            "spark.yarn.tags": tag,
            "spark.pyspark.python": sys.executable,
            **{f"spark.yarn.appMasterEnv.{k}": v for k, v in python.items()},
            **{f"spark.executorEnv.{k}": v for k, v in python.items()},
            "spark.driver.memory": "512m",
            "spark.executor.memory": "512m",
            "spark.executor.instances": "1",
            "spark.executor.cores": "1",
            "spark.ui.enabled": "false",
        }

    def submit(
        self,
        app_path: str | Path,
        args: list[str] | tuple[str, ...] = (),
        conf: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        wait: bool = False,
    ) -> subprocess.Popen[bytes]:
        """Run ``spark-submit --master yarn --deploy-mode cluster app_path args``.

        With ``wait=False`` it returns once YARN accepted the application; find its id with
        :meth:`app_id_of`. Output goes to ``proc.log_path``.
        """
        tag = f"epochal-{uuid.uuid4().hex[:12]}"
        settings = {**self.submit_conf(tag, wait), **(conf or {})}
        argv = [str(pyspark_home() / "bin" / "spark-submit"), "--master", "yarn"]
        argv += ["--deploy-mode", "cluster", "--name", tag]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        log_path = self._backend.workdir / f"submit-{tag}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*argv, str(app_path), *map(str, args)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.submit_env(), **(env or {})},
                start_new_session=True,
            )
        proc.tag, proc.log_path = tag, log_path  # type: ignore[attr-defined]
        self._backend.submissions.append(proc)
        return proc

    def app_id_of(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
        """The application id of a :meth:`submit` (found by its tag on the RM)."""
        tag = proc.tag  # type: ignore[attr-defined]

        def found() -> str | None:
            apps = [a for a in self.applications() if tag in a.get("applicationTags", "")]
            if not apps and proc.poll() is not None:
                raise HarnessError(f"spark-submit exited {proc.returncode}:\n{self.submit_log(proc)}")
            return str(apps[0]["id"]) if apps else None

        return wait_until(found, timeout, f"application {tag}", on_timeout=lambda: self.submit_log(proc))

    @staticmethod
    def submit_log(proc: subprocess.Popen[bytes], lines: int = 40) -> str:
        """The tail of a submission's output."""
        return tail_file(proc.log_path, lines)  # type: ignore[attr-defined]


def _user() -> str:
    import getpass

    return getpass.getuser()


def start_yarn_cluster(nodes: int = 2, nm_expiry_ms: int = NM_EXPIRY_MS, am_expiry_ms: int = AM_EXPIRY_MS) -> YarnCluster:
    """A ResourceManager and ``nodes`` NodeManagers, all RUNNING; liveness expiries settable."""
    workdir = make_temp_dir("epochal-yarn-")
    rm_ports = {k: free_port() for k in ("", "scheduler.", "resource-tracker.", "admin.", "webapp.")}
    common: dict[str, Any] = {
        "yarn.resourcemanager.hostname": HOST,
        **{f"yarn.resourcemanager.{k}address": f"{HOST}:{p}" for k, p in rm_ports.items()},
        "yarn.resourcemanager.am.max-attempts": AM_MAX_ATTEMPTS,
        "yarn.nm.liveness-monitor.expiry-interval-ms": nm_expiry_ms,
        "yarn.resourcemanager.nm.liveness-monitor.interval-ms": 500,
        "yarn.am.liveness-monitor.expiry-interval-ms": am_expiry_ms,
        "yarn.resourcemanager.nodemanagers.heartbeat-interval-ms": 1000,
        "yarn.resourcemanager.connect.retry-interval.ms": 500,
        "yarn.scheduler.minimum-allocation-mb": MIN_ALLOCATION_MB,
        "yarn.scheduler.maximum-allocation-mb": NM_MEMORY_MB,
        "yarn.scheduler.maximum-allocation-vcores": NM_VCORES,
        "yarn.log-aggregation-enable": "false",
    }
    conf_dir = workdir / "conf"
    (workdir / "http-secret").write_text(uuid.uuid4().hex)
    _write_conf(conf_dir, common, workdir)
    rm = YarnDaemon("resourcemanager", workdir, conf_dir, RM_CLASS, "384m")
    nms: list[YarnDaemon] = []
    node_ids: list[str] = []
    log_dirs: list[Path] = []
    for i in range(nodes):
        base = workdir / f"nm-{i}"
        ports = {k: free_port() for k in ("address", "localizer.address", "webapp.address")}
        log_dirs.append(base / "logs")
        nm_conf = {
            **common,
            **{f"yarn.nodemanager.{k}": f"{HOST}:{p}" for k, p in ports.items()},
            "yarn.nodemanager.hostname": HOST,
            "yarn.nodemanager.local-dirs": base / "local",
            "yarn.nodemanager.log-dirs": base / "logs",
            "yarn.nodemanager.resource.memory-mb": NM_MEMORY_MB,
            "yarn.nodemanager.resource.cpu-vcores": NM_VCORES,
            "yarn.nodemanager.container-executor.class": (
                "org.apache.hadoop.yarn.server.nodemanager.DefaultContainerExecutor"
            ),
            "yarn.nodemanager.vmem-check-enabled": "false",
            "yarn.nodemanager.pmem-check-enabled": "false",
            "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": 99,
            "yarn.nodemanager.sleep-delay-before-sigkill.ms": 250,
        }
        _write_conf(base / "conf", nm_conf, workdir)
        nms.append(YarnDaemon(f"nodemanager-{i}", workdir, base / "conf", NM_CLASS, "256m"))
        node_ids.append(f"localhost:{ports['address']}")
    backend = YarnClusterBackend(workdir, rm, nms)
    cluster = YarnCluster(
        backend,
        conf_dir=conf_dir,
        web_url=f"http://{HOST}:{rm_ports['webapp.']}",
        version=hadoop_yarn_version(),
        node_ids=node_ids,
        nm_log_dirs=log_dirs,
    )
    rm.ready = lambda: cluster.rest("info")["clusterInfo"]["state"] == "STARTED"
    for i, nm in enumerate(nms):
        nm.ready = lambda i=i: cluster.node_state(i) == "RUNNING"
    try:
        backend.start()
    except (HarnessError, TimeoutError):
        backend.close()
        raise
    return cluster
