"""A driver's SparkSession: what it is made of (:class:`SessionProfile`, fixed when its JVM
starts, so a warm driver can run any job with the same profile) and how it is built
(:func:`spark_session`): the fast Spark home, the class-data archive, the state files and
settings kept off the JVM's command line.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass
from typing import Any

from epochal.base import processes, secrets
from epochal.parts.registry import EXTRA_PLUGINS_ENV
from epochal.startup.home import python_of_spark
from epochal.state import objectstore, webhdfs
from epochal.state.jobs import JobRecord
from epochal_sdk.errors import STARTING_ENV


@dataclass(frozen=True)
class SessionProfile:
    """What a driver's SparkSession is made of, fixed when its JVM starts: the master, the
    Spark settings, the Python path of its workers and the extra plugin modules. A warm
    driver can run any job whose profile is the same."""

    master: str
    spark_conf: tuple[tuple[str, str], ...] = ()
    python_path: tuple[str, ...] = ()
    plugins: str = ""

    @classmethod
    def of(cls, record: JobRecord) -> SessionProfile:
        """The profile a job needs."""
        config = record.job_config
        return cls(
            config.master,
            tuple(sorted((str(k), str(v)) for k, v in config.spark_conf.items())),
            tuple(record.python_path),
            os.environ.get(EXTRA_PLUGINS_ENV, ""),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "master": self.master,
                "spark_conf": [list(item) for item in self.spark_conf],
                "python_path": list(self.python_path),
                "plugins": self.plugins,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> SessionProfile:
        data = json.loads(text)
        return cls(
            data["master"],
            tuple((k, v) for k, v in data["spark_conf"]),
            tuple(data["python_path"]),
            data.get("plugins", ""),
        )

    def environment(self) -> dict[str, str]:
        """What the driver process's environment must hold before its JVM starts."""
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {
            "PYTHONPATH": os.pathsep.join([*self.python_path, *inherited]),
            EXTRA_PLUGINS_ENV: self.plugins,
            STARTING_ENV: "0",  # the data source says when a check is the job's start
            **python_of_spark(),
        }


SHUFFLE_PARTITIONS = "4"
"""A driver's ``spark.sql.shuffle.partitions`` unless the job sets it (Spark's 200 would make
a stateful job on a few cores open hundreds of state partitions a batch)."""


def spark_session(profile: SessionProfile, app_name: str = "epochal") -> Any:
    """A SparkSession for a profile (its master, state store and settings).

    The profile's ``${env:NAME}``/``${file:PATH}`` references are resolved here, in the
    driver process. PySpark passes every setting it has before the JVM starts on the JVM's
    command line (``spark-submit --conf k=v``), which every user of the host can read; so a
    setting that is a reference or holds a secret (:func:`~epochal.base.secrets.
    is_secret_setting`) is given to Spark only once the JVM runs, through PySpark's gateway,
    before the SparkContext is made (what the context reads at its creation, ``spark.hadoop.*``
    included, acts as if it had been on the command line). Settings read when the JVM is
    launched (:data:`~epochal.config.JVM_LAUNCH_SETTINGS`) cannot be given that way; a job
    with a secret in one is refused when it is submitted."""
    from pyspark.sql import SparkSession

    from epochal.startup.classdata import driver_java_options
    from epochal.startup.home import use_fast_spark_home
    from epochal.startup.statefiles import session_conf

    use_fast_spark_home(profile.master)

    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": SHUFFLE_PARTITIONS,
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.executorEnv.PYSPARK_PYTHON": python_of_spark()["PYSPARK_PYTHON"],
        f"spark.executorEnv.{STARTING_ENV}": "0",
        "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "spark.sql.streaming.stopTimeout": "30s",
        # Hadoop's file systems apply their own umask to what they create (the checkpoint)
        "spark.hadoop.fs.permissions.umask-mode": "077",
    }
    token = os.environ.get(processes.RUN_TOKEN_ENV)
    if token:  # executors' Python workers carry the run token too (kill_run finds them)
        settings[f"spark.executorEnv.{processes.RUN_TOKEN_ENV}"] = token
    if profile.master.startswith("local-cluster"):
        settings.update({"spark.executor.memory": "600m", "spark.task.maxFailures": "4"})
    settings.update(objectstore.spark_conf())  # s3a:// checkpoints, executors' store
    settings.update(webhdfs.spark_conf())  # the executors' store on hdfs://
    settings.update(session_conf(profile.master))  # state files linked, not copied
    conf = dict(profile.spark_conf)
    private = private_settings(conf)
    settings.update({key: value for key, value in conf.items() if key not in private})
    # the class-data archive, when there is one (a faster JVM start)
    java_options = driver_java_options(conf.get("spark.driver.extraJavaOptions", ""))
    settings["spark.driver.extraJavaOptions"] = follow_tmpdir(java_options)
    if profile.master.startswith("local-cluster"):  # executors started on this machine
        executor_options = conf.get("spark.executor.extraJavaOptions", "")
        settings["spark.executor.extraJavaOptions"] = follow_tmpdir(executor_options)
    if private:
        start_jvm(profile.master, app_name, settings)
        settings.update(private)
    builder = SparkSession.builder.master(profile.master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def private_settings(conf: dict[str, str]) -> dict[str, str]:
    """The settings of ``conf`` that must stay off the JVM's command line, resolved: those
    given as ``${env:NAME}``/``${file:PATH}`` references and those that hold a secret
    (:func:`~epochal.base.secrets.is_secret_setting`). Raises ``ConfigError`` for a
    reference that cannot be resolved in this process (naming the setting)."""
    return {
        key: secrets.resolve(key, value)
        for key, value in conf.items()
        if secrets.is_reference(value) or secrets.is_secret_setting(key, value)
    }


def start_jvm(master: str, app_name: str, settings: dict[str, str]) -> None:
    """Start this process's Spark JVM (PySpark's gateway) with ``settings`` on its command
    line and no SparkContext yet, so that what is set afterwards reaches the JVM through the
    gateway only. Nothing happens when the gateway runs already. (PySpark 4.3's
    ``SparkContext._ensure_initialized``: the one call that launches the gateway alone.)"""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None:
        return
    launch = SparkConf(loadDefaults=False).setMaster(master).setAppName(app_name)
    launch.setAll(list(settings.items()))
    SparkContext._ensure_initialized(conf=launch)


def follow_tmpdir(java_options: str) -> str:
    """JVM options with the JVM's temporary directory set to this process's (``TMPDIR``,
    which a supervisor points at the driver run's scratch directory), unless they set one:
    the JVM ignores ``TMPDIR``, and what it leaves in its temporary directory when it is
    killed (Spark's local directories, the RocksDB and LZ4 libraries it unpacks, 15 MB a
    start) would stay there for good."""
    if "-Djava.io.tmpdir=" in java_options:
        return java_options
    return f"{java_options} -Djava.io.tmpdir={shlex.quote(tempfile.gettempdir())}".strip()
