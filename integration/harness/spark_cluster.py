"""A Spark standalone cluster for integration tests: one master and two workers.

They run from the pyspark distribution (``<pyspark>/jars``), each as its own JVM
(``java -cp '<pyspark>/jars/*' org.apache.spark.deploy.{master.Master,worker.Worker}``) in
its own process group with its own log, on free loopback ports. A worker launches its
executors as child processes (in its process group), so :meth:`SparkCluster.kill_worker`
takes the worker's executors and their Python workers down with it, like a lost node.

Readiness is read from the master's JSON endpoint (``http://127.0.0.1:<webui>/json/``): the
master is ready when its ``status`` is ``ALIVE``, a worker when the master lists it
``ALIVE``. Workers run Python tasks with this interpreter (``PYSPARK_PYTHON``) and its
installed packages (the epochal packages are installed editable in it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochal.startup.classdata import SHORT_LIVED_JVM
from epochal.startup.home import fast_spark_home

from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    free_port,
    make_temp_dir,
    port_open,
    remove_temp_dir,
    tail_file,
    wait_until,
)
from .cache import pyspark_home, require_java
from .server import Backend, LocalBackend, Server

#: Heap of the master and worker daemons (Spark's default is 1 GiB each).
DAEMON_JVM_OPTS = ["-Xms64m", "-Xmx256m", *SHORT_LIVED_JVM, "-XX:+ExitOnOutOfMemoryError"]
#: The master declares a silent worker dead after this many seconds (default 60). A killed
#: worker is noticed at once anyway (its connection drops); this bounds a hung one.
WORKER_TIMEOUT_S = 10
WORKER_CORES = 1
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def pyspark_version() -> str:
    """The installed pyspark's version (the cluster runs the same Spark)."""
    import pyspark

    return str(pyspark.__version__)


def master_state(web_url: str, timeout: float = 3.0) -> dict[str, Any]:
    """The master's ``/json/`` document: workers, their state, applications."""
    with urllib.request.urlopen(f"{web_url}/json/", timeout=timeout) as response:
        return dict(json.loads(response.read().decode()))


def scala_version(home: Path) -> str:
    """The Scala binary version of the distribution (``2.13``), from ``spark-core_<v>-*.jar``."""
    for jar in sorted((home / "jars").glob("spark-core_*.jar")):
        return jar.name.removeprefix("spark-core_").split("-", 1)[0]
    raise HarnessError(f"no spark-core_*.jar in {home / 'jars'}")


