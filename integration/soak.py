"""The soak: a Kafka → Spark → PostgreSQL exactly-once job, run through the public commands
only (``python -m epochal run``, ``jobs resume``, ``jobs suspend``), while a producer writes
at a steady rate and the job is killed again and again, at random moments, in mixed ways:

``driver``      every process of the driver run (SIGKILL: Python driver, JVM, PySpark workers)
``supervisor``  the supervisor (SIGKILL); the job is resumed by a new ``jobs resume`` process
``worker``      one Python worker of the driver run (SIGKILL)
``executor``    one executor JVM (SIGKILL; ``local-cluster`` masters only)
``server``      Kafka or PostgreSQL killed (SIGKILL) and started again

Independent readers then count, by record ID, what PostgreSQL holds against what the producer
committed: lost and duplicated IDs, prepared transactions left in PostgreSQL, open
transactions left in Kafka; and each kill's recovery time (the kill to the next committed
batch). The last line reads::

    soak: kills=K lost=L duplicates=D in_doubt=X recovery_p50=..s recovery_max=..s

and the exit code is non-zero on any loss, duplicate or leftover.

    python -m integration.soak --kills 50 --seed 7            # the long run (docs)
    python -m integration.soak --kills 5 --rate 100           # the small run of the suite
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

KINDS = ("driver", "supervisor", "worker", "executor", "server")
SPEC_ENV = "EPOCHAL_SOAK_SPEC"
JOB = "soak"


def pipeline(spark: Any) -> Any:
    """The soak's job: Kafka (read_committed) → ``id``, ``payload`` → PostgreSQL, 2PC."""
    spec = json.loads(os.environ[SPEC_ENV])
    events = (
        spark.readStream.format("epochal.kafka")
        .option("kafka.bootstrap.servers", spec["bootstrap"])
        .option("subscribe", spec["topic"])
        .option("maxRecordsPerBatch", str(spec["per_batch"]))
        .load()
    )
    rows = events.selectExpr(
        "CAST(CAST(value AS STRING) AS BIGINT) AS id", "CAST(key AS STRING) AS payload"
    )
    return (
        rows.writeStream.format("epochal.jdbc")
        .option("url", spec["dsn"])
        .option("table", "soak")
        .option("mode", "transactional")
        .option("createTable", "true")
    )


@dataclass
class Kill:
    """One kill and what it cost."""

    kind: str
    at: float
    detail: str = ""
    recovery_s: float | None = None


@dataclass
class Producer:
    """Writes IDs 0, 1, 2, ... at a steady rate in committed transactions, round-robin over
    the partitions; survives a broker restart (it retries until the broker is back)."""

    bootstrap: str
    topic: str
    partitions: int
    rate: float
    committed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import Producer as KafkaProducer

        producer = KafkaProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"soak-producer-{uuid.uuid4().hex}",
                "log_level": 3,
            }
        )
        producer.init_transactions(60)
        chunk = max(1, int(self.rate / 4))
        next_id = 0
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                ids = range(next_id, next_id + chunk)
                self._commit(producer, ids, KafkaException)
                next_id += chunk
                self.committed = next_id
                self.stop.wait(max(0.0, chunk / self.rate - (time.monotonic() - started)))
        except BaseException as exc:  # reported by the soak
            self.error = exc

    def _commit(self, producer: Any, ids: range, kafka_exception: type[Exception]) -> None:
        """One transaction with ``ids``; a retriable failure (a broker restart) is retried,
        one that needs an abort is aborted and the same IDs written again (an aborted
        transaction is invisible to read_committed readers)."""
        while True:
            producer.begin_transaction()
            for i in ids:
                producer.produce(
                    self.topic,
                    value=str(i).encode(),
                    key=f"p{i}".encode(),
                    partition=i % self.partitions,
                )
            while True:
                try:
                    producer.commit_transaction(60)
                    return
                except kafka_exception as exc:
                    error = exc.args[0]
                    if error.txn_requires_abort():
                        producer.abort_transaction(60)
                        break
                    if not error.retriable():
                        raise


