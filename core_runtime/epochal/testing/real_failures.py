"""The real-failures scenario: supervisors as their own processes, killed and paused from
outside, a zombie driver woken after a take-over, random kills (:class:`RealFailures`)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from epochal.base import processes
from epochal.base.fault_plan import EXECUTOR_POINTS, FaultPlan
from epochal.config import JobConfig
from epochal.control.job_requests import request, submit
from epochal.driver.guards import SOURCE_RUNNER_MODULE as SOURCE_RUNNER
from epochal.pipelines import SPEC_FILE
from epochal.protocols.two_phase import recorded_decisions
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus
from epochal.state.layout import LEASE_RECORD
from epochal.state.store import put_record
from epochal.testing.scenarios import Scenario, driver_log_tail, wait_for, with_temp_dir
from epochal_sdk import TransactionId


class RealFailures:
    """The real-failures scenario: supervisors run as their own processes, as an operator
    runs them (``python -m epochal jobs resume``), and are killed and paused from outside.

    1. Supervisor A runs the job until the first fault kills A (SIGKILL) after a batch: its
       driver must die with it (all of the run's processes gone within the lease TTL).
    2. Supervisor B resumes the job from another process at once (A is known dead).
       (A supervisor that must wait for a lease starts its driver warm meanwhile.)
    3. The second fault pauses B and its whole driver run (SIGSTOP) at the most dangerous
       step. Supervisor C resumes the job: it must wait for the lease to expire, then take
       over at a new epoch. Once C committed a batch, the zombie is resumed (SIGCONT): it
       must stop without deciding, acknowledging or writing anything. Where the sink under
       test is transactional, the pause comes from one of B's write tasks after it wrote its
       rows (``sink.after_write``), B is taken for a holder on another machine, and B's
       supervisor and driver are lost (SIGKILL) before that task alone is woken, as an
       executor cut off from a replaced driver would be: it must prepare nothing
       (:meth:`_zombie_write_task`).
    4. While C runs, its whole driver run and one of its Python workers are killed, in
       random order, at random moments.
    5. C is suspended, gracefully (``jobs suspend``: its query stops, its sinks' and
       sources' close and abort paths run); nothing is left in doubt. Supervisor D resumes
       the job and finishes it.

    Records keep arriving (:class:`KeepProducing`) through A's death, B's run and pause and
    the take-over; the last arrive before C starts (C reads at the available-now trigger, up
    to what its query finds at its start, so a record given after C's last query start could
    never be read: :meth:`KeepProducing.finish`), and the graceful stop's burst arrives while
    C runs. The job's parallelism changes at each new supervisor:
    its source's batches get 2 tasks under A, 4 under B, 1 under C and D
    (``minRecordsPerTask``), so C recovers the transactions of B's writers that are gone.
    """

    def __init__(
        self,
        jobdir: JobDirectory,
        scenario: Scenario,
        config: JobConfig,
        seed: str,
        temp_dir: str,
        producer: KeepProducing | None = None,
        in_doubt: Callable[[], list[str]] | None = None,
    ):
        self.jobdir, self.scenario, self.config = jobdir, scenario, config
        self.producer = producer
        """Records that keep arriving while the scenario runs (none: every record is there
        before the job starts)."""
        self.in_doubt = in_doubt
        """The sink's transactions in doubt (checked after the graceful stop)."""
        self.temp_dir = temp_dir
        """The supervisors' ``TMPDIR`` (their drivers' scratch directories go there)."""
        self.random = random.Random(seed)
        self.plan = FaultPlan.parse(scenario.plan, jobdir.layout.faults)
        self.supervisors: list[subprocess.Popen[str]] = []

    def run(self, notes: list[str]) -> JobRecord:
        try:
            return self._run(notes)
        finally:
            if self.producer is not None:
                self.producer.stop()
            for supervisor in self.supervisors:
                with contextlib.suppress(ProcessLookupError):
                    supervisor.send_signal(signal.SIGCONT)
                    supervisor.kill()
                supervisor.wait()

    def _run(self, notes: list[str]) -> JobRecord:
        ttl = self.config.lease_ttl
        submit(self.jobdir.name, "epochal.pipelines:copy", self.config)
        kill_supervisor, pause = self.scenario.faults
        if self.producer is not None:
            self.producer.start()
        first = self._supervise("a")
        wait_for(lambda: first.poll() is not None, "supervisor A to be killed by its fault", 300)
        assert first.returncode == -signal.SIGKILL, f"supervisor A ended with {first.returncode}"
        orphan = self.plan.marker_info(kill_supervisor.label)
        started = time.monotonic()
        wait_for(
            lambda: not processes.processes_of(str(orphan["token"])),
            "the driver run of the killed supervisor to die with it",
            ttl,
        )
        notes.append(f"orphaned driver run gone {time.monotonic() - started:.1f}s after A died")

        set_tasks(self.jobdir, 4)
        second = self._supervise("b")
        wait_for(lambda: self.plan.fired()[-1:] == [pause.label], "the zombie's pause", 300)
        zombie = self.plan.marker_info(pause.label)
        assert zombie["token"] != orphan["token"], "the pause fired in A's orphaned run"
        lease = self.jobdir.lease.read()
        assert lease is not None
        # B is stopped: its last renewal is in the lease (or one made in the instant between
        # the pause's marker and B's SIGSTOP, which only makes C wait longer)
        zombie_epoch, last_renewal = lease.epoch, lease.renewed
        paused_at = float(zombie["at"])
        if pause.point in EXECUTOR_POINTS:
            elsewhere(self.jobdir)
        if self.producer is not None:  # C's first query starts after the last record
            self.producer.finish()
        set_tasks(self.jobdir, 1)
        third = self._supervise("c")
        try:
            wait_for(
                lambda: self._first_batch_of_epoch_after(zombie_epoch) is not None,
                "supervisor C to take over and commit a batch",
                300,
            )
        except AssertionError as exc:
            record = self.jobdir.load()
            raise AssertionError(
                f"{exc} (zombie: {zombie}; job {record.status}, progress {record.progress}, "
                f"lease {self.jobdir.lease.read()}; supervisor C "
                f"{'running' if third.poll() is None else f'ended {third.returncode}'})\n"
                f"{driver_log_tail(self.jobdir.logs)}"
            ) from None
        taken = self._first_batch_of_epoch_after(zombie_epoch)
        assert taken is not None
        waited = float(taken["started"]) - last_renewal
        assert waited >= ttl - 0.05, (
            f"supervisor C took the job over {waited:.2f}s after the zombie's last lease "
            f"renewal; it must wait for the lease ({ttl}s) to expire"
        )
        notes.append(
            f"take-over {waited:.1f}s after the zombie's last renewal, "
            f"{float(taken['started']) - paused_at:.1f}s after its pause (lease ttl {ttl}s)"
        )
        if pause.point in EXECUTOR_POINTS:
            self._zombie_write_task(second, zombie, int(taken["run"]), notes)
        else:
            for pid in [int(zombie["supervisor"]), *processes.processes_of(str(zombie["token"]))]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            resumed = time.monotonic()
            wait_for(
                lambda: (
                    second.poll() is not None and not processes.processes_of(str(zombie["token"]))
                ),
                "the zombie (supervisor B and its driver run) to stop",
                60,
            )
            notes.append(
                f"zombie stopped {time.monotonic() - resumed:.1f}s after SIGCONT (supervisor B "
                f"exit {second.returncode})"
            )
        check_zombie_wrote_nothing(self.jobdir, zombie, zombie_epoch, notes)
        done = self._random_kills(third, notes, kills=2)
        assert done == 2, f"only {done} of 2 random kills happened before the job ended: {notes}"
        last = third
        if self.producer is not None:
            self.producer.stop()
            notes.append(f"{self.producer.produced} records arrived while the job ran")
            if self.scenario.graceful_stop:
                last = self._stopped_gracefully(third, notes)
        wait_for(lambda: last.poll() is not None, "the last supervisor to finish the job", 600)
        record = self.jobdir.load()
        if last.returncode != 0:
            record.failure = f"{record.failure}\n{driver_log_tail(self.jobdir.logs)}"
        return record

    def _stopped_gracefully(
        self, running: subprocess.Popen[str], notes: list[str]
    ) -> subprocess.Popen[str]:
        """Suspend the job gracefully while supervisor ``running`` (C) runs its query (which
        is stopped: the parts' close and abort paths run), check that the stop left nothing in
        doubt, and resume the job with supervisor D, which finishes it.

        So that C's query still has batches to run when the suspend comes, a burst of records
        arrives, and C's query starts again to take it: its source runner (a Python worker
        of the driver) is killed and the query restarted in place (a source without one,
        Spark's own: the whole driver run is killed). The suspend is asked for at C's first
        committed batch after that restart."""
        assert self.producer is not None
        if running.poll() is not None:
            raise AssertionError(f"supervisor C ended ({running.returncode}) before the stop")
        per_batch = int(self._spec()["source_options"].get("maxRecordsPerBatch", 100))
        self.producer.burst(10 * per_batch)
        batch = self.jobdir.load().progress.get("batch", -1)
        token = str(self.jobdir.load().driver.get("token") or "")
        runners = [
            pid
            for pid in processes.python_workers(token)
            if SOURCE_RUNNER in processes.command_line(pid)
        ]
        if runners:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runners[0], signal.SIGKILL)
            notes.append(f"source runner killed after batch {batch}: the query restarts")
        else:
            with contextlib.suppress(TimeoutError):
                processes.kill_run(token)
            notes.append(f"the whole driver run killed after batch {batch}: a new one starts")
        wait_for(
            lambda: running.poll() is not None or self._restarted_run_committed(batch),
            "a batch of C's restarted query",
            300,
        )
        request(self.jobdir, "suspend")
        wait_for(lambda: running.poll() is not None, "supervisor C to suspend the job", 120)
        status = self.jobdir.load().status
        assert status == JobStatus.SUSPENDED, (
            f"the job is {status.value}, not suspended: C finished the burst of "
            f"{10 * per_batch} records before the suspend"
        )
        left = self.in_doubt() if self.in_doubt is not None else []
        assert not left, f"the graceful stop left transactions in doubt: {left}"
        notes.append(f"suspended at batch {self.jobdir.load().progress.get('batch')}, gracefully")
        return self._supervise("d")

    def _zombie_write_task(
        self, supervisor: subprocess.Popen[str], zombie: dict, taker_run: int, notes: list[str]
    ) -> None:
        """The zombie is a write task: B's supervisor and driver are lost (SIGKILL, as when
        their machine is gone) while the task's Python worker, paused after it wrote its
        rows, lives on (an executor on another machine, cut off from its driver: B's lease
        was marked as held elsewhere, see :func:`elsewhere`). Woken (SIGCONT) once C has
        committed a batch, it must prepare nothing: no transaction of a run before C's
        (``taker_run``) may be in doubt when it has ended, since C's recovery settled every
        one that was."""
        task, token = int(zombie["pid"]), str(zombie["token"])
        assert processes.alive(task), "the zombie write task is gone before its driver"
        # woken first: a process still stopped when the last of its driver run's others dies
        # gets SIGHUP from the kernel (an orphaned process group with a stopped member)
        os.kill(task, signal.SIGCONT)
        woken = time.monotonic()
        supervisor.kill()
        supervisor.wait()
        wait_for(
            lambda: not [p for p in processes.processes_of(token) if p != task and _kill(p)],
            "the zombie's driver run to die, its write task kept",
            30,
        )
        wait_for(
            lambda: not processes.alive(task) or bool(self._prepared_before(taker_run)),
            "the zombie write task to end",
            60,
        )
        prepared = self._prepared_before(taker_run)
        assert not prepared, (
            f"the zombie write task (batch {zombie.get('batch')}), woken after the take-over "
            f"by run {taker_run}, prepared {prepared}: a task of a driver that lost the job "
            "must prepare nothing (they stay in doubt, holding their locks, until a later "
            "recovery)"
        )
        notes.append(
            f"zombie write task of batch {zombie.get('batch')} woken after the take-over: "
            f"ended {time.monotonic() - woken:.1f}s later, nothing prepared"
        )

    def _prepared_before(self, run: int) -> list[str]:
        """The sink's transactions in doubt that a run before ``run`` prepared (those whose id
        is the runtime's transaction id: a sink that shows others cannot be told apart)."""
        if self.in_doubt is None:
            return []
        out = []
        for text in self.in_doubt():
            txn = TransactionId.parse(text)
            if txn is not None and txn.run < run:
                out.append(text)
        return out

    def _restarted_run_committed(self, batch: int) -> bool:
        record = self.jobdir.load()
        return record.progress.get("batch", -1) > batch and record.status == JobStatus.RUNNING

    def _spec(self) -> dict:
        with open(f"{self.jobdir.path}/{SPEC_FILE}") as fh:
            return dict(json.load(fh))

    def _supervise(self, tag: str) -> subprocess.Popen[str]:
        log = open(f"{self.jobdir.path}/supervisor-{tag}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "epochal",
                "jobs",
                "resume",
                self.jobdir.name,
                "--snapshot-dir",
                self.jobdir.snapshot_dir,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=with_temp_dir(self.temp_dir),
        )
        self.supervisors.append(proc)
        return proc

    def _first_batch_of_epoch_after(self, epoch: int) -> dict | None:
        for run in self.jobdir.load().runs:
            if int(run.get("epoch", 0)) > epoch and run.get("first_batch_at"):
                return run
        return None

    def _random_kills(self, supervisor: subprocess.Popen[str], notes: list[str], kills: int) -> int:
        """Kill, at random moments, the active driver run and one of its Python workers
        (each kind at least once when ``kills`` >= 2, in random order); returns how many
        kills happened."""
        kinds = ["driver", "worker"] * (kills // 2) + [self.random.choice(["driver", "worker"])]
        kinds = kinds[:kills]
        self.random.shuffle(kinds)
        done = 0
        for kind in kinds:
            batch = self.jobdir.load().progress.get("batch", -1)
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda b=batch: (
                        supervisor.poll() is not None
                        or self.jobdir.load().progress.get("batch", -1) > b
                    ),
                    "another committed batch",
                    120,
                )
            if supervisor.poll() is not None:
                break
            time.sleep(self.random.uniform(0.0, 1.5))  # a random moment, by design
            token = str(self.jobdir.load().driver.get("token") or "")
            victims = processes.processes_of(token)
            workers = processes.python_workers(token)
            at = self.jobdir.load().progress.get("batch")
            if kind == "worker" and workers:
                victim = self.random.choice(workers)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                notes.append(f"random kill after batch {at}: Python worker {victim}")
                done += 1
            elif victims:
                with contextlib.suppress(TimeoutError):
                    processes.kill_run(token)
                notes.append(f"random kill after batch {at}: the whole driver run")
                done += 1
        return done


def elsewhere(jobdir: JobDirectory) -> None:
    """Mark the job's lease as held on another machine (its holder is paused: nothing
    renews it meanwhile). A new holder then takes it only once it expired, and leaves the
    old holder's processes alone, as it must for a holder it cannot see: on one machine it
    ends every process of the old holder's driver runs, a zombie write task included."""
    lease = jobdir.lease.read()
    assert lease is not None, "the job has no lease"
    moved = replace(lease, host=f"{lease.host}.elsewhere")
    put_record(jobdir.lease.files, LEASE_RECORD, moved.to_record())


def _kill(pid: int) -> bool:
    """SIGKILL ``pid``; True (it was there to kill)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def set_tasks(jobdir: JobDirectory, tasks: int) -> None:
    """From the next query start on, the job's source gives each batch about ``tasks`` tasks
    (``minRecordsPerTask`` of its read limit / ``tasks``): the job's parallelism changes
    (the spec the kit's pipeline reads at each start, in the job's directory)."""
    path = f"{jobdir.path}/{SPEC_FILE}"
    with open(path) as fh:
        spec = json.load(fh)
    options = spec["source_options"]
    if "minRecordsPerTask" in options:  # an epochal source (the kit sets it for those only)
        per_batch = int(options["maxRecordsPerBatch"])
        options["minRecordsPerTask"] = str(max(1, -(-per_batch // tasks)))
        with open(path, "w") as fh:
            json.dump(spec, fh)


class KeepProducing:
    """Records that keep arriving while a scenario runs: a thread gives the source ``chunk``
    new record IDs every ``every`` seconds, after the ones produced before the job started,
    until :meth:`stop` (or ``limit`` records)."""

    def __init__(
        self,
        produce: Callable[[Sequence[int]], None],
        first: int,
        chunk: int = 20,
        every: float = 1.0,
        limit: int = 600,
    ) -> None:
        self.produce, self.next, self.chunk, self.every, self.limit = (
            produce,
            first,
            chunk,
            every,
            limit,
        )
        self.produced = 0
        self.ids: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="epochal-kit-producer", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start producing."""
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every) and self.produced < self.limit:
                self._give(self.chunk)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _give(self, count: int) -> None:
        with self._lock:
            ids = list(range(self.next, self.next + count))
            self.produce(ids)
            self.ids += ids
            self.next += count
            self.produced += count

    def finish(self, timeout: float = 120.0) -> None:
        """Wait until the thread gave its ``limit`` records (it stops by itself there). A job
        at the available-now trigger reads up to what its query found at its start: records
        that arrive after the last query start of a run that then finishes are never read,
        so the kit lets the input end before the last driver (C) starts."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(
                f"the producer gave {self.produced} of {self.limit} records in {timeout:.0f} s"
            )

    def burst(self, count: int) -> None:
        """Give the source ``count`` more records at once (whether the thread runs or not)."""
        self._give(count)

    def stop(self) -> None:
        """Stop producing (at once) and wait for the thread; raise what it failed with."""
        self._stop.set()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(60)
        if self.error is not None:
            raise AssertionError(f"producing records while the job ran failed: {self.error}")


def check_zombie_wrote_nothing(
    jobdir: JobDirectory, zombie: dict, zombie_epoch: int, notes: list[str]
) -> None:
    """Nothing written through the zombie's (moved) state directory, and no commit decision
    of the zombie's epoch for the batch it was paused in or a later one."""
    epochs = sorted(os.listdir(f"{jobdir.path}/epochs"))
    lease = jobdir.lease.read()
    assert lease is not None and epochs == [str(lease.state)], (
        f"the zombie wrote through its old state directory: epochs/ holds {epochs}"
    )
    paused_batch = zombie.get("batch")
    late = []
    for sink_id, batch, decision in recorded_decisions(jobdir.store):
        if (
            paused_batch is not None
            and batch >= int(paused_batch)
            and int(decision.get("lease_epoch", 0)) <= zombie_epoch
        ):
            late.append((sink_id, batch, decision.get("lease_epoch")))
    assert not late, f"the zombie recorded commit decisions after its pause: {late}"
    notes.append(f"zombie (epoch {zombie_epoch}, paused at batch {paused_batch}) wrote nothing")


