"""Spark Connect for integration tests: a Spark Connect server run from the pyspark package.

The pyspark distribution is a Spark distribution (``jars/`` with
``spark-connect_2.13-<v>.jar``, ``bin/spark-submit``), so the server is started the way
``sbin/start-connect-server.sh`` does it, but in the foreground and in its own process group:
``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` with a
``local[2]`` master, listening on a free loopback port. Its Python workers run this
interpreter (``PYSPARK_PYTHON``), where the epochal packages are installed, so Spark's data
source lookup registers ``epochal.<name>`` on the server (the ``pyspark_epochal_*``
packages): clients use ``format("epochal.kafka")`` without importing epochal.

The server is the Spark driver of every query its clients start. It runs with its own
``EPOCHAL_RUN_TOKEN``, as a driver started by ``epochal run`` does, so an epochal *driver*
crash point (``.option("epochal.faults", "sink.after_decision@1")``) kills the whole server
(JVM and Python workers) with SIGKILL, like a crashed driver; ``start()`` brings it back on
the same port.

Readiness is checked through the real client: a Spark Connect session runs ``SELECT 1``.
``EPOCHAL_SPARK_CONNECT_URL=sc://host:port`` uses a server that is already running (it must
have epochal installed in its Python; no fault controls).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.startup.classdata import SHORT_LIVED_JVM_OPTIONS

from ._process import (
    HOST,
    ManagedProcess,
    PrerequisiteError,
    free_port,
    make_temp_dir,
    port_open,
    wait_until,
)
from .cache import require_java
from .server import ExternalBackend, LocalBackend, Server

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
EXTERNAL_ENV = "EPOCHAL_SPARK_CONNECT_URL"
RUN_TOKEN_ENV = "EPOCHAL_RUN_TOKEN"
"""Marks every process of one epochal driver run; driver crash points kill them all."""
DRIVER_MEMORY = "1g"

_LOG4J2 = """rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
logger.connect.name = org.apache.spark.sql.connect
logger.connect.level = info
logger.python.name = org.apache.spark.sql.execution.datasources.v2.python
logger.python.level = info
"""


def pyspark_home() -> Path:
    """The installed pyspark package: a Spark distribution with ``bin/`` and ``jars/``."""
    try:
        import pyspark
    except ImportError as exc:
        raise PrerequisiteError(
            "the Spark Connect server needs pyspark (pip install pyspark)"
        ) from exc
    home = Path(pyspark.__file__).resolve().parent
    if not list((home / "jars").glob("spark-connect_*.jar")):
        raise PrerequisiteError(
            f"pyspark at {home} has no jars/spark-connect_*.jar: install pyspark 4 from PyPI "
            "(pip install 'pyspark==4.3.*')"
        )
    return home


def require_connect_client() -> Any:
    """The Spark Connect client's ``SparkSession``; a clear error when its packages lack."""
    import pyspark

    try:
        import grpc  # noqa: F401 - the client's packages, named in the error when missing
        import grpc_status  # noqa: F401
        import zstandard  # noqa: F401
        from pyspark.sql.connect.session import SparkSession
    except ImportError as exc:
        raise PrerequisiteError(
            f"the Spark Connect client needs its packages ({exc}): "
            f"pip install 'pyspark[connect]=={pyspark.__version__}' (scripts/install.py does)"
        ) from exc
    return SparkSession


def require_discoverable_formats() -> list[str]:
    """The ``pyspark_epochal_*`` packages Spark's lookup will find in this interpreter (the
    server's Python); a clear error when there are none."""
    import pkgutil

    found = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_epochal"))
    if not found:
        raise PrerequisiteError(
            f"no pyspark_epochal_* package is visible on sys.path of {sys.executable}, so the "
            "Spark Connect server would not register epochal's formats: install the packages "
            "with `python3 scripts/install.py` (editable installs in compat mode) or as wheels"
        )
    return found


def new_session(url: str, retry_seconds: float = 15.0) -> Any:
    """A new Spark Connect session on ``url`` (``sc://host:port``); stop it when done.

    Its calls retry an unavailable server for about ``retry_seconds`` (exponential backoff),
    not the client's default of at least 10 minutes: a test whose server died fails soon.
    """
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session = require_connect_client().builder.remote(url).create()
    retries, waited, backoff = 0, 0.0, 0.2
    while waited + backoff <= retry_seconds:
        retries, waited, backoff = retries + 1, waited + backoff, backoff * 2
    session.client.set_retry_policies(
        [DefaultPolicy(max_retries=retries, backoff_multiplier=2.0, initial_backoff=200)]
    )
    return session


