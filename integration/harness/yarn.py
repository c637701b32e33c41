"""A YARN cluster for integration tests: one ResourceManager and two NodeManagers.

Each daemon is its own JVM (``java -cp <conf dir>:<jars>/* ...ResourceManager|NodeManager``,
jars of pyspark's Hadoop release from :func:`~.cache.hadoop_yarn_jars`) in its own process
group with its own log, on free loopback ports; each NodeManager has its own conf, local and
log dirs. Containers run as this user (``DefaultContainerExecutor``, each in a session of
its own). Readiness and state come from the RM's REST API (``/ws/v1/cluster``).
:meth:`YarnCluster.submit` runs pyspark's own ``spark-submit --master yarn --deploy-mode
cluster`` with Spark's jars and Python zips used in place (``local:``).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochal.startup.classdata import SHORT_LIVED_JVM, SHORT_LIVED_JVM_OPTIONS

from . import yarn_conf
from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    _descendants,
    _proc_stat,
    free_ports,
    make_temp_dir,
    remove_temp_dir,
    tail_file,
    wait_until,
)
from .cache import hadoop_yarn_jars, hadoop_yarn_version, pyspark_home, require_java
from .server import Backend, LocalBackend, Server
from .yarn_conf import AM_EXPIRY_MS, NM_EXPIRY_MS, NM_PORTS, RM_PORTS, write_conf

JVM_OPTS = [*SHORT_LIVED_JVM, "-XX:+ExitOnOutOfMemoryError", "-Djava.net.preferIPv4Stack=true"]
RM_CLASS = "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager"
NM_CLASS = "org.apache.hadoop.yarn.server.nodemanager.NodeManager"
AM_CLASS = "org.apache.spark.deploy.yarn.ApplicationMaster"
FINAL_STATES = ("FINISHED", "FAILED", "KILLED")


def _proc_text(pid: int, name: str) -> str:
    """``/proc/<pid>/<name>`` with NULs as newlines ("" if unreadable)."""
    try:
        data = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return ""
    return data.replace(b"\0", b"\n").decode("utf-8", "replace")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a stopped one is alive)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def container_processes(prefix: str) -> list[int]:
    """Pids whose environment has ``CONTAINER_ID=<prefix>...``, with their descendants."""
    found: set[int] = set()
    for pid in (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()):
        if f"\nCONTAINER_ID={prefix}" in "\n" + _proc_text(pid, "environ"):
            found.update([pid, *_descendants(pid)])
    return sorted(found)


def kill_containers(which: Callable[[str], bool]) -> None:
    """SIGKILL the container processes whose environment (one text) ``which`` selects."""
    for pid in container_processes("container_"):
        if which(_proc_text(pid, "environ")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stale(env: str) -> bool:
    """A container of a cluster whose directory is gone (its harness run was SIGKILLed)."""
    found = re.search(r"(/[^\s:=]*/epochal-yarn-[^/\s:]+)/", env)
    return found is not None and not Path(found[1]).is_dir()


class YarnDaemon(LocalBackend):
    """A ResourceManager or NodeManager JVM; ready when ``ready()`` (set by the cluster) is."""

    start_timeout = 120.0

    def __init__(self, name: str, workdir: Path, conf: Path, main: str, heap: str) -> None:
        java = require_java()
        logs = workdir / f"{name}-logs"
        argv = [java, f"-Xmx{heap}", *JVM_OPTS, f"-Dhadoop.log.dir={logs}", "-cp"]
        argv += [f"{conf}:{hadoop_yarn_jars()}/*", main]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HADOOP_", "YARN_"))}
        env["JAVA_HOME"] = str(Path(java).resolve().parents[1])  # containers run it
        process = ManagedProcess(name, argv, workdir / f"{name}.log", env=env, cwd=workdir)
        super().__init__(name, workdir, process)
        self.ready = lambda: False

    def probe(self) -> bool:
        """Whether the RM reports this daemon ready."""
        return bool(self.ready())

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the JVM alone (not its process group)."""
        if self.process.pid is None:
            raise HarnessError(f"{self.name} is not running")
        os.kill(self.process.pid, signum)

    def close(self) -> None:
        """Kill the daemon (the cluster removes the directory)."""
        with self._lock:
            self.process.forget()