class Soak:
    """One soak run (see the module doc)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.random = random.Random(args.seed)
        self.directory = args.dir or tempfile.mkdtemp(prefix="epochal-soak-")
        os.makedirs(self.directory, exist_ok=True)
        self.snapshots = f"{self.directory}/snapshots"
        self.supervisor: subprocess.Popen[str] | None = None
        self.supervisors = 0
        self.kills: list[Kill] = []
        self.kafka: Any = None
        self.postgres: Any = None

    # -- set-up -----------------------------------------------------------------------------
    def start_servers(self) -> None:
        from integration.harness.kafka import start_kafka
        from integration.harness.postgres import start_postgres

        self.say("starting Kafka and PostgreSQL (the harness's local servers)")
        self.kafka = start_kafka()
        self.postgres = start_postgres()
        self.topic = f"soak-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(self.topic, partitions=self.args.partitions)
        self.dsn = self.postgres.create_database(f"soak_{uuid.uuid4().hex[:8]}")

    def env(self) -> dict[str, str]:
        spec = {
            "bootstrap": self.kafka.bootstrap_servers,
            "topic": self.topic,
            "dsn": self.dsn,
            "per_batch": self.args.per_batch,
        }
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
        return {**os.environ, SPEC_ENV: json.dumps(spec), "PYTHONPATH": path}

    def start_supervisor(self, resume: bool) -> None:
        self.supervisors += 1
        log = open(f"{self.directory}/supervisor-{self.supervisors}.log", "w")  # noqa: SIM115
        common = ["--snapshot-dir", self.snapshots]
        if resume:
            command = ["jobs", "resume", JOB, *common]
        else:
            command = [
                "run",
                "integration.soak:pipeline",
                "--name",
                JOB,
                "--guarantee",
                "exactly-once",
                "--interval",
                self.args.interval,
                "--master",
                self.args.master,
                "--max-restarts",
                "30",
                "--lease-ttl",
                "10s",
                *(["--standby"] if self.args.standby else []),
                *(self._short_lived_jvms() if self.args.short_lived_jvms else []),
                *common,
            ]
        self.supervisor = subprocess.Popen(
            [sys.executable, "-m", "epochal", *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            text=True,
        )

    @staticmethod
    def _short_lived_jvms() -> list[str]:
        from epochal.startup.classdata import SHORT_LIVED_JVM_OPTIONS

        return [
            *("--conf", f"spark.driver.extraJavaOptions={SHORT_LIVED_JVM_OPTIONS}"),
            *("--conf", f"spark.executor.extraJavaOptions={SHORT_LIVED_JVM_OPTIONS}"),
        ]

    # -- the job's state, read as an operator would --------------------------------------------
    def status(self) -> dict[str, Any]:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "epochal",
                "jobs",
                "status",
                JOB,
                "--snapshot-dir",
                self.snapshots,
                "--json",
            ],
            capture_output=True,
            text=True,
            env=self.env(),
        )
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def record(self) -> Any:
        from epochal.state.jobs import JobDirectory

        return JobDirectory(self.snapshots, JOB).load()

    def committed_after(self, moment: float) -> float | None:
        """When the first batch committed after ``moment`` was (None: none yet, or the
        supervisor has not submitted the job yet)."""
        from epochal.state.locks import JobError

        try:
            progress = self.record().progress
        except JobError:
            return None
        at = float(progress.get("at", 0.0))
        return at if at > moment else None

    def wait(self, condition: Any, what: str, seconds: float) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            value = condition()
            if value:
                return value
            if self.supervisor is not None and self.supervisor.poll() not in (None, -9):
                code = self.supervisor.returncode
                raise RuntimeError(f"the supervisor exited with {code} while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {seconds:.0f}s waiting for {what}")
            time.sleep(0.1)

    # -- kills ------------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        wanted = [k.strip() for k in self.args.kinds.split(",") if k.strip()]
        if not self.args.master.startswith("local-cluster"):
            wanted = [k for k in wanted if k != "executor"]
        return wanted

    def kill(self, kind: str) -> Kill:
        from epochal.base import processes

        token = str(self.record().driver.get("token") or "")
        now = time.time()
        if kind == "driver":
            with contextlib.suppress(TimeoutError):
                processes.kill_run(token)
            return Kill(kind, now, "the whole driver run")
        if kind == "supervisor":
            assert self.supervisor is not None
            self.supervisor.kill()
            self.supervisor.wait()
            self.start_supervisor(resume=True)
            return Kill(kind, now, "supervisor SIGKILL, resumed from a new process")
        if kind in ("worker", "executor"):
            if kind == "executor":
                needle = b"CoarseGrainedExecutorBackend"
                victims = [
                    p for p in processes.processes_of(token) if needle in processes.command_line(p)
                ]
            else:
                victims = processes.python_workers(token)
            if not victims:
                return self.kill("driver")
            victim = self.random.choice(victims)
            argv = processes.command_line(victim).replace(b"\0", b" ")  # before it is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            return Kill(kind, now, f"pid {victim} ({argv[:60]!r})")
        server = self.kafka if self.random.random() < 0.5 else self.postgres
        name = "Kafka" if server is self.kafka else "PostgreSQL"
        server.kill()
        time.sleep(self.random.uniform(0.5, 3.0))  # down for a random while, by design
        server.start()
        return Kill(kind, now, f"{name} killed and started again")

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> int:
        self.start_servers()
        producer = Producer(
            self.kafka.bootstrap_servers, self.topic, self.args.partitions, self.args.rate
        )
        thread = threading.Thread(target=producer.run, name="soak-producer", daemon=True)
        thread.start()
        self.start_supervisor(resume=False)
        self.wait(lambda: self.committed_after(0.0), "the job's first committed batch", 300)
        self.say(f"job running; {self.args.kills} kills of kinds {', '.join(self.kinds())}")
        kinds = self.kinds()
        order = [self.random.choice(kinds) for _ in range(self.args.kills)]
        if self.args.cycle:  # every kind once per round, in a random order
            order = []
            while len(order) < self.args.kills:
                order += self.random.sample(kinds, len(kinds))
        for number, kind in enumerate(order[: self.args.kills]):
            time.sleep(self.random.uniform(self.args.min_gap, self.args.max_gap))  # a random moment
            kill = self.kill(kind)
            self.kills.append(kill)
            committed = self.wait(
                lambda k=kill: self.committed_after(k.at), f"recovery from kill {number + 1}", 600
            )
            kill.recovery_s = round(committed - kill.at, 2)
            self.say(
                f"kill {number + 1:>3}: {kind:<10} recovered in {kill.recovery_s:6.2f}s  "
                f"{kill.detail}"
            )
        producer.stop.set()
        thread.join(120)
        if producer.error is not None:
            raise RuntimeError(f"the producer failed: {producer.error!r}")
        produced = producer.committed
        self.say(f"producer stopped after {produced} records; waiting for the job to catch up")
        with contextlib.suppress(TimeoutError):
            self.wait(lambda: self.count_rows() >= produced, "the job to catch up", 600)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "epochal",
                "jobs",
                "suspend",
                JOB,
                "--snapshot-dir",
                self.snapshots,
            ],
            env=self.env(),
            capture_output=True,
        )
        assert self.supervisor is not None
        self.supervisor.wait(120)
        return self.report(produced)

    def count_rows(self) -> int:
        import psycopg

        with contextlib.suppress(psycopg.Error), psycopg.connect(self.dsn, autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass('soak')").fetchone()[0]
            if exists is not None:
                return int(conn.execute("SELECT count(*) FROM soak").fetchone()[0])
        return 0

    def report(self, produced: int) -> int:
        import psycopg
        from epochal_kafka.testing import unstable_partitions

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            ids = [row[0] for row in conn.execute("SELECT id FROM soak").fetchall()]
            prepared = conn.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchone()[0]
        counts = Counter(ids)
        lost = len(set(range(produced)) - set(counts))
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        open_kafka = unstable_partitions(self.kafka.bootstrap_servers, self.topic)
        in_doubt = int(prepared) + len(open_kafka)
        recoveries = [k.recovery_s for k in self.kills if k.recovery_s is not None]
        p50 = statistics.median(recoveries) if recoveries else 0.0
        worst = max(recoveries) if recoveries else 0.0
        by_kind = {
            kind: [k.recovery_s for k in self.kills if k.kind == kind and k.recovery_s is not None]
            for kind in KINDS
        }
        self.say(f"records produced {produced}, rows in PostgreSQL {len(ids)}")
        for kind, values in by_kind.items():
            if values:
                p50_kind = statistics.median(values)
                self.say(
                    f"  {kind:<10} {len(values):>3} kills  recovery p50 {p50_kind:6.2f}s "
                    f"max {max(values):6.2f}s"
                )
        if open_kafka:
            self.say(f"open Kafka transactions: {open_kafka}")
        if self.args.report:
            with open(self.args.report, "w") as fh:
                json.dump(
                    {
                        "produced": produced,
                        "rows": len(ids),
                        "lost": lost,
                        "duplicates": duplicates,
                        "in_doubt": in_doubt,
                        "kills": [k.__dict__ for k in self.kills],
                        "args": vars(self.args),
                    },
                    fh,
                    indent=2,
                )
        print(
            f"soak: kills={len(self.kills)} lost={lost} duplicates={duplicates} "
            f"in_doubt={in_doubt} recovery_p50={p50:.1f}s recovery_max={worst:.1f}s",
            flush=True,
        )
        return 0 if lost == duplicates == in_doubt == 0 and produced > 0 else 1

    def close(self) -> None:
        if self.supervisor is not None and self.supervisor.poll() is None:
            self.supervisor.kill()
            self.supervisor.wait()
        with contextlib.suppress(Exception):
            from epochal.state.jobs import JobDirectory

            lease = JobDirectory(self.snapshots, JOB).lease.read()
            from epochal.base import processes

            for token in lease.tokens if lease else ():
                processes.kill_run(str(token))
        for server in (self.kafka, self.postgres):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.backend.close()
        if not self.args.dir and not self.args.keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    @staticmethod
    def say(line: str) -> None:
        print(f"[soak {time.strftime('%H:%M:%S')}] {line}", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m integration.soak", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--kills", type=int, default=10, help="how many kills (default: %(default)s)")
    p.add_argument(
        "--kinds", default=",".join(KINDS), help="kinds of kill to mix (default: %(default)s)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=1,
        help="random seed of kinds and moments (default: %(default)s)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=200.0,
        help="records produced per second (default: %(default)s)",
    )
    p.add_argument(
        "--partitions", type=int, default=3, help="source topic partitions (default: %(default)s)"
    )
    p.add_argument(
        "--per-batch",
        type=int,
        default=500,
        help="records per micro-batch at most (default: %(default)s)",
    )
    p.add_argument("--interval", default="1s", help="snapshot interval (default: %(default)s)")
    p.add_argument(
        "--master",
        default="local-cluster[2,1,1024]",
        help="Spark master; executor kills need local-cluster (default: %(default)s)",
    )
    p.add_argument("--standby", action="store_true", help="run the job with a warm standby driver")
    p.add_argument(
        "--short-lived-jvms",
        action="store_true",
        help="the driver and executors with the JVM settings of a short run (C1 only, serial "
        "GC: epochal.startup.classdata.SHORT_LIVED_JVM), as the test's small soak runs",
    )
    p.add_argument(
        "--cycle", action="store_true", help="every kind once per round of kills (random order)"
    )
    p.add_argument(
        "--min-gap",
        type=float,
        default=2.0,
        help="seconds at least between recovery and the next kill (default: %(default)s)",
    )
    p.add_argument(
        "--max-gap",
        type=float,
        default=8.0,
        help="seconds at most between recovery and the next kill (default: %(default)s)",
    )
    p.add_argument(
        "--dir", help="keep the soak's files here (default: a temporary directory, removed)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--report", help="write the kills and counts as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    soak = Soak(args)
    try:
        return soak.run()
    finally:
        soak.close()


if __name__ == "__main__":
    sys.exit(main())