def _daemon_env(home: Path) -> dict[str, str]:
    """Environment of the daemons (and, inherited, of executors and Python workers)."""
    env = dict(os.environ)
    for name in ("SPARK_CONF_DIR", "SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS", "SPARK_DAEMON_OPTS"):
        env.pop(name, None)
    env.update(
        {
            # as epochal's drivers do: executors' Python workers import compiled PySpark
            "SPARK_HOME": fast_spark_home(str(home)),
            # What bin/load-spark-env.sh sets; without it a worker cannot build an executor's
            # command line ("Cannot find any build directories").
            "SPARK_SCALA_VERSION": scala_version(home),
            "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
    )
    return env


class SparkMaster(LocalBackend):
    """The standalone master JVM."""

    start_timeout = 90.0

    def __init__(self, workdir: Path, home: Path, java: str) -> None:
        self.port = free_port()
        self.webui_port = free_port()
        argv = [
            java,
            *DAEMON_JVM_OPTS,
            f"-Dspark.worker.timeout={WORKER_TIMEOUT_S}",
            # Else it listens on the fixed port 6066 (clashes with a second cluster).
            "-Dspark.master.rest.enabled=false",
            "-cp",
            f"{home / 'jars'}/*",
            MASTER_CLASS,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
        ]
        process = ManagedProcess(
            name="spark-master",
            argv=argv,
            log_path=workdir / "master.log",
            env=_daemon_env(home),
            cwd=workdir,
            stop_timeout=30,
        )
        super().__init__("spark-master", workdir, process)

    @property
    def url(self) -> str:
        """``spark://127.0.0.1:<port>``."""
        return f"spark://{HOST}:{self.port}"

    @property
    def web_url(self) -> str:
        """The master's web UI, ``http://127.0.0.1:<webui-port>``."""
        return f"http://{HOST}:{self.webui_port}"

    def probe(self) -> bool:
        """The JSON endpoint answers with status ``ALIVE``."""
        return port_open(HOST, self.webui_port) and master_state(self.web_url)["status"] == "ALIVE"

    def close(self) -> None:
        """Kill the master (the cluster's directory is removed by the cluster)."""
        with self._lock:
            self.process.forget()


class SparkWorker(LocalBackend):
    """One worker JVM; ready when the master lists it ``ALIVE``."""

    start_timeout = 90.0

    def __init__(self, index: int, master: SparkMaster, workdir: Path, home: Path, java: str):
        self.index = index
        self.master = master
        self.port = free_port()
        self.webui_port = free_port()
        self.work_dir = workdir / f"worker-{index}"
        self.work_dir.mkdir()
        argv = [
            java,
            *DAEMON_JVM_OPTS,
            # The worker derives its heartbeat interval from this (timeout / 4).
            f"-Dspark.worker.timeout={WORKER_TIMEOUT_S}",
            "-cp",
            f"{home / 'jars'}/*",
            WORKER_CLASS,
            master.url,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
            "--cores",
            str(WORKER_CORES),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(self.work_dir),
        ]
        name = f"spark-worker-{index}"
        process = ManagedProcess(
            name=name,
            argv=argv,
            log_path=workdir / f"{name}.log",
            env=_daemon_env(home),
            cwd=self.work_dir,
            stop_timeout=30,
        )
        super().__init__(name, workdir, process)

    def entry(self) -> dict[str, Any] | None:
        """The master's newest entry for this worker's address, if any."""
        workers = [
            w
            for w in master_state(self.master.web_url).get("workers", [])
            if w.get("host") == HOST and int(w.get("port", -1)) == self.port
        ]
        return max(workers, key=lambda w: str(w.get("id", "")), default=None)

    def state(self) -> str:
        """``ALIVE``, ``DEAD``, … as the master sees this worker; ``ABSENT`` if unlisted."""
        entry = self.entry()
        return str(entry.get("state")) if entry else "ABSENT"

    def probe(self) -> bool:
        """The master lists this worker ``ALIVE``."""
        return self.state() == "ALIVE"

    def launch(self) -> None:
        """Start the worker process (without awaiting it) once the master no longer counts
        its address as alive.

        A worker that re-registers from an address the master still lists ``ALIVE`` is
        refused and exits, so after a kill wait until the master noticed (usually at once:
        the connection drops; at most ``spark.worker.timeout`` later).
        """
        with self._lock:
            if self.process.running:
                return
            wait_until(
                lambda: self.state() != "ALIVE",
                WORKER_TIMEOUT_S * 3,
                f"the master to drop {self.name}'s previous registration",
            )
            self.process.start()

    def start(self) -> None:
        """Start the worker (see :meth:`launch`) and wait until the master lists it ALIVE."""
        with self._lock:
            self.launch()
            self.wait_ready()

    def executor_logs(self, lines: int = 20) -> str:
        """The tails of the newest executor's ``stderr`` in this worker's work dir."""
        logs = sorted(self.work_dir.glob("app-*/*/stderr"), key=lambda p: p.stat().st_mtime)
        return "\n".join(f"--- {p}\n{tail_file(p, lines)}" for p in logs[-1:])

    def close(self) -> None:
        """Kill the worker and its executors (the cluster's directory is removed by the cluster)."""
        with self._lock:
            self.process.forget()


class SparkClusterBackend(Backend):
    """The master and its workers handled as one server (start all, await all)."""

    supports_faults = True

    def __init__(self, workdir: Path, master: SparkMaster, workers: list[SparkWorker]) -> None:
        self.name = "spark-cluster"
        self.workdir = workdir
        self.master = master
        self.workers = workers
        self._lock = threading.RLock()

    def start(self) -> None:
        """Start the master if needed, then every stopped worker (in parallel), and await all."""
        with self._lock:
            self.master.start()
            for worker in self.workers:
                worker.launch()
            for worker in self.workers:
                worker.wait_ready()

    def stop(self) -> None:
        """Stop the workers, then the master."""
        with self._lock:
            for worker in self.workers:
                worker.stop()
            self.master.stop()

    def kill(self) -> None:
        """SIGKILL every worker (with its executors) and the master."""
        with self._lock:
            for worker in self.workers:
                worker.kill()
            self.master.kill()

    def is_running(self) -> bool:
        """Whether the master and every worker process are alive."""
        return self.master.is_running() and all(w.is_running() for w in self.workers)

    def log_tail(self, lines: int = 80) -> str:
        """The tails of the master's and the workers' logs (and their newest executor's)."""
        each = max(10, lines // (1 + len(self.workers)))
        parts = [f"--- {self.master.name}\n{self.master.log_tail(each)}"]
        for worker in self.workers:
            parts.append(f"--- {worker.name}\n{worker.log_tail(each)}")
            executor = worker.executor_logs(each // 2)
            if executor:
                parts.append(executor)
        return "\n".join(parts)

    def close(self) -> None:
        """Kill everything and remove the cluster's directory."""
        with self._lock:
            try:
                for worker in self.workers:
                    with contextlib.suppress(HarnessError):
                        worker.close()
                self.master.close()
            finally:
                remove_temp_dir(self.workdir)


@dataclass
class WorkerHandle(Server):
    """One worker of :class:`SparkCluster`: ``kill()`` (SIGKILL, with its executors),
    ``start()`` (same ports; returns once the master lists it ``ALIVE``), ``state()``."""

    index: int = 0
    host: str = HOST
    port: int = 0
    webui_port: int = 0
    work_dir: Path = field(default_factory=Path)

    @property
    def worker(self) -> SparkWorker:
        """The backend running this worker."""
        assert isinstance(self.backend, SparkWorker)
        return self.backend

    @property
    def pid(self) -> int | None:
        """The worker JVM's process id while it runs (its executors are its descendants)."""
        return self.worker.process.pid

    def state(self) -> str:
        """The worker's state as the master sees it (``ALIVE``, ``DEAD``, ``ABSENT``)."""
        return self.worker.state()

    def executor_logs(self, lines: int = 20) -> str:
        """The tail of this worker's newest executor ``stderr``."""
        return self.worker.executor_logs(lines)


@dataclass
class SparkCluster(Server):
    """Connection info and controls of the standalone cluster provided by ``spark_cluster``.

    ``stop``/``kill``/``start`` act on the master and all workers; ``workers[i]`` (or
    :meth:`kill_worker`/:meth:`start_worker`) act on one worker.
    """

    master_url: str = ""
    master_web_url: str = ""
    version: str = ""
    workers: list[WorkerHandle] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` document."""
        return master_state(self.master_web_url)

    @property
    def alive_workers(self) -> int:
        """How many workers the master counts ``ALIVE`` now."""
        return int(self.state().get("aliveworkers", 0))

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` with its executors and their Python workers."""
        self.workers[index].kill()

    def start_worker(self, index: int) -> None:
        """Start worker ``index`` again on its ports; returns once the master lists it ALIVE."""
        self.workers[index].start()

    def wait_for_alive_workers(self, count: int, timeout: float = 60.0) -> None:
        """Wait until the master counts exactly ``count`` workers ``ALIVE``."""
        wait_until(
            lambda: self.alive_workers == count,
            timeout,
            f"{count} ALIVE workers on the master (now {self.alive_workers})",
        )

    def session_conf(self, executor_memory: str = EXECUTOR_MEMORY) -> dict[str, str]:
        """Spark settings for a driver on this cluster: one 1-core executor per worker.

        The driver process also needs :meth:`driver_env` in its environment: PySpark
        sends its ``PYSPARK_PYTHON`` to the executors as the Python to run.
        """
        return {
            "spark.master": self.master_url,
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.executor.cores": str(WORKER_CORES),
            "spark.executor.memory": executor_memory,
            "spark.cores.max": str(len(self.workers) * WORKER_CORES),
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "spark.ui.enabled": "false",
            # Do not start the first job before every executor registered (30 s at most).
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "30s",
        }

    @staticmethod
    def driver_env() -> dict[str, str]:
        """Environment for a driver process: this interpreter for Python tasks, loopback."""
        return {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": HOST,
        }


#: A driver run by :func:`driver_argv` prints its result on one line with this prefix.
RESULT_PREFIX = "EPOCHAL-DRIVER-RESULT "


def driver_argv(module: str, function: str, args: dict[str, Any]) -> list[str]:
    """Command running ``module.function(args)`` in a fresh Python process (a Spark driver).

    A driver in its own process gets its own JVM, started with exactly the settings it is
    given (class path, master), and dies without taking the test process with it. The
    function's JSON-able return value is printed as ``RESULT_PREFIX + json``; read it back
    with :func:`driver_result`. Run it with the repository root as the working directory.
    """
    code = (
        "import importlib, json, sys\n"
        f"function = getattr(importlib.import_module({module!r}), {function!r})\n"
        "result = function(json.loads(sys.argv[1]))\n"
        f"print({RESULT_PREFIX!r} + json.dumps(result), flush=True)\n"
    )
    return [sys.executable, "-c", code, json.dumps(args)]


def driver_result(output: str) -> dict[str, Any] | None:
    """The result a :func:`driver_argv` process printed, or ``None`` if it printed none."""
    lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    return dict(json.loads(lines[-1].removeprefix(RESULT_PREFIX))) if lines else None


def start_spark_cluster(workers: int = 2) -> SparkCluster:
    """A local standalone cluster: a master and ``workers`` workers, all ALIVE."""
    java = require_java()
    home = pyspark_home()
    workdir = make_temp_dir("epochal-spark-cluster-")
    master = SparkMaster(workdir, home, java)
    nodes = [SparkWorker(i, master, workdir, home, java) for i in range(workers)]
    backend = SparkClusterBackend(workdir, master, nodes)
    try:
        backend.start()
    except (HarnessError, TimeoutError):
        backend.close()
        raise
    handles = [
        WorkerHandle(
            node,
            index=node.index,
            port=node.port,
            webui_port=node.webui_port,
            work_dir=node.work_dir,
        )
        for node in nodes
    ]
    return SparkCluster(
        backend,
        master_url=master.url,
        master_web_url=master.web_url,
        version=pyspark_version(),
        workers=handles,
    )


def main() -> int:
    """``python -m integration.harness.spark_cluster``: run a cluster until Ctrl-C."""
    from ._process import cleanup_all

    cluster = start_spark_cluster()
    print(cluster, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.backend.close()
        cleanup_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
