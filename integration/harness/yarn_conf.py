"""Configuration files of the local YARN cluster (:mod:`integration.harness.yarn`).

One conf dir for the ResourceManager and for clients (``HADOOP_CONF_DIR`` of
spark-submit), one per NodeManager (adds its own ports and directories). Each holds
``core-site.xml``, ``yarn-site.xml``, ``capacity-scheduler.xml`` and ``log4j.properties``
(the daemons log through reload4j to stdout). Everything listens on loopback ports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._process import HOST

NM_MEMORY_MB = 3072
NM_VCORES = 2
MIN_ALLOCATION_MB = 256
AM_MAX_ATTEMPTS = 4
#: The RM declares a NodeManager LOST after this long without a heartbeat (default 600 s).
NM_EXPIRY_MS = 10_000
#: The RM fails an attempt whose AM has not called it for this long (default 600 s). A Spark
#: AM registers only once its SparkContext is up: 10 s proved too short on a busy machine.
AM_EXPIRY_MS = 30_000
RM_PORTS = ("", "scheduler.", "resource-tracker.", "admin.", "webapp.")
NM_PORTS = ("address", "localizer.address", "webapp.address")
LOG4J = """log4j.rootLogger=INFO,console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.out
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{1}: %m%n
"""
RM = "yarn.resourcemanager"
NM = "yarn.nodemanager"


def _xml(props: dict[str, Any]) -> str:
    rows = "".join(
        f"<property><name>{k}</name><value>{v}</value></property>\n" for k, v in props.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{rows}</configuration>\n'


def write_conf(conf: Path, yarn: dict[str, Any], workdir: Path) -> Path:
    """Write a conf dir: ``yarn`` as yarn-site, file:/// as the default file system, the
    REST API's ``?user.name=`` (simple authentication), one ``default`` queue. Returns it."""
    conf.mkdir(parents=True, exist_ok=True)
    http = "hadoop.http.authentication"
    core = {
        "fs.defaultFS": "file:///",
        "hadoop.tmp.dir": workdir / "hadoop-tmp",
        "hadoop.http.filter.initializers": "org.apache.hadoop.security."
        "AuthenticationFilterInitializer",
        f"{http}.type": "simple",
        f"{http}.simple.anonymous.allowed": "true",
        f"{http}.signature.secret.file": workdir / "http-secret",
    }
    queue = "yarn.scheduler.capacity.root"
    capacity = {f"{queue}.queues": "default", f"{queue}.default.capacity": 100}
    capacity["yarn.scheduler.capacity.maximum-am-resource-percent"] = 0.5
    files = {"core-site": core, "yarn-site": yarn, "capacity-scheduler": capacity}
    for name, props in files.items():
        (conf / f"{name}.xml").write_text(_xml(props))
    (conf / "log4j.properties").write_text(LOG4J)
    return conf


def rm_settings(ports: dict[str, int], nm_expiry_ms: int, am_expiry_ms: int) -> dict[str, Any]:
    """yarn-site of the RM and of clients; ``ports`` maps :data:`RM_PORTS` to ports."""
    return {
        f"{RM}.hostname": HOST,
        **{f"{RM}.{k}address": f"{HOST}:{port}" for k, port in ports.items()},
        f"{RM}.am.max-attempts": AM_MAX_ATTEMPTS,
        "yarn.nm.liveness-monitor.expiry-interval-ms": nm_expiry_ms,
        f"{RM}.nm.liveness-monitor.interval-ms": 500,
        "yarn.am.liveness-monitor.expiry-interval-ms": am_expiry_ms,
        f"{RM}.nodemanagers.heartbeat-interval-ms": 1000,
        f"{RM}.connect.retry-interval.ms": 500,  # default 30 s: an NM started first waits
        "yarn.scheduler.minimum-allocation-mb": MIN_ALLOCATION_MB,
        "yarn.scheduler.maximum-allocation-mb": NM_MEMORY_MB,
        "yarn.log-aggregation-enable": "false",
    }


def nm_settings(common: dict[str, Any], base: Path, ports: dict[str, int]) -> dict[str, Any]:
    """yarn-site of one NM: ``common`` plus its ports (:data:`NM_PORTS`) and dirs in ``base``."""
    return {
        **common,
        **{f"{NM}.{k}": f"{HOST}:{port}" for k, port in ports.items()},
        f"{NM}.hostname": HOST,
        f"{NM}.local-dirs": base / "local",
        f"{NM}.log-dirs": base / "logs",
        f"{NM}.resource.memory-mb": NM_MEMORY_MB,
        f"{NM}.resource.cpu-vcores": NM_VCORES,
        f"{NM}.container-executor.class": "org.apache.hadoop.yarn.server.nodemanager."
        "DefaultContainerExecutor",  # containers run as this user, even root
        f"{NM}.vmem-check-enabled": "false",
        f"{NM}.pmem-check-enabled": "false",
        f"{NM}.disk-health-checker.max-disk-utilization-per-disk-percentage": 99,
        f"{NM}.sleep-delay-before-sigkill.ms": 250,
    }
