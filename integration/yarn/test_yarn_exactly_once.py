"""Exactly-once Kafka → PostgreSQL on a real YARN that restarts the driver itself.

A user's application (``kafka_to_postgres_app.py``) is submitted with ``spark-submit
--master yarn --deploy-mode cluster`` and ``spark.yarn.maxAppAttempts=4``; no supervisor
runs. Its driver holds the job's lease itself (:mod:`epochal.control.lease_keeper`). One
application goes through both failures a YARN deployment meets:

1. **The driver is killed** (SIGKILL of the ApplicationMaster's JVM, at a random moment
   after a committed batch): YARN starts attempt 2, which takes the job over at once (the
   dead driver's JVM is provably gone) and recovers.
2. **The driver's node is partitioned**: its NodeManager and every process of the driver's
   container (JVM, Python workers, lease keeper) are stopped (SIGSTOP). The ResourceManager
   declares the node lost and starts attempt 3 on the other node while the old driver
   still exists; attempt 3 takes the job over once the old lease expired and commits. The
   old driver is then resumed (SIGCONT) while attempt 3 runs: it decides, acknowledges and
   writes nothing (no commit decision of its epoch written after the take-over, nothing
   written through its moved state directory), and it is stopped.

3. **The NameNode restarts** while attempt 3 runs: the job waits for it, or its attempt
   fails and YARN's next attempt recovers; nothing is lost either way.

The job's snapshot directory (its lease, records and store) and Spark's checkpoint are on the
harness's HDFS, as a YARN user keeps them: epochal swaps the lease through WebHDFS, Spark
writes its checkpoint through its own HDFS client.

Then the application is stopped and an independent reader of the table counts every
Kafka record exactly once; no transaction is left prepared. The lost, duplicated and
in-doubt (prepared) counts are printed before they are checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
import uuid
from pathlib import Path

import pytest

from epochal.state.jobs import JobDirectory
from integration import kafka_to_postgres
from integration.harness import wait_until
from integration.harness.hdfs import HdfsServer
from integration.harness.kafka import KafkaServer
from integration.harness.plugin import PostgresDatabase
from integration.harness.yarn import FINAL_STATES, YarnCluster, process_alive

pytestmark = [pytest.mark.integration, pytest.mark.spark]

APP = Path(__file__).with_name("kafka_to_postgres_app.py")
JOB = "yarn-kafka-to-postgres"
RECORDS = 600
PER_BATCH = 50
LEASE_TTL = 8.0
STEP = 180.0


def _rows_beyond(db: PostgresDatabase, count: int, cluster: YarnCluster, app_id: str) -> int:
    """Wait until the table holds more than ``count`` rows; the count then."""

    def grown() -> int | None:
        assert cluster.app_state(app_id) not in FINAL_STATES, cluster.logs(app_id)
        now = sum(kafka_to_postgres.table(db).values())
        return now if now > count else None

    return wait_until(
        grown, STEP, f"more than {count} rows", on_timeout=lambda: cluster.logs(app_id)
    )


@pytest.mark.kafka_topic(partitions=3)
def test_exactly_once_on_yarn_with_hdfs_across_driver_kill_partition_and_namenode_restart(
    yarn_cluster: YarnCluster,
    hdfs_server: HdfsServer,
    kafka_server: KafkaServer,
    kafka_topic: str,
    postgres_db: PostgresDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster, rng = yarn_cluster, random.Random(JOB)
    started = time.monotonic()
    base = f"yarn-{uuid.uuid4().hex[:12]}"
    snapshots = hdfs_server.url(f"{base}/snapshots")
    store_env = hdfs_server.env()
    for name, value in store_env.items():  # this process reads the job's lease too
        monkeypatch.setenv(name, value)
    spec = {
        "bootstrap": kafka_server.bootstrap_servers,
        "topic": kafka_topic,
        "dsn": postgres_db.dsn,
        "job": JOB,
        "snapshot_dir": snapshots,
        "checkpoint": hdfs_server.url(f"{base}/checkpoint"),
        "per_batch": PER_BATCH,
        "lease_ttl": LEASE_TTL,
        "stop": str(tmp_path / "stop"),
    }
    spec_path = tmp_path / "spec.json"
    spec_path.touch(mode=0o600)
    spec_path.write_text(json.dumps(spec))
    third = RECORDS // 3
    kafka_to_postgres.produce(kafka_server, kafka_topic, range(third))
    conf = {"spark.yarn.maxAppAttempts": "4"}
    for name, value in store_env.items():  # the driver's container and the executors'
        conf[f"spark.yarn.appMasterEnv.{name}"] = value
        conf[f"spark.executorEnv.{name}"] = value
    submission = cluster.submit(APP, [str(spec_path)], conf=conf)
    app_id = cluster.app_id_of(submission)
    jobdir = JobDirectory(snapshots, JOB)
    try:
        # 1. the driver killed at a random moment after a committed batch
        seen = _rows_beyond(postgres_db, 0, cluster, app_id)
        time.sleep(rng.uniform(0.0, 1.5))  # a random moment, by design
        killed = cluster.kill_am_driver(app_id)
        cluster.wait_for_attempt(app_id, 2, STEP)
        wait_until(lambda: jobdir.lease.epoch() == 2, STEP, "attempt 2 to take the lease")
        assert not process_alive(killed)
        # counted once attempt 1 is dead and fenced: the batches it committed while the
        # random moment passed are in, so the rows beyond are attempt 2's
        seen = sum(kafka_to_postgres.table(postgres_db).values())
        kafka_to_postgres.produce(kafka_server, kafka_topic, range(third, 2 * third))
        seen = _rows_beyond(postgres_db, seen, cluster, app_id)

        # 2. the driver's node partitioned: its NodeManager and its container stopped
        node = cluster.am_node(app_id)
        frozen = cluster.container_pids(cluster.attempts(app_id)[-1]["containerId"])
        cluster.pause_node(node)
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):  # a short-lived one ended
                os.kill(pid, signal.SIGSTOP)
        zombie = jobdir.lease.read()
        assert zombie is not None and zombie.epoch == 2
        try:
            attempt = cluster.wait_for_attempt(app_id, 3, STEP)
            assert cluster.node_index(attempt["nodeId"]) != node, "attempt 3 on the lost node"
            wait_until(lambda: jobdir.lease.epoch() == 3, STEP, "attempt 3 to take the lease")
            taken = wait_until(  # the lease is taken first, then the run is started
                lambda: next((r for r in jobdir.load().runs if r.get("epoch") == 3), None),
                STEP,
                "attempt 3's run in the job record",
            )
            waited = float(taken["started"]) - zombie.renewed
            assert waited >= LEASE_TTL, f"taken over {waited:.1f}s after the last renewal"
            seen = _rows_beyond(postgres_db, seen, cluster, app_id)
        finally:
            for pid in frozen:  # the old driver wakes while attempt 3 runs
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            cluster.resume_node(node)
        wait_until(
            lambda: not any(process_alive(pid) for pid in frozen), STEP, "the old driver to stop"
        )
        _check_the_zombie_wrote_nothing(jobdir, zombie.epoch, float(taken["started"]))

        # 3. the NameNode restarted while attempt 3 runs, then the last records produced
        restart_started = time.monotonic()
        hdfs_server.restart_namenode()
        restart_took = time.monotonic() - restart_started
        kafka_to_postgres.produce(kafka_server, kafka_topic, range(2 * third, RECORDS))
        wait_until(
            lambda: sum(kafka_to_postgres.table(postgres_db).values()) >= RECORDS,
            STEP,
            "every record in the table",
            on_timeout=lambda: cluster.logs(app_id),
        )
        Path(spec["stop"]).touch()
        wait_until(lambda: cluster.app_state(app_id) in FINAL_STATES, STEP, "the app to end")
        assert cluster.app(app_id)["finalStatus"] == "SUCCEEDED", cluster.logs(app_id)
    finally:
        if cluster.app_state(app_id) not in FINAL_STATES:
            cluster.kill_app(app_id)

    attempts = cluster.attempts(app_id)
    if len(attempts) > 3:  # the NameNode restart ended attempt 3: say why
        print(f"attempt 3 ended: {attempts[2].get('diagnosticsInfo', '')[-600:]}")
        print(_lines_about_the_lease(cluster.logs(app_id, lines=400)))
    found = kafka_to_postgres.table(postgres_db)
    expected = {kafka_to_postgres.record_id(i) for i in range(RECORDS)}
    print(
        f"lost {len(expected - set(found))}, duplicated "
        f"{sum(n - 1 for n in found.values() if n > 1)}, in doubt "
        f"{len(kafka_to_postgres.prepared(postgres_db))}; attempts "
        f"{len(cluster.attempts(app_id))}, lease epoch {jobdir.lease.epoch()}, NameNode "
        f"restart {restart_took:.1f}s, the test {time.monotonic() - started:.0f}s"
    )
    kafka_to_postgres.assert_exactly_once(postgres_db, RECORDS)


def _lines_about_the_lease(logs: str) -> str:
    """The containers' log lines that say why a driver stopped."""
    words = ("Exception:", "Error:", "the lease")
    lines = logs.splitlines()
    return "\n".join(
        line for line in lines if " INFO " not in line and any(w in line for w in words)
    )


def _check_the_zombie_wrote_nothing(jobdir: JobDirectory, epoch: int, taken_at: float) -> None:
    """No commit decision of the old driver's epoch written after the take-over (on HDFS,
    as on an object store, every write of a fenced run is refused by the lease check)."""
    store = jobdir.store
    late = []
    for sink in store.list_dirs("sinks"):
        for key in store.list(f"sinks/{sink}/decisions"):
            decision, written = store.read_json(key), store.manifest(key).written
            if int(decision["lease_epoch"]) <= epoch and written >= taken_at:
                late.append(key)
    assert not late, f"the old driver decided after the take-over: {late}"