class YarnClusterBackend(Backend):
    """The RM and its NMs handled as one server; it also kills leftover containers."""

    supports_faults = True

    def __init__(self, workdir: Path, rm: YarnDaemon, nms: list[YarnDaemon]) -> None:
        self.name = "yarn-cluster"
        self.workdir = workdir
        self.rm = rm
        self.nms = nms
        self.daemons = [*nms, rm]  # stopping order
        self.submissions: list[subprocess.Popen[bytes]] = []
        self._lock = threading.RLock()

    def start(self) -> None:
        """Start whatever is not running (the NMs retry until the RM listens), resume paused
        NMs; await all."""
        with self._lock:
            for daemon in reversed(self.daemons):
                if daemon.process.running:
                    daemon.signal(signal.SIGCONT)
                else:
                    daemon.process.start()
            for daemon in reversed(self.daemons):
                daemon.wait_ready()

    def stop(self) -> None:
        """Stop the NMs (they stop their containers), then the RM."""
        with self._lock:
            for daemon in self.daemons:
                with contextlib.suppress(HarnessError):
                    daemon.signal(signal.SIGCONT)
                daemon.stop()
            self.kill_containers()

    def kill(self) -> None:
        """SIGKILL every daemon and every container process."""
        with self._lock:
            for daemon in self.daemons:
                daemon.kill()
            self.kill_containers()

    def kill_containers(self) -> None:
        """SIGKILL the processes of this cluster's containers (they are in other sessions)."""
        kill_containers(lambda env: str(self.workdir) in env)

    def is_running(self) -> bool:
        """Whether every daemon process is alive (a paused NM counts as alive)."""
        return all(daemon.is_running() for daemon in self.daemons)

    def log_tail(self, lines: int = 80) -> str:
        """The tails of the daemons' logs."""
        each = max(10, lines // len(self.daemons))
        return "\n".join(f"--- {d.name}\n{d.log_tail(each)}" for d in reversed(self.daemons))

    def close(self) -> None:
        """Kill submissions, daemons and containers; remove the cluster's directory."""
        with self._lock:
            try:
                for proc in self.submissions:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
                for daemon in self.daemons:
                    daemon.close()
                self.kill_containers()
            finally:
                remove_temp_dir(self.workdir)


class Submission(subprocess.Popen[bytes]):
    """A running ``spark-submit``: ``tag`` (its ``spark.yarn.tags``), ``log_path``."""

    def __init__(self, argv: list[str], env: dict[str, str], tag: str, log_path: Path) -> None:
        self.tag, self.log_path = tag, log_path
        with log_path.open("wb") as log:
            super().__init__(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def log_tail(self, lines: int = 40) -> str:
        """The tail of spark-submit's output."""
        return tail_file(self.log_path, lines)


@dataclass
class YarnCluster(Server):
    """The local YARN cluster provided by ``yarn_cluster``: REST views, faults, submission.

    NMs are named by index (0, 1); ``node_ids[i]`` is NM ``i``'s RM node id (``host:port``).
    """

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
        """GET ``<RM>/ws/v1/cluster/<path>`` as JSON."""
        with urllib.request.urlopen(f"{self.web_url}/ws/v1/cluster/{path}", timeout=5) as r:
            return dict(json.loads(r.read().decode()))

    def _list(self, path: str, outer: str, inner: str) -> list[dict[str, Any]]:
        return list((self.rest(path).get(outer) or {}).get(inner) or [])

    def nodes(self) -> list[dict[str, Any]]:
        """The RM's node reports (every state)."""
        return self._list("nodes", "nodes", "node")

    def node_index(self, node_id: str) -> int:
        """The index of the NM with RM node id ``node_id`` (matched by port)."""
        return [n.rsplit(":", 1)[1] for n in self.node_ids].index(node_id.rsplit(":", 1)[1])

    def node_state(self, index: int) -> str:
        """The RM's state of NM ``index``: ``RUNNING``, ``LOST``, ... or ``ABSENT``."""
        states = [n["state"] for n in self.nodes() if self.node_index(n["id"]) == index]
        return str(states[-1]) if states else "ABSENT"

    def pause_node(self, index: int) -> None:
        """SIGSTOP NM ``index``'s JVM only: its containers keep running, it stops heartbeating."""
        self._backend.nms[index].signal(signal.SIGSTOP)

    def resume_node(self, index: int) -> None:
        """SIGCONT NM ``index``'s JVM."""
        self._backend.nms[index].signal(signal.SIGCONT)

    def applications(self) -> list[dict[str, Any]]:
        """The RM's application reports."""
        return self._list("apps", "apps", "app")

    def app(self, app_id: str) -> dict[str, Any]:
        """The RM's report of one application (``state``, ``finalStatus``, ...)."""
        return dict(self.rest(f"apps/{app_id}")["app"])

    def app_state(self, app_id: str) -> str:
        """``ACCEPTED``, ``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``, ..."""
        return str(self.app(app_id)["state"])

    def attempts(self, app_id: str) -> list[dict[str, Any]]:
        """The attempts, oldest first (``id``, ``containerId``, ``nodeId``, ``startTime``...)."""
        found = self._list(f"apps/{app_id}/appattempts", "appAttempts", "appAttempt")
        return sorted(found, key=lambda a: int(a["id"]))

    def wait_for_attempt(self, app_id: str, n: int, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until attempt ``n`` has its AM container on a node; return the attempt."""

        def found() -> dict[str, Any] | None:
            attempt = next((a for a in self.attempts(app_id) if int(a["id"]) == n), {})
            if attempt.get("nodeId"):
                return attempt
            if self.app_state(app_id) in FINAL_STATES:
                raise HarnessError(f"{app_id} ended before attempt {n}:\n{self.logs(app_id)}")
            return None

        return wait_until(
            found, timeout, f"attempt {n} of {app_id}", on_timeout=lambda: self.logs(app_id)
        )

    def am_node(self, app_id: str) -> int:
        """The index of the NM hosting the newest attempt's AM container."""
        return self.node_index(self.attempts(app_id)[-1]["nodeId"])

    def container_pids(self, app_or_container_id: str) -> list[int]:
        """The processes of a container, or of all containers of an application, on this host."""
        prefix = app_or_container_id
        if prefix.startswith("application_"):
            prefix = "container_" + prefix.removeprefix("application_") + "_"
        return container_processes(prefix)

    def am_pid(self, app_id: str, attempt: int | None = None) -> int | None:
        """The AM JVM (the driver, in cluster mode) of attempt ``attempt`` (default: newest)."""
        attempts = self.attempts(app_id)
        chosen = attempts[-1] if attempt is None else attempts[attempt - 1]
        for pid in self.container_pids(chosen["containerId"]):
            argv = _proc_text(pid, "cmdline").split("\n")
            if argv[0].endswith("/java") and AM_CLASS in argv:  # not the bash -c around it
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
        """Have the RM kill the application (REST ``PUT .../state``)."""
        request = urllib.request.Request(
            f"{self.web_url}/ws/v1/cluster/apps/{app_id}/state?user.name={getpass.getuser()}",
            data=b'{"state": "KILLED"}',
            headers={"Content-Type": "application/json"},
            method="PUT",
        )
        urllib.request.urlopen(request, timeout=10).close()

    def logs(self, app_id: str, lines: int = 30) -> str:
        """Tails of the containers' ``stdout``/``stderr`` in the NMs' log dirs."""
        paths = [(d, p) for d in self.nm_log_dirs for p in sorted(d.glob(f"{app_id}/*/std*"))]
        parts = [f"--- {p.relative_to(d)}\n{tail_file(p, lines)}" for d, p in paths]
        return "\n".join(parts) or f"<no container logs of {app_id}>"

    def submit_conf(self, tag: str = "", wait: bool = False) -> dict[str, str]:
        """Default Spark settings of :meth:`submit` (the caller's ``conf`` overrides them)."""
        env = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": HOST}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return {
            "spark.yarn.jars": f"local:{pyspark_home() / 'jars'}/*",
            "spark.yarn.stagingDir": f"file://{self._backend.workdir / 'staging'}",
            "spark.yarn.submit.waitAppCompletion": str(wait).lower(),
            "spark.yarn.tags": tag,
            "spark.pyspark.python": sys.executable,
            **{f"spark.yarn.appMasterEnv.{k}": v for k, v in env.items()},
            **{f"spark.executorEnv.{k}": v for k, v in env.items()},
            "spark.driver.memory": "512m",
            "spark.executor.memory": "512m",
            "spark.executor.instances": "1",
            "spark.executor.cores": "1",
            "spark.ui.enabled": "false",
            # the application master (the driver) and the executor live for minutes
            "spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS,
            "spark.executor.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS,
        }

    def submit(
        self,
        app_path: str | Path,
        args: Sequence[str] = (),
        conf: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        wait: bool = False,
    ) -> Submission:
        """``spark-submit --master yarn --deploy-mode cluster app_path args`` (a Popen).

        ``wait`` is ``spark.yarn.submit.waitAppCompletion``: with ``False`` spark-submit
        exits once YARN accepted the application. :meth:`app_id_of` finds its id.
        """
        home = pyspark_home()
        tag = f"epochal-{uuid.uuid4().hex[:12]}"
        argv = [str(home / "bin" / "spark-submit"), "--master", "yarn", "--deploy-mode", "cluster"]
        for key, value in {**self.submit_conf(tag, wait), **(conf or {})}.items():
            argv += ["--conf", f"{key}={value}"]
        zips = sorted((home / "python" / "lib").glob("*.zip"))  # pyspark.zip, py4j-*.zip
        full_env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "HADOOP_CONF_DIR": str(self.conf_dir),
            "YARN_CONF_DIR": str(self.conf_dir),
            "PYSPARK_ARCHIVES_PATH": ",".join(f"local:{z}" for z in zips),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": HOST,
            **(env or {}),
        }
        argv += ["--name", tag, str(app_path), *map(str, args)]
        proc = Submission(argv, full_env, tag, self._backend.workdir / f"submit-{tag}.log")
        self._backend.submissions.append(proc)
        return proc

    def app_id_of(self, proc: Submission, timeout: float = 60.0) -> str:
        """The application id of a :meth:`submit` (found on the RM by its tag)."""

        def found() -> str | None:
            apps = [a for a in self.applications() if proc.tag in a.get("applicationTags", "")]
            if not apps and proc.poll() is not None:
                raise HarnessError(f"spark-submit exited {proc.returncode}:\n{proc.log_tail()}")
            return str(apps[0]["id"]) if apps else None

        return wait_until(found, timeout, f"application {proc.tag}", on_timeout=proc.log_tail)


def start_yarn_cluster(
    nodes: int = 2, nm_expiry_ms: int = NM_EXPIRY_MS, am_expiry_ms: int = AM_EXPIRY_MS
) -> YarnCluster:
    """A ResourceManager and ``nodes`` NodeManagers, all RUNNING; liveness expiries settable."""
    workdir = make_temp_dir("epochal-yarn-")  # removes the directories of dead runs
    kill_containers(_stale)  # whose containers outlived their NodeManagers
    (workdir / "http-secret").write_text(uuid.uuid4().hex)
    picked = iter(free_ports(len(RM_PORTS) + nodes * len(NM_PORTS)))
    rm_ports = {k: next(picked) for k in RM_PORTS}
    common = yarn_conf.rm_settings(rm_ports, nm_expiry_ms, am_expiry_ms)
    conf = write_conf(workdir / "conf", common, workdir)
    daemons = [YarnDaemon("resourcemanager", workdir, conf, RM_CLASS, "384m")]
    node_ids = []
    for i in range(nodes):
        ports = {k: next(picked) for k in NM_PORTS}
        base = workdir / f"nm-{i}"
        nm_conf = write_conf(base / "conf", yarn_conf.nm_settings(common, base, ports), workdir)
        daemons.append(YarnDaemon(f"nodemanager-{i}", workdir, nm_conf, NM_CLASS, "256m"))
        node_ids.append(f"{HOST}:{ports['address']}")
    backend = YarnClusterBackend(workdir, daemons[0], daemons[1:])
    cluster = YarnCluster(
        backend,
        conf_dir=conf,
        web_url=f"http://{HOST}:{rm_ports['webapp.']}",
        version=hadoop_yarn_version(),
        node_ids=node_ids,
        nm_log_dirs=[workdir / f"nm-{i}" / "logs" for i in range(nodes)],
    )
    daemons[0].ready = lambda: cluster.rest("info")["clusterInfo"]["state"] == "STARTED"
    for i, daemon in enumerate(daemons[1:]):
        daemon.ready = lambda i=i: cluster.node_state(i) == "RUNNING"
    try:
        backend.start()
        # the RM's own names of the nodes (``localhost:<port>``)
        cluster.node_ids = sorted((n["id"] for n in cluster.nodes()), key=cluster.node_index)
    except (HarnessError, TimeoutError):
        backend.close()
        raise
    return cluster
