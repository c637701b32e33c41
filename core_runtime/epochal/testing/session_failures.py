"""The kit's real failures where no supervisor runs: the query in a user's plain SparkSession
(:mod:`epochal.testing.session_app`), whose driver an outside restarter starts again, as
YARN's application attempts, the spark-operator's restart policy or a restart loop do. The
kit is that restarter: it starts the application again whenever it ended without finishing,
and once (the split brain) while the old driver still lives.

1. Driver A runs until the first fault kills it whole after a sink's commit (SIGKILL of the
   application, its JVM, its Python workers and its lease keeper). The restarter starts B
   at once; B takes the job's lease at once (A's JVM is gone, provably).
2. The second fault pauses B at the most dangerous step (SIGSTOP of all of B's processes,
   its keeper included, as a partition or a long GC would). The restarter gives up on B and
   starts C: C must wait out B's lease (its TTL after B's last renewal), then takes the job
   over and commits a batch. B is resumed (SIGCONT): its keeper finds the lease lost, B's
   query fence ends B's query (the keeper kills B's JVM if it does not end within a
   quarter TTL), and the application exits; B decides, acknowledges and writes nothing.
3. C's whole driver and one of its Python workers are killed at random moments; the
   restarter starts the next driver each time.
4. The application is stopped gracefully (``query.stop()`` and ``spark.stop()`` in its
   driver, as a deployment's shutdown hook does); nothing is left in doubt; the restarter
   starts it again until one finishes the data and exits right after
   ``awaitTermination()``: its job must show ``COMPLETED`` at the last batch of Spark's
   commit log (an application that uses epochal's formats).

Records keep arriving (:class:`~epochal.testing.real_failures.KeepProducing`) through A's
death, B's run and pause and the take-over, the last before C starts
(:meth:`~epochal.testing.real_failures.KeepProducing.finish`), and each start of the
application gives the source's batches another number of tasks (2 for A, 4 for B, 1 from C
on): a full batch arrives before B starts, so the batch B is paused in has 4 writers
prepared, and C, with one, must settle what the writers that are gone left.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from epochal.base import processes
from epochal.base.fault_plan import FaultPlan
from epochal.pipelines import SPEC_ENV
from epochal.startup.home import python_of_spark
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.testing.real_failures import KeepProducing, check_zombie_wrote_nothing
from epochal.testing.scenarios import (
    KIT_LEASE_TTL,
    Scenario,
    driver_log_tail,
    wait_for,
    with_temp_dir,
)
from epochal.testing.session_app import STOPPED, uses_epochal_data_sources

APP_MODULE = "epochal.testing.session_app"
MAX_STARTS = 12
"""The restarter gives up after this many starts of the application."""


class SessionFailures:
    """Runs the plain-session scenario (see the module doc) for one job."""

    def __init__(
        self,
        jobdir: JobDirectory,
        scenario: Scenario,
        spec: dict[str, Any],
        seed: str,
        temp_dir: str,
        producer: KeepProducing | None = None,
        in_doubt: Callable[[], list[str]] | None = None,
    ):
        self.jobdir, self.scenario = jobdir, scenario
        self.producer, self.in_doubt = producer, in_doubt
        self.stop_file = f"{jobdir.path}-stop"
        """The application stops its query gracefully once this file exists."""
        self.temp_dir = temp_dir
        """The applications' ``TMPDIR`` (their JVMs' temporary directory follows it)."""
        self.random = random.Random(seed)
        self.plan = FaultPlan.parse(scenario.plan, jobdir.layout.faults)
        self.checkpoint = f"{jobdir.path}-checkpoint"
        job = {
            "epochal.job": jobdir.name,
            "epochal.snapshotDir": jobdir.snapshot_dir,
            "epochal.guarantee": scenario.guarantee.label,
            "epochal.faults": scenario.plan,
            "epochal.leaseTtl": str(KIT_LEASE_TTL),
            "epochal.checkpointLocation": self.checkpoint,
        }
        self.spec = {
            **spec,
            "source_options": {**spec["source_options"], **job},
            "sink_options": {**spec["sink_options"], **job},
            "pipeline": scenario.pipeline,
        }
        self.apps: list[tuple[subprocess.Popen[str], str]] = []

    def run(self, notes: list[str]) -> JobRecord:
        try:
            return self._run(notes)
        finally:
            if self.producer is not None:
                self.producer.stop()
            for app, token in self.apps:
                processes.signal_run(token, signal.SIGCONT)
                with contextlib.suppress(TimeoutError):
                    processes.kill_run(token)
                app.wait()

    def _run(self, notes: list[str]) -> JobRecord:
        kill, pause = self.scenario.faults
        if self.producer is not None:
            self.producer.start()
        first, _ = self._start("a")
        wait_for(lambda: first.poll() is not None, "driver A to be killed by its fault", 300)
        assert first.returncode == -signal.SIGKILL, f"driver A ended with {first.returncode}"
        assert self.plan.fired() == [kill.label], self.plan.fired()

        self._tasks(4)
        if self.producer is not None:  # B's first new batch a full one: 4 writers prepare it
            self.producer.burst(int(self.spec["source_options"].get("maxRecordsPerBatch", 100)))
        second, zombie_token = self._start("b")
        wait_for(lambda: self.plan.fired()[-1:] == [pause.label], "the zombie's pause", 300)
        zombie = self.plan.marker_info(pause.label)
        assert zombie["token"] == zombie_token, "the pause fired in another driver than B"
        lease = self.jobdir.lease.read()
        assert lease is not None
        zombie_epoch, last_renewal = lease.epoch, lease.renewed
        committed = self._commits()
        if self.producer is not None:  # C's first query starts after the last record
            self.producer.finish()
        self._tasks(1)
        third, third_token = self._start("c")
        wait_for(
            lambda: self._commits() > committed or third.poll() is not None,
            "driver C to take over and commit a batch",
            300,
        )
        assert third.poll() is None, f"driver C ended with {third.returncode}: {self._log('c')}"
        taken = next(
            (r for r in self.jobdir.load().runs if int(r.get("epoch", 0)) > zombie_epoch), None
        )
        assert taken is not None, self.jobdir.load().runs
        waited = float(taken["started"]) - last_renewal
        assert waited >= KIT_LEASE_TTL - 0.05, (
            f"driver C took the job over {waited:.2f}s after the zombie's last lease renewal; "
            f"it must wait for the lease ({KIT_LEASE_TTL}s) to expire"
        )
        notes.append(f"session take-over {waited:.1f}s after the zombie's last renewal")
        processes.signal_run(zombie_token, signal.SIGCONT)
        resumed = time.monotonic()
        wait_for(
            lambda: second.poll() is not None and not processes.processes_of(zombie_token),
            "the zombie driver to be stopped by its lease keeper",
            60,
        )
        notes.append(
            f"zombie stopped {time.monotonic() - resumed:.1f}s after SIGCONT (exit "
            f"{second.returncode})"
        )
        check_zombie_wrote_nothing(self.jobdir, zombie, zombie_epoch, notes)
        app, token = self._random_kills(third, third_token, notes)
        if self.producer is not None:
            self.producer.stop()
            notes.append(f"{self.producer.produced} records arrived while the job ran")
            if self.scenario.graceful_stop:
                app, token = self._stopped_gracefully(app, token, notes)
        last = self._finished(app, token)
        record = self.jobdir.load()
        shown = self._shown_wrongly(record) if last.returncode == 0 else None
        if shown:
            record.status = JobStatus.FAILED
            record.failure = shown
        elif last.returncode == 0:
            record.status = JobStatus.COMPLETED
        else:
            record.status = JobStatus.FAILED
            record.failure = f"the application ended with {last.returncode}: {self._logs()}"
        return record

    def _shown_wrongly(self, record: JobRecord) -> str | None:
        """What is wrong with the job as ``jobs status`` shows it once its application
        finished and exited (right after ``awaitTermination()``): an application that
        registered epochal's formats has its job ``COMPLETED`` at the last batch of Spark's
        commit log. None when that holds (or the pipeline has no epochal data source, so
        nothing in the application writes the job's record)."""
        if not uses_epochal_data_sources(self.spec):
            return None
        with contextlib.suppress(FileNotFoundError):
            names = os.listdir(f"{self.checkpoint}/commits")
            last = max((int(n) for n in names if n.isdigit()), default=-1)
            shown = record.progress.get("batch", -1)
            if record.status != JobStatus.COMPLETED or shown != last:
                return (
                    f"the application finished its data and exited, but its job shows "
                    f"{record.status.value} at batch {shown}, not COMPLETED at batch {last} "
                    "(the last of Spark's commit log)"
                )
        return None

    def _start(self, tag: str) -> tuple[subprocess.Popen[str], str]:
        """Start the user's application as a restarter does (a new run token names all of
        its processes, for the kills)."""
        assert len(self.apps) < MAX_STARTS, f"the restarter gave up after {MAX_STARTS} starts"
        token = processes.new_run_token()
        env = {
            **with_temp_dir(self.temp_dir),
            SPEC_ENV: json.dumps(self.spec),
            processes.RUN_TOKEN_ENV: token,
            **python_of_spark(),
        }
        log = open(f"{self.jobdir.path}-app-{tag}.log", "w")  # noqa: SIM115
        with log:
            app = subprocess.Popen(
                [sys.executable, "-m", APP_MODULE, self.checkpoint, self.stop_file],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        self.apps.append((app, token))
        return app, token

    def _commits(self) -> int:
        """Batches in the Spark commit log of the application's checkpoint."""
        with contextlib.suppress(FileNotFoundError):
            return sum(name.isdigit() for name in os.listdir(f"{self.checkpoint}/commits"))
        return 0

    def _random_kills(
        self, app: subprocess.Popen[str], token: str, notes: list[str]
    ) -> tuple[subprocess.Popen[str], str]:
        """Kill the running driver whole and one of its Python workers, in random order at
        random moments, restarting the application whenever it ended without finishing;
        returns the application started last (and its run token)."""
        kinds = ["driver", "worker"]
        self.random.shuffle(kinds)
        done = 0
        for kind in kinds:
            committed = self._commits()
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda a=app, c=committed: a.poll() is not None or self._commits() > c,
                    "another committed batch",
                    120,
                )
            app, token = self._restarted(app, token)
            if app.poll() is not None:
                break
            time.sleep(self.random.uniform(0.0, 1.5))  # a random moment, by design
            workers = processes.python_workers(token)
            if kind == "worker" and workers:
                victim = self.random.choice(workers)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                notes.append(f"random kill after {self._commits()} batches: Python worker")
            else:
                with contextlib.suppress(TimeoutError):
                    processes.kill_run(token)
                notes.append(f"random kill after {self._commits()} batches: the whole driver")
            done += 1
        assert done == 2, f"only {done} of 2 random kills happened before the job ended: {notes}"
        return self._restarted(app, token)

    def _finished(self, app: subprocess.Popen[str], token: str) -> subprocess.Popen[str]:
        """Restart the application whenever it ended without finishing, until one finishes;
        that one."""
        while True:
            wait_for(lambda a=app: a.poll() is not None, "the application to end", 600)
            if app.returncode == 0:
                return app
            app, token = self._restarted(app, token)

    def _stopped_gracefully(
        self, app: subprocess.Popen[str], token: str, notes: list[str]
    ) -> tuple[subprocess.Popen[str], str]:
        """Stop the running application's query gracefully (``query.stop()``) while it still
        has batches to run: a burst of records arrives, the driver is killed so that the
        next start's available-now run holds it, and the stop comes at that start's first
        committed batch. Nothing may be left in doubt; then the next start finishes."""
        assert self.producer is not None
        per_batch = int(self.spec["source_options"].get("maxRecordsPerBatch", 100))
        self.producer.burst(10 * per_batch)
        if app.poll() is None:
            with contextlib.suppress(TimeoutError):
                processes.kill_run(token)
            app.wait()
        app, token = self._start(chr(ord("a") + len(self.apps)))
        committed = self._commits()
        wait_for(
            lambda: app.poll() is not None or self._commits() > committed,
            "a batch of the restarted application",
            300,
        )
        with open(self.stop_file, "w"):
            pass
        wait_for(lambda: app.poll() is not None, "the application to stop its query", 120)
        os.unlink(self.stop_file)
        assert app.returncode == STOPPED, (
            f"the application ended with {app.returncode}, not stopped: it finished the burst "
            f"of {10 * per_batch} records before the stop; {self._logs()}"
        )
        left = self.in_doubt() if self.in_doubt is not None else []
        assert not left, f"the graceful stop left transactions in doubt: {left}"
        notes.append(f"query stopped gracefully after {self._commits()} batches")
        return self._start(chr(ord("a") + len(self.apps)))

    def _tasks(self, tasks: int) -> None:
        """Each batch about ``tasks`` tasks from the next start on (an epochal source)."""
        options = self.spec["source_options"]
        if "minRecordsPerTask" in options:
            per_batch = int(options["maxRecordsPerBatch"])
            options["minRecordsPerTask"] = str(max(1, -(-per_batch // tasks)))

    def _restarted(
        self, app: subprocess.Popen[str], token: str
    ) -> tuple[subprocess.Popen[str], str]:
        """The restart policy: an application that ended without finishing is started
        again (after its processes are gone, as a container's are)."""
        if app.poll() is None or app.returncode == 0:
            return app, token
        with contextlib.suppress(TimeoutError):
            processes.kill_run(token)
        return self._start(chr(ord("a") + len(self.apps)))

    def _log(self, tag: str) -> str:
        with contextlib.suppress(OSError), open(f"{self.jobdir.path}-app-{tag}.log") as fh:
            return "\n".join(fh.read().splitlines()[-40:])
        return ""

    def _logs(self) -> str:
        tags = [chr(ord("a") + i) for i in range(len(self.apps))]
        return "\n".join(f"--- app {t}\n{self._log(t)}" for t in tags[-2:]) + driver_log_tail(
            self.jobdir.logs
        )