class ZombieUpsert(RealFailures):
    """The zombie write task of an idempotent sink: can a task of a driver that lost the
    job write an old value over a newer one? The pipeline is the running aggregation (a
    group's value, ``count:sum``, only grows), in the sink's idempotent mode:

    1. Supervisor A runs the job until one of its write tasks has upserted a batch's rows
       (``sink.after_write``, before its flush), where the fault pauses A and its whole
       driver run (SIGSTOP); A's lease is taken for one held on another machine.
    2. Supervisor C resumes the job: it waits for the lease to expire, takes over at a new
       epoch, replays the batch and finishes the job (every record is there before it
       starts: nothing else writes afterwards).
    3. The sink's values are read; A's supervisor and driver are lost (SIGKILL), and the
       paused task alone is woken, as an executor cut off from its replaced driver would
       be. When it has ended, the sink is read again: no group's value may have gone back
       (a task that flushed its old totals over C's newer ones).
    """

    def __init__(
        self,
        jobdir: JobDirectory,
        scenario: Scenario,
        config: JobConfig,
        seed: str,
        temp_dir: str,
        committed: Callable[[], list[tuple[str, str]]],
    ):
        super().__init__(jobdir, scenario, config, seed, temp_dir)
        self.committed = committed
        """The sink's (key, value) entries, as the independent reader sees them now."""

    def _run(self, notes: list[str]) -> JobRecord:
        (pause,) = self.scenario.faults
        submit(self.jobdir.name, f"epochal.pipelines:{self.scenario.pipeline}", self.config)
        first = self._supervise("a")
        wait_for(
            lambda: self.plan.fired() == [pause.label] or first.poll() is not None,
            "a write task of supervisor A to pause",
            300,
        )
        assert first.poll() is None, f"supervisor A ended ({first.returncode}) before the pause"
        zombie = self.plan.marker_info(pause.label)
        elsewhere(self.jobdir)
        lease = self.jobdir.lease.read()
        assert lease is not None
        zombie_epoch = lease.epoch
        taker = self._supervise("c")
        wait_for(lambda: taker.poll() is not None, "supervisor C to take over and finish", 600)
        record = self.jobdir.load()
        if taker.returncode != 0 or record.status != JobStatus.COMPLETED:
            record.failure = f"{record.failure}\n{driver_log_tail(self.jobdir.logs)}"
            return record
        taken = self._first_batch_of_epoch_after(zombie_epoch)
        assert taken is not None, f"no run after epoch {zombie_epoch}: {record.runs}"
        before = _group_counts(self.committed())
        task, token = int(zombie["pid"]), str(zombie["token"])
        assert processes.alive(task), "the zombie write task is gone before its driver"
        os.kill(task, signal.SIGCONT)  # first: see RealFailures._zombie_write_task
        woken = time.monotonic()
        first.kill()
        first.wait()
        wait_for(
            lambda: not [p for p in processes.processes_of(token) if p != task and _kill(p)],
            "the zombie's driver run to die, its write task kept",
            30,
        )
        wait_for(lambda: not processes.alive(task), "the zombie write task to end", 60)
        after = _group_counts(self.committed())
        back = {k: (before[k], after.get(k)) for k in before if after.get(k, 0) < before[k]}
        assert not back, (
            f"the zombie write task (batch {zombie.get('batch')} of a driver that lost the job "
            f"at epoch {zombie_epoch}), woken after run {taken['run']} finished the job, "
            f"wrote old values over newer ones (group: (count before, count after)): {back}"
        )
        notes.append(
            f"zombie upsert task of batch {zombie.get('batch')} woken after the take-over "
            f"finished the job: ended {time.monotonic() - woken:.1f}s later, no value went back"
        )
        return self.jobdir.load()


def _group_counts(entries: list[tuple[str, str]]) -> dict[str, int]:
    """Each group's last count (``count:sum``) among the sink's entries."""
    last: dict[str, int] = {}
    for key, value in entries:
        last[key] = int(value.partition(":")[0] or 0)
    return last