def connect_ready(url: str) -> bool:
    """One readiness probe: a new session runs ``SELECT 1`` (retrying for a few seconds)."""
    session = new_session(url, retry_seconds=3.0)
    try:
        return bool(session.sql("SELECT 1 AS one").collect()[0].one == 1)
    finally:
        with contextlib.suppress(Exception):
            session.stop()


def _server_env(home: Path, conf_dir: Path) -> dict[str, str]:
    """The server's environment: this interpreter for Python workers, no epochal job."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EPOCHAL_", "SPARK_", "PYSPARK_")) and k != "PYTHONSTARTUP"
    }
    env.update(
        {
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            RUN_TOKEN_ENV: uuid.uuid4().hex,
        }
    )
    return env


class LocalSparkConnect(LocalBackend):
    """A Spark Connect server (the driver JVM and its Python workers) in a temporary dir."""

    start_timeout = 180.0

    def __init__(self, master: str = "local[2]") -> None:
        require_java()
        require_connect_client()
        require_discoverable_formats()
        home = pyspark_home()
        workdir = make_temp_dir("epochal-connect-")
        self.port = free_port()
        self.master = master
        conf_dir = workdir / "conf"
        conf_dir.mkdir()
        (conf_dir / "log4j2.properties").write_text(_LOG4J2)
        confs = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS,  # a test's server
            "spark.sql.shuffle.partitions": "4",
            "spark.local.dir": str(workdir / "tmp"),
            "spark.sql.warehouse.dir": str(workdir / "warehouse"),
            "spark.sql.streaming.stateStore.providerClass": (
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
            ),
        }
        argv = [
            str(home / "bin" / "spark-submit"),
            "--class",
            CONNECT_SERVER_CLASS,
            "--name",
            "epochal-spark-connect",
            "--master",
            master,
            "--driver-memory",
            DRIVER_MEMORY,
        ]
        for key, value in confs.items():
            argv += ["--conf", f"{key}={value}"]
        process = ManagedProcess(
            name="spark-connect",
            argv=argv,
            log_path=workdir / "server.log",
            env=_server_env(home, conf_dir),
            cwd=workdir,
            stop_timeout=30,
        )
        super().__init__("spark-connect", workdir, process)

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:<port>``."""
        return f"sc://{HOST}:{self.port}"

    def probe(self) -> bool:
        """The gRPC port accepts connections and a client session runs ``SELECT 1``."""
        return port_open(HOST, self.port) and connect_ready(self.url)


@dataclass
class SparkConnectServer(Server):
    """Connection info and controls of the server provided by ``spark_connect_server``.

    ``url`` is the ``sc://`` address; :meth:`session` opens a client session. The server's
    data lives in its temporary directory; checkpoints and snapshot directories that tests
    give their queries (e.g. under ``tmp_path``) survive ``kill()``/``start()``.
    """

    url: str = ""
    version: str = ""

    def session(self) -> Any:
        """A new Spark Connect client session; stop it when done (see :meth:`sessions`)."""
        return new_session(self.url)

    @contextlib.contextmanager
    def sessions(self) -> Iterator[Any]:
        """A client session for a ``with`` block, stopped at its end (ignoring a dead server)."""
        session = self.session()
        try:
            yield session
        finally:
            with contextlib.suppress(Exception):
                session.stop()

    def wait_stopped(self, timeout: float) -> None:
        """Wait until the server process is gone (e.g. after a crash point killed it)."""
        wait_until(
            lambda: not self.running,
            timeout,
            "the Spark Connect server to exit",
            on_timeout=lambda: self.log_tail(40),
        )


def start_spark_connect() -> SparkConnectServer:
    """Provide a Spark Connect server: ``$EPOCHAL_SPARK_CONNECT_URL``, else a local one."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        wait_until(lambda: connect_ready(external), 60, f"Spark Connect at {EXTERNAL_ENV}")
        backend = ExternalBackend("spark-connect", EXTERNAL_ENV)
        return SparkConnectServer(backend, url=external, version="external")
    import pyspark

    local = LocalSparkConnect()
    try:
        local.start()
    except BaseException:
        local.close()
        raise
    return SparkConnectServer(local, url=local.url, version=pyspark.__version__)
