"""Fixtures of the cluster tests: a job on the standalone cluster with its snapshots on S3.

:class:`ClusterJob` submits ``integration.cluster.pipelines:marked_copy`` (Kafka →
PostgreSQL, exactly-once) on the ``spark_cluster`` with ``--snapshot-dir s3://…`` on the
``s3_server``, supervised in this process, and counts the result by record ID. The
supervisor, its drivers and the executors see the object store only through the standard
``AWS_*`` variables (set here as a deployment would set them); the Spark settings of the
job are the cluster's, the S3A jars on the class path, and nothing else about S3: the
driver derives the ``s3a://`` settings itself.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from epochal_jdbc.testing import JdbcSinkUnderTest
from epochal_kafka.testing import KafkaSourceUnderTest

from epochal import Job, JobConfig, JobRecord
from epochal.state.jobs import JobDirectory
from epochal.state.layout import LOCAL_DIR_ENV
from epochal.testing.scenarios import TEST_SPARK_CONF
from epochal_sdk import Guarantee
from integration.cluster.pipelines import SPEC_ENV, read_markers
from integration.harness import HarnessError, wait_until
from integration.harness.kafka import KafkaServer
from integration.harness.s3 import S3Bucket, S3Server, spark_s3a_conf
from integration.harness.spark_cluster import SparkCluster

TARGET = "integration.cluster.pipelines:marked_copy"


class JobEndedError(HarnessError):
    """The job ended while a test waited for something of a running job (a HarnessError,
    so ``wait_until`` stops at once)."""


LEASE_TTL = 8.0
PARTITIONS = 3


@pytest.fixture
def cluster_topic(kafka_server: KafkaServer) -> Iterator[KafkaSourceUnderTest]:
    """A fresh 3-partition topic as the source."""
    name = f"it-cluster-{uuid.uuid4().hex[:10]}"
    kafka_server.create_topic(name, partitions=PARTITIONS)
    yield KafkaSourceUnderTest(kafka_server.bootstrap_servers, name, PARTITIONS)
    if kafka_server.running:
        kafka_server.delete_topic(name, timeout=10)


@pytest.fixture
def cluster_env(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The environment of a supervisor host: AWS_* for the object store, this machine's
    directory for driver logs and run records; and, as on every node of a cluster, a
    credentials file (0600) for the executors, whose workers a standalone worker starts with
    its own environment (the driver forwards the file's path, never a key)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    credentials = tmp_path / "aws-credentials"
    credentials.touch(mode=0o600)
    credentials.write_text(
        f"[default]\naws_access_key_id = {s3_server.access_key}\n"
        f"aws_secret_access_key = {s3_server.secret_key}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv(LOCAL_DIR_ENV, str(tmp_path / "host-a"))
    yield


@dataclass
class ClusterJob:
    """One exactly-once job on the cluster, its snapshots on S3."""

    name: str
    cluster: SparkCluster
    bucket: S3Bucket
    source: KafkaSourceUnderTest
    sink: JdbcSinkUnderTest
    markers: Path
    ids: list[int]
    config: JobConfig
    lines: list[str] = field(default_factory=list)
    job: Job | None = None

    @property
    def jobdir(self) -> JobDirectory:
        return JobDirectory(self.config.snapshot_dir, self.name)

    def start(self) -> None:
        """Produce every record, then submit the job (supervised by this process)."""
        self.source.produce(self.ids)
        self.job = Job.submit(self.name, TARGET, self.config, report=self.lines.append)

    def record(self) -> JobRecord:
        return self.jobdir.load()

    def batch(self) -> int:
        """The last batch the job committed (-1 before the first)."""
        return int(self.record().progress.get("batch", -1))

    def wait_for(self, condition: Callable[[JobRecord], Any], what: str, seconds: float) -> Any:
        """Poll the job record until ``condition`` holds (the job must not end first)."""

        def check() -> Any:
            record = self.record()
            value = condition(record)
            if value:
                return value
            if record.status.finished:
                raise JobEndedError(f"the job ended ({record.status}) before {what}: {self}")
            return None

        return wait_until(check, seconds, what, interval=0.1, on_timeout=lambda: str(self))

    def join(self, seconds: float = 600) -> JobRecord:
        assert self.job is not None
        return self.job.join(timeout=seconds)

    def counted(self) -> tuple[list[int], dict[int, int]]:
        """Lost and duplicated record IDs, by an independent reader of the table."""
        seen = Counter(int(key) for key, _ in self.sink.committed("transactional"))
        lost = sorted(set(self.ids) - set(seen))
        return lost, {i: n for i, n in seen.items() if n > 1}

    def start_markers(self) -> list[dict[str, Any]]:
        return read_markers(str(self.markers), "start")

    def end_markers(self) -> list[dict[str, Any]]:
        return read_markers(str(self.markers), "end")

    def driver_logs(self, lines: int = 40) -> str:
        out = []
        logs = Path(self.jobdir.logs)
        for path in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def __str__(self) -> str:
        return f"job {self.name}: supervisor said {self.lines}\n{self.driver_logs()}"


@pytest.fixture
def cluster_job(
    spark_cluster: SparkCluster,
    s3_server: S3Server,
    s3_bucket: S3Bucket,
    cluster_topic: KafkaSourceUnderTest,
    postgres_db: Any,
    cluster_env: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., ClusterJob]]:
    """A factory: ``cluster_job(records=..., per_batch=..., task_seconds=..., **config)``."""
    made: list[ClusterJob] = []

    def make(*, records: int, per_batch: int, task_seconds: float, **settings: Any) -> ClusterJob:
        spark_cluster.wait_for_alive_workers(len(spark_cluster.workers))
        markers = tmp_path / "markers"
        markers.mkdir(exist_ok=True)
        sink = JdbcSinkUnderTest(postgres_db.dsn)
        spec = {
            "markers": str(markers),
            "task_seconds": task_seconds,
            "id_expr": cluster_topic.id_expr,
            "source_options": {**cluster_topic.options(), "maxRecordsPerBatch": str(per_batch)},
            "sink_options": sink.options("transactional"),
        }
        monkeypatch.setenv(SPEC_ENV, json.dumps(spec))
        session = spark_cluster.session_conf()
        # the driver hands its own PYTHONPATH (the job's path) to the executors
        session.pop("spark.executorEnv.PYTHONPATH", None)
        jars = {k: v for k, v in spark_s3a_conf(s3_server).items() if "extraClassPath" in k}
        config = JobConfig(
            guarantee=Guarantee.EXACTLY_ONCE,
            available_now=True,
            master=spark_cluster.master_url,
            snapshot_dir=s3_bucket.url("snapshots").rstrip("/"),
            restart_backoff=0.2,
            lease_ttl=LEASE_TTL,
            spark_conf={**TEST_SPARK_CONF, **session, **jars, **settings.pop("spark_conf", {})},
            **settings,
        )
        job = ClusterJob(
            f"cluster-{uuid.uuid4().hex[:8]}",
            spark_cluster,
            s3_bucket,
            cluster_topic,
            sink,
            markers,
            list(range(records)),
            config,
        )
        made.append(job)
        return job

    yield make
    for job in made:
        if job.job is not None and job.job._thread is not None and job.job._thread.is_alive():
            job.job.cancel()
            job.job.join(60)
    # (the harness starts again the workers a test left killed)


def elapsed(started: float) -> str:
    """Seconds since ``started`` (monotonic), for the notes of a test."""
    return f"{time.monotonic() - started:.1f}s"


def python_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``extra`` (for another supervisor's process)."""
    return {**os.environ, **extra}
