"""The driver: the runs of a job's query, in a child process of the supervisor.

``python -m epochal.driver --profile P --epoch N <snapshot_dir> <job>`` builds the
SparkSession of the session profile ``P``, checks the quorum, rebuilds the query from the
user's function, points it at the checkpoint of its lease epoch, runs it and reports
progress. With ``--standby`` it builds the session, warms it up and waits for the supervisor
to promote it (a line ``promote <epoch> <snapshot_dir> <job>`` on stdin): a standby of one
job, or a warm driver of a pool that any job with the same profile can take.

A restartable failure that leaves the driver healthy (a lost server, a crashed Python worker,
a lost executor) restarts the query *in place*: same JVM, same SparkSession, a new run, with
the job's backoff and restart limit. Everything else ends the process: :data:`EXIT_DONE`
(finished or stopped on request), :data:`EXIT_RESTARTABLE` (a new driver can recover),
:data:`EXIT_FENCED` (another driver owns the job) or :data:`EXIT_FATAL`.

A driver never outlives its supervisor or its lease: it dies with its parent (the kernel's
parent-death signal, and its stdin closing), and a watchdog thread kills the whole run (every
process with the run's token) when the lease moved to another epoch or was not renewed for
half its time-to-live, so it has stopped before any other driver may take over.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochal import files, objectstore, processes, restart, secrets
from epochal.context import (
    ENV_ALLOW_DOWNGRADE,
    ENV_FAULTS,
    ENV_GUARANTEE,
    ENV_JOB,
    ENV_JOB_DIR,
)
from epochal.failures import (
    EXIT_DONE,
    EXIT_FATAL,
    EXIT_FENCED,
    EXIT_RESTARTABLE,
    FENCED,
    STOPPED_ON_ITS_OWN_MARK,
    Failure,
    identify,
)
from epochal.faults import FaultPlan
from epochal.fence import RUN_DIR_ENV, Fence, checkpoint_location, state_dir, write_run_record
from epochal.jobs import PROGRESS_PREFIX, JobDirectory, JobRecord, JobStatus
from epochal.lease import LEASE_TTL
from epochal.registry import EXTRA_PLUGINS_ENV
from epochal.store import Checkpoint, SnapshotStore
from epochal_sdk import FencedError
from epochal_sdk.errors import STARTING_ENV

log = logging.getLogger("epochal.driver")

QUORUM_WAIT_ENV = "EPOCHAL_QUORUM_WAIT_SECONDS"
"""How long a restart waits for the split-brain quorum of executors (default 30 s)."""
HEARTBEAT_SECONDS = 1.0
"""How often a driver tells its supervisor it is alive."""


class QuorumNotMetError(Exception):
    """Fewer executors than the split-brain quorum; retry later."""


# -- talking to the supervisor ---------------------------------------------------------------
_OUT = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    """One event line for the supervisor (progress, heartbeat, ready, run)."""
    line = PROGRESS_PREFIX + json.dumps(event)
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def self_destruct(reason: str) -> None:
    """Kill every process of this driver run (PySpark daemons and workers included), then
    this one. Used when the run must stop *now*: fenced, orphaned, lease not renewed."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"epochal driver: {reason}; killing this driver run\n")
        sys.stderr.flush()
    token = os.environ.get(processes.RUN_TOKEN_ENV, "")
    for pid in processes.processes_of(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _heartbeat() -> None:
    while True:
        emit({"type": "heartbeat", "at": time.time()})
        time.sleep(HEARTBEAT_SECONDS)


class Supervision:
    """What the driver gets from its supervisor: stdin (promotion; EOF = the supervisor is
    gone) and the parent-death signal."""

    def __init__(self) -> None:
        self.supervisor_pid = int(os.environ.get(processes.SUPERVISOR_PID_ENV, os.getppid()))
        self._promotion: tuple[int, str, str] | None = None
        self.env: dict[str, str] = {}
        self._promoted = threading.Event()

    def start(self) -> None:
        processes.die_with_parent(signal.SIGKILL)
        if os.getppid() != self.supervisor_pid:
            self_destruct("the supervisor died before this driver started")
        threading.Thread(target=self._read_stdin, name="epochal-stdin", daemon=True).start()
        threading.Thread(target=_heartbeat, name="epochal-heartbeat", daemon=True).start()

    def _read_stdin(self) -> None:
        for line in sys.stdin:
            message = json.loads(line) if line.strip().startswith("{") else {}
            if message.get("promote"):
                self.env = dict(message.get("env") or {})
                self._promotion = (
                    int(message["epoch"]),
                    str(message["snapshot_dir"]),
                    str(message["job"]),
                )
                self._promoted.set()
        self_destruct("the supervisor is gone (its pipe closed)")

    @property
    def promoted(self) -> bool:
        """Whether the supervisor has promoted this driver (the job is waiting for it)."""
        return self._promoted.is_set()

    def wait_for_promotion(
        self, meanwhile: Callable[[], object] | None = None, every: float = 0.0
    ) -> tuple[int, str, str]:
        """Block until the supervisor promotes this warm driver: the lease epoch it runs at,
        and the job (snapshot directory, name). ``meanwhile`` (if given) is called every
        ``every`` seconds while it waits."""
        while not self._promoted.wait(every if meanwhile is not None else None):
            assert meanwhile is not None
            meanwhile()
        assert self._promotion is not None
        return self._promotion


class LeaseWatchdog:
    """Stops the whole driver run as soon as it may no longer act: the lease moved to another
    epoch, or it was not renewed (or could not be read) for half its time-to-live, which is
    before any other supervisor may take the job over."""

    def __init__(self, jobdir: JobDirectory, epoch: int, supervisor_pid: int) -> None:
        self.jobdir, self.epoch, self.supervisor_pid = jobdir, epoch, supervisor_pid

    def start(self) -> None:
        threading.Thread(target=self._watch, name="epochal-lease-watchdog", daemon=True).start()

    def _watch(self) -> None:
        last_ok = time.monotonic()
        while True:
            lease = None
            with contextlib.suppress(Exception):
                lease = self.jobdir.lease()
            ttl = lease.ttl if lease else LEASE_TTL
            margin = ttl / 2
            if os.getppid() != self.supervisor_pid:
                self_destruct("the supervisor died")
            if lease is not None:
                if lease.epoch != self.epoch:
                    self_destruct(
                        f"fenced: the job's lease moved from epoch {self.epoch} to "
                        f"{lease.epoch} (pid {lease.pid})"
                    )
                age = lease.age()
                if age > margin:
                    self_destruct(f"the lease was not renewed for {age:.1f}s (limit {margin}s)")
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > margin:
                self_destruct(f"the lease could not be read for {margin}s")
            time.sleep(min(0.5, ttl / 20))


# -- the session ---------------------------------------------------------------------------
class PlannerKeeper:
    """Keeps the Python workers that a query's start takes (its planners) alive while the
    driver runs the job, so an in-place restart finds them: one tiny batch job through the
    warm-up source every :data:`~epochal.spark.warmup.KEEP_WARM_SECONDS` (see
    :func:`~epochal.spark.warmup.touch_planners`); a failure there is only logged."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def start(self) -> None:
        threading.Thread(target=self._keep, name="epochal-keep-warm", daemon=True).start()

    def _keep(self) -> None:
        from epochal.spark import warmup  # not at the top: the supervisor imports this module

        registered = False
        while True:
            time.sleep(warmup.KEEP_WARM_SECONDS)
            try:
                if not registered:
                    warmup.register(self.spark)
                    registered = True
                warmup.touch_planners(self.spark)
            except Exception:  # a cancel of every job: next round
                if not session_alive(self.spark):
                    return  # the driver is ending
                log.warning("keeping the planner workers warm failed", exc_info=True)


def session_alive(spark: Any) -> bool:
    """Whether the session's JVM and SparkContext are up (not stopped, not gone)."""
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:
        return False


def load_target(target: str) -> Any:
    """Import ``module:function``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target {target!r} must look like module:function")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _environment(record: JobRecord, jobdir: JobDirectory) -> None:
    config = record.job_config
    os.environ.update(
        {
            ENV_JOB: record.name,
            ENV_JOB_DIR: jobdir.path,
            ENV_GUARANTEE: config.guarantee.label,
            ENV_ALLOW_DOWNGRADE: "1" if config.allow_downgrade else "0",
            ENV_FAULTS: config.faults,
        }
    )
    for entry in reversed(record.python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _expected_executors(master: str, conf: dict[str, str] | None = None) -> int:
    """How many executors the job asks for: ``local-cluster[N,…]``'s N; on a cluster
    ``spark.executor.instances``, or ``spark.cores.max / spark.executor.cores``; else 1."""
    match = re.match(r"local-cluster\[(\d+)", master)
    if match:
        return int(match.group(1))
    if master.startswith("local"):
        return 1
    conf = conf or {}
    with contextlib.suppress(ValueError):
        if conf.get("spark.executor.instances"):
            return max(1, int(conf["spark.executor.instances"]))
        if conf.get("spark.cores.max"):
            per = int(conf.get("spark.executor.cores") or 1)
            return max(1, int(conf["spark.cores.max"]) // max(1, per))
    return 1


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
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }


def spark_session(profile: SessionProfile, app_name: str = "epochal") -> Any:
    """A SparkSession for a profile (its master, state store and settings)."""
    from pyspark.sql import SparkSession

    from epochal.spark.classdata import driver_java_options
    from epochal.spark.home import use_fast_spark_home
    from epochal.spark.statefiles import session_conf

    use_fast_spark_home(profile.master)

    builder = (
        SparkSession.builder.master(profile.master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config(f"spark.executorEnv.{STARTING_ENV}", "0")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.sql.streaming.stopTimeout", "30s")
        # Hadoop's file systems apply their own umask to what they create (the checkpoint)
        .config("spark.hadoop.fs.permissions.umask-mode", "077")
    )
    token = os.environ.get(processes.RUN_TOKEN_ENV)
    if token:  # executors' Python workers carry the run token too (kill_run finds them)
        builder = builder.config(f"spark.executorEnv.{processes.RUN_TOKEN_ENV}", token)
    if profile.master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "600m").config(
            "spark.task.maxFailures", "4"
        )
    for key, value in objectstore.spark_conf().items():  # s3a:// checkpoints, executors' store
        builder = builder.config(key, value)
    for key, value in session_conf(profile.master).items():  # state files linked, not copied
        builder = builder.config(key, value)
    conf = dict(profile.spark_conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    # the class-data archive, when there is one (a faster JVM start)
    java_options = driver_java_options(conf.get("spark.driver.extraJavaOptions", ""))
    builder = builder.config("spark.driver.extraJavaOptions", follow_tmpdir(java_options))
    if profile.master.startswith("local-cluster"):  # executors started on this machine
        executor_options = conf.get("spark.executor.extraJavaOptions", "")
        builder = builder.config("spark.executor.extraJavaOptions", follow_tmpdir(executor_options))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def follow_tmpdir(java_options: str) -> str:
    """JVM options with the JVM's temporary directory set to this process's (``TMPDIR``,
    which a supervisor points at the driver run's scratch directory), unless they set one:
    the JVM ignores ``TMPDIR``, and what it leaves in its temporary directory when it is
    killed (Spark's local directories, the RocksDB and LZ4 libraries it unpacks, 15 MB a
    start) would stay there for good."""
    if "-Djava.io.tmpdir=" in java_options:
        return java_options
    return f"{java_options} -Djava.io.tmpdir={shlex.quote(tempfile.gettempdir())}".strip()


def executor_count(spark: Any) -> int:
    """Executors registered now (the driver alone counts as one in local mode)."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return max(1, status.size() - 1) if status.size() > 1 else 1


def wait_for_executors(spark: Any, wanted: int, seconds: float) -> int:
    """Wait (with a deadline) until ``wanted`` executors registered; the count reached."""
    deadline = time.monotonic() + seconds
    count = executor_count(spark)
    while count < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        count = executor_count(spark)
    return count


def checkpoint_manifest(state: str, batch: int, fence: Fence) -> None:
    """Record the checksums of Spark's offset and commit log entries of ``batch``."""
    entry = {}
    checkpoint = Checkpoint(f"{state}/checkpoint")
    for log_name in ("offsets", "commits"):
        try:
            data = checkpoint.read(f"{log_name}/{batch}")
        except OSError:
            continue
        if data is not None:
            entry[log_name] = hashlib.sha256(data).hexdigest()
    if entry:
        store = SnapshotStore(f"{state}/store", anchor=state if fence.active else None)
        store.write_json(f"checkpoint/{batch:012d}", entry, count=len(entry))


# -- runs ----------------------------------------------------------------------------------
SOURCE_RUNNER_MODULE = b"python_streaming_source_runner"
"""What PySpark's streaming source runner (one Python process per Python source of a query,
kept for the query's whole run) shows in its command line."""
RUNNER_DEATH_MARK = "PythonStreamingSourceRunner"
"""Begins the failure text of a run whose source runner the driver saw die (a crashed
Python worker on the driver: restarted in place, see :mod:`epochal.failures`)."""


class SourceRunnerWatch:
    """Notices at once when a streaming source runner of the query dies (killed, crashed).

    Spark notices only at its next call into the runner: the next trigger, or the end of the
    batch in flight, a whole trigger interval later at worst; the driver stops the query and
    restarts it in place now instead. The runners are the children of the driver's JVM
    started after the query (looked for until the query's first batch, at most
    ``LOOK_SECONDS``; a query without Python sources has none)."""

    LOOK_SECONDS = 60.0

    def __init__(self, jvm_pid: int | None) -> None:
        self.jvm_pid = jvm_pid
        self.before = set(self._runners())
        self.pids: set[int] = set()
        self.looking_until = time.monotonic() + self.LOOK_SECONDS

    def _runners(self) -> list[int]:
        if self.jvm_pid is None:
            return []
        return processes.children_running(self.jvm_pid, SOURCE_RUNNER_MODULE)

    def dead(self, first_batch_seen: bool) -> int | None:
        """A runner of this query that has died since it started (its pid), else None."""
        if not first_batch_seen and time.monotonic() < self.looking_until:
            self.pids.update(p for p in self._runners() if p not in self.before)
        return next((pid for pid in sorted(self.pids) if not processes.alive(pid)), None)


def _jvm_pid(spark: Any) -> int | None:
    """The pid of the driver's JVM (PySpark started it as a child of this process)."""
    with contextlib.suppress(Exception):
        return int(spark.sparkContext._gateway.proc.pid)
    return None


class Phases:
    """Where a run's start went: seconds spent in each step up to its first batch (the
    process and its session, connector registration, binding to the job, the quorum, the
    query's start, the first batch), kept in the run's history entry."""

    def __init__(self, started: float) -> None:
        self._last = started
        self._spent: dict[str, float] = {}

    def mark(self, step: str, since: float | None = None) -> None:
        now = time.time()
        self._spent[step] = round(now - (self._last if since is None else since), 3)
        self._last = now

    def as_dict(self) -> dict[str, float]:
        return dict(self._spent)


@dataclass
class RunState:
    """The run the driver is on now (shared with the listener's thread)."""

    run: int = 0
    kind: str = "cold"
    started: float = 0.0
    query_run_id: str | None = None
    first_batch_seen: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Driver:
    """One driver process: its session, then (once bound to a job) its lease epoch and the
    runs of the job's query."""

    def __init__(self, supervision: Supervision, profile: SessionProfile) -> None:
        self.supervision = supervision
        self.profile = profile
        self.jobdir: JobDirectory | None = None
        self.record: JobRecord | None = None
        self.epoch = 0
        self.fence = Fence(None, 0)
        self.faults = FaultPlan()
        self.current = RunState()
        self.spark: Any = None
        self.phases = Phases(time.time())
        self.runners = SourceRunnerWatch(None)

    @property
    def state(self) -> str:
        assert self.jobdir is not None
        return state_dir(self.jobdir.path, self.epoch)

    @property
    def config(self) -> Any:
        assert self.record is not None
        return self.record.job_config

    def main(
        self, job: tuple[int, str, str] | None, launched: float, keep_warm: bool = False
    ) -> int:
        """Start the session; when ``job`` (epoch, snapshot dir, name) is None, warm up and
        wait to be promoted (with ``keep_warm``, warming up again every
        :data:`~epochal.spark.warmup.KEEP_WARM_SECONDS` while it waits); then run the job
        until done. Returns the exit code."""
        try:
            self.phases.mark("process", since=launched)
            from epochal.spark.datasource import register

            self.spark = spark_session(self.profile)
            self.phases.mark("session")
            register(self.spark)
            self.phases.mark("register")
            kind = "cold"
            if job is None:
                from epochal.spark import warmup

                # promoted while it warms up: the job is waiting, so the warm-up stops there
                def promoted() -> bool:
                    return self.supervision.promoted

                took = 0.0 if promoted() else warmup.warm_up(self.spark, stop_if=promoted)
                emit({"type": "ready", "warmup_s": round(took, 2)})

                def stay_warm() -> None:
                    warmup.keep_warm(self.spark, stop_if=promoted)

                job = self.supervision.wait_for_promotion(
                    stay_warm if keep_warm else None, every=warmup.KEEP_WARM_SECONDS
                )
                kind, launched = "standby", time.time()
                self.phases = Phases(launched)
            build = self._bind(*job)
            self.phases.mark("bind")
            return self._runs(build, kind, launched)
        except BaseException as exc:
            text = "".join(traceback.format_exception(exc))
            return self._fail(text)
        finally:
            if self.spark is not None:
                with contextlib.suppress(Exception):
                    self.spark.stop()

    def _bind(self, epoch: int, snapshot_dir: str, name: str) -> Any:
        """Become the driver of job ``name`` at lease ``epoch``: its fence, its watchdog,
        its listener; returns the job's build function."""
        os.environ.update(self.supervision.env)  # the supervisor's, as it is now
        self.jobdir = JobDirectory(snapshot_dir, name)
        self.record = self.jobdir.load()
        wanted = SessionProfile.of(self.record)
        if wanted.master != self.profile.master or wanted.spark_conf != self.profile.spark_conf:
            raise ValueError(
                f"this driver's session ({self.profile.master}) does not fit job {name!r} "
                f"({wanted.master}); the supervisor must start a new driver"
            )
        _environment(self.record, self.jobdir)
        self.epoch = epoch
        self.fence = self.jobdir.fence(epoch)
        self.faults = FaultPlan.parse(self.record.job_config.faults, f"{self.jobdir.path}/faults")
        LeaseWatchdog(self.jobdir, epoch, self.supervision.supervisor_pid).start()
        self.spark.streams.addListener(make_listener(self))
        PlannerKeeper(self.spark).start()
        return load_target(self.record.target)

    def _runs(self, build: Any, kind: str, started: float) -> int:
        while True:
            self._check_quorum()
            self.phases.mark("quorum")
            self._begin_run(kind, started)
            query = self._start_query(build)
            self.phases.mark("query start")
            outcome = self._watch(query)
            seen = time.time()  # the failed query has ended: its run ends here
            if outcome is None:
                return EXIT_DONE
            failure = identify(outcome)
            if failure.failure is Failure.FATAL or not failure.in_place or not self._healthy():
                return self._fail(outcome)
            if not self._restart_in_place(outcome, seen):
                return EXIT_FATAL
            kind, started = "in-place", seen
            self.phases = Phases(started)
            self.phases.mark("restart")  # the record, the old query's tasks, the backoff

    def _check_quorum(self) -> None:
        assert self.jobdir is not None and self.record is not None
        wanted = _expected_executors(self.config.master, dict(self.config.spark_conf))
        if self.config.master.startswith("local") or self.jobdir.load().original_executors is None:
            count = wait_for_executors(self.spark, wanted, 120)
        else:  # a restart on a cluster: what is there now (the quorum check waits below)
            count = executor_count(self.spark)
        with self.jobdir.update(self.fence) as current:
            if current.original_executors is None:
                current.original_executors = count
            original = current.original_executors
        if self.config.split_brain_protection:
            quorum = original // 2 + 1
            count = wait_for_executors(
                self.spark, quorum, float(os.environ.get(QUORUM_WAIT_ENV, "30"))
            )
            if count < quorum:
                raise QuorumNotMetError(
                    f"QuorumNotMet: job {self.record.name!r} first ran with {original} "
                    f"executors; a restart needs {quorum} (split-brain protection) but only "
                    f"{count} are up"
                )

    def _begin_run(self, kind: str, started: float) -> None:
        """A new run: its number, its record (for its data sources), its history entry."""
        assert self.jobdir is not None and self.record is not None
        with self.jobdir.update(self.fence) as current:
            current.run += 1
            current.status = JobStatus.RECOVERING
            current.driver = {
                "pid": os.getpid(),
                "epoch": self.epoch,
                "token": os.environ.get(processes.RUN_TOKEN_ENV),
            }
            if current.supervisor.get("standby_pid") == os.getpid():  # promoted: no standby
                current.supervisor = {
                    k: v for k, v in current.supervisor.items() if not k.startswith("standby_")
                }
            previous = current.runs[-1] if current.runs else None
            current.add_run(
                {
                    "run": current.run,
                    "epoch": self.epoch,
                    "kind": kind,
                    "started": started,
                    "failed_at": (previous or {}).get("ended"),
                    "driver_pid": os.getpid(),
                }
            )
            run = current.run
        config = self.config
        write_run_record(
            os.environ[RUN_DIR_ENV],
            os.environ[processes.RUN_TOKEN_ENV],
            {
                "job": self.record.name,
                "job_dir": self.jobdir.path,
                "guarantee": config.guarantee.label,
                "allow_downgrade": config.allow_downgrade,
                "faults": config.faults,
                "epoch": self.epoch,
                "run": run,
            },
        )
        with self.current.lock:
            self.current.run, self.current.kind, self.current.started = run, kind, started
            self.current.first_batch_seen = False
            self.current.query_run_id = None
        emit({"type": "run", "run": run, "kind": kind, "epoch": self.epoch})

    def _start_query(self, build: Any) -> Any:
        assert self.record is not None
        writer = build(self.spark)
        if not hasattr(writer, "start"):
            raise TypeError(
                f"{self.record.target} returned {type(writer).__name__}; it must return "
                "df.writeStream... (a DataStreamWriter, not started)"
            )
        writer = writer.option("checkpointLocation", checkpoint_location(self.state)).queryName(
            self.record.name
        )
        if self.config.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(
                processingTime=f"{int(self.config.snapshot_interval * 1000)} milliseconds"
            )
        self.runners = SourceRunnerWatch(_jvm_pid(self.spark))
        query = writer.start()
        with self.current.lock:
            self.current.query_run_id = str(query.runId)
        return query

    def _watch(self, query: Any) -> str | None:
        """Until the query ends: None when it finished (available-now) or was stopped on
        request, else the text of its failure. A continuous job's query that stops by itself
        is a failure too: the job must go on, so it is restarted, never marked completed."""
        assert self.jobdir is not None
        while query.isActive:
            try:
                query.awaitTermination(WATCH_POLL_SECONDS)
            except Exception:  # it failed: query.exception() below has the whole story
                break
            requested = self.jobdir.load().requested
            if requested in ("cancel", "suspend"):
                query.stop()
                return None
            dead = self.runners.dead(self.current.first_batch_seen)
            if dead is not None and not _ends_by_itself(self.spark, query):
                query.stop()
                return (
                    f"{RUNNER_DEATH_MARK}: the query's Python streaming source runner (pid "
                    f"{dead}) died (killed or crashed); the driver stops the query now rather "
                    "than at Spark's next call into it, and restarts it in place"
                )
        error = query.exception()
        if error is not None:
            return _failure_text(error)
        if self.config.available_now or self.jobdir.load().requested in ("cancel", "suspend"):
            return None
        return (
            f"{STOPPED_ON_ITS_OWN_MARK}: the streaming query of continuous job "
            f"{self.record.name!r} stopped without an error and without a suspend or cancel "
            "request (something in the driver stopped it); restarting it from its snapshot"
        )

    def _healthy(self) -> bool:
        """Whether the JVM and the SparkContext survived (an in-place restart is possible)."""
        return session_alive(self.spark)

    def _restart_in_place(self, text: str, ended: float) -> bool:
        """Count the restart, back off, wait for the old query's tasks; False when the
        job's restart limit is reached (the failure is recorded). ``ended``: when the failed
        query was seen to end."""
        summary = _summary(text)
        assert self.jobdir is not None
        with self.jobdir.update(self.fence) as current:
            self._end_run(current, summary, ended)
            decision = restart.decide(self.config, current.restarts_in_a_row, summary)
            if not decision.restart:
                current.failure = decision.give_up
                return False
            current.restarts += 1
            current.restarts_in_a_row += 1
            current.status = JobStatus.RESTARTING
            current.failure = summary
        backoff = decision.backoff
        sys.stderr.write(
            f"epochal driver: run failed ({summary}); restarting in place in {backoff:.1f}s\n"
        )
        _wait_for_idle(self.spark, 30.0)
        time.sleep(backoff)
        return True

    def _end_run(self, current: JobRecord, outcome: str, ended: float | None = None) -> None:
        entry = current.run_entry(self.current.run)
        if entry is not None:
            entry["ended"] = ended or time.time()
            entry["outcome"] = outcome[:300]

    def _fail(self, text: str) -> int:
        kind = identify(text)
        summary = _summary(text)
        if kind is FENCED:
            sys.stderr.write(f"epochal: this run was fenced: {summary}\n")
            return EXIT_FENCED
        if self.jobdir is not None and self.record is not None:
            with contextlib.suppress(FencedError), self.jobdir.update(self.fence) as current:
                current.failure = summary
                self._end_run(current, summary)
        sys.stderr.write(
            f"epochal: run failed ({kind.failure.value}: {kind.name}): {secrets.mask(text)}\n"
        )
        return EXIT_RESTARTABLE if kind.failure is Failure.RESTARTABLE else EXIT_FATAL

    # -- called by the listener -----------------------------------------------------------
    def on_progress(self, progress: Any) -> None:
        assert self.jobdir is not None and self.record is not None
        with self.current.lock:
            if str(progress.runId) != self.current.query_run_id:
                return  # a late event of a query that was restarted
            run, started = self.current.run, self.current.started
            first = not self.current.first_batch_seen
            self.current.first_batch_seen = True
        batch = int(progress.batchId)
        rows = int(progress.numInputRows)
        if rows == 0 and batch == self.record.progress.get("batch") and not first:
            return
        checkpoint_manifest(self.state, batch, self.fence)
        with self.jobdir.update(self.fence) as current:
            total = int(current.progress.get("rows", 0)) + rows
            current.progress = {
                "batch": batch,
                "rows": total,
                "last_rows": rows,
                "duration_ms": int(progress.batchDuration),
                "at": time.time(),
            }
            current.restarts_in_a_row = 0
            if first:
                current.status = JobStatus.RUNNING
                entry = current.run_entry(run)
                if entry is not None:
                    entry["first_batch"] = batch
                    entry["first_batch_at"] = time.time()
                    entry["first_batch_s"] = round(time.time() - started, 3)
                    entry["first_batch_rows"] = rows
                    entry["first_batch_spark_ms"] = {
                        str(k): int(v) for k, v in dict(progress.durationMs or {}).items()
                    }
                    self.phases.mark("first batch")
                    entry["phases"] = self.phases.as_dict()
                    if entry.get("failed_at"):
                        entry["recovery_s"] = round(time.time() - float(entry["failed_at"]), 3)
            self.record.progress = current.progress
        self._collect_metrics(batch, progress)
        emit(
            {
                "type": "progress",
                "job": self.record.name,
                "run": run,
                "batch": batch,
                "rows": rows,
            }
        )

    def _collect_metrics(self, batch: int, progress: Any) -> None:
        """Fold the parts' metrics of this batch and Spark's progress into the job's metrics;
        rewrite the Prometheus textfile (best effort: metrics never fail a batch)."""
        assert self.jobdir is not None and self.record is not None
        try:
            from epochal import metrics

            metrics.collect(self.jobdir.path, batch, json.loads(progress.json), self.record.created)
            metrics.write_textfile(self.jobdir)
        except Exception:
            log.warning("metrics of batch %s not collected", batch, exc_info=True)


def make_listener(driver: Driver) -> Any:
    """A listener that reports progress and records checkpoint manifests after each batch."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            try:
                driver.on_progress(event.progress)
            except FencedError as exc:
                self_destruct(f"fenced while reporting progress: {exc}")
            except Exception:  # progress must never break the query
                log.exception("progress report failed")
            driver.faults.reach("job.after_batch", int(event.progress.batchId))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return ProgressListener()


#: How often the driver's watch looks at its query, the job record and the source runners.
WATCH_POLL_SECONDS = 0.1
#: How long a query whose source runner died may take to end by itself (a stopping query
#: stops its runners first, then ends) before the driver stops it.
ENDING_GRACE_SECONDS = 0.3
#: The longest the driver lets a batch in flight finish after its source runner died.
BATCH_IN_FLIGHT_SECONDS = 10.0
#: What the driver's log says while it lets that batch finish.
BATCH_IN_FLIGHT_NOTE = (
    "the query's source runner died while a batch runs; letting the batch finish (its "
    "Python workers stay in the pool) before the query is restarted in place"
)


def _ends_by_itself(spark: Any, query: Any) -> bool:
    """Whether a query whose source runner is gone ends within a moment anyway: one that
    stops (finished, or stopping on a request) stops its runners first, and one whose
    failure Spark already met ends with its own error.

    While it waits, a batch in flight is let finish (at most ``BATCH_IN_FLIGHT_SECONDS``):
    its tasks do not need the runner, and stopping the query under them would destroy their
    Python workers (a task interrupted mid-stream never returns its worker to the pool), so
    the restarted query's first batch would fork new ones and import pandas and pyarrow again
    (1-1.5 s on a 2-core machine). The batch is finished when its trigger is, not when its
    Spark jobs are: after them the sink's commit runs on the driver, and a query stopped then
    aborts the batch (the restarted query reads and writes it again). That batch commits as
    any batch does; Spark's next call into the runner fails, or the driver stops the query
    first."""
    started = time.monotonic()
    said = False
    while True:
        try:
            if query.awaitTermination(0.05):
                return True
        except Exception:
            return True
        waited = time.monotonic() - started
        if waited >= BATCH_IN_FLIGHT_SECONDS:
            return False
        if waited >= ENDING_GRACE_SECONDS:
            if not _running_jobs(spark) and not _in_trigger(query):
                return False
            if not said:
                sys.stderr.write(f"epochal driver: {BATCH_IN_FLIGHT_NOTE}\n")
                said = True


def _in_trigger(query: Any) -> bool:
    """Whether the query is inside a trigger: planning a batch, running its tasks, or
    committing it on the driver after them (Spark's ``isTriggerActive``)."""
    try:
        return bool(query.status.get("isTriggerActive"))
    except Exception:  # it ended meanwhile
        return False


def _wait_for_idle(spark: Any, seconds: float) -> None:
    """Wait (with a deadline) until no Spark job of the failed query runs any more; cancel
    what is left, so no straggler task of the old run prepares after the new run's recovery."""
    deadline = time.monotonic() + seconds
    while _running_jobs(spark) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running_jobs(spark):
        spark.sparkContext.cancelAllJobs()


def _running_jobs(spark: Any) -> list[int]:
    """The Spark jobs running now, but the driver's own keep-warm jobs (the query's)."""
    from epochal.spark.warmup import KEEP_WARM_JOB_GROUP  # imports pyspark and pyarrow

    tracker = spark.sparkContext.statusTracker()
    keeping = set(tracker.getJobIdsForGroup(KEEP_WARM_JOB_GROUP))
    return [job for job in tracker.getActiveJobsIds() if job not in keeping]


def _failure_text(error: Any) -> str:
    """The whole text of a query's failure: its message and every cause, with the JVM's
    class names (a crashed worker shows only as ``java.io.EOFException`` in a cause: the
    query's own message is then empty) and the Python tracebacks the causes carry."""
    parts = [str(error)]
    cause, depth = getattr(error, "_cause", None), 0
    while cause is not None and depth < 12:
        origin = getattr(cause, "_origin", None)
        described = None
        with contextlib.suppress(Exception):
            described = str(origin.toString()) if origin is not None else None
        parts.append(f"caused by: {described or type(cause).__name__}: {cause}")
        cause, depth = getattr(cause, "_cause", None), depth + 1
    return "\n".join(parts)


def _summary(text: str) -> str:
    """The most telling line of a long Spark/Python error text (secrets masked): epochal's
    own error if there is one, else the first Python error, else the first Spark exception."""
    return secrets.mask(_telling_line(text))


def _telling_line(text: str) -> str:
    patterns = (
        r"(epochal\w*\.[\w.]*(?:Error|Exception): [^\n]+)",
        r"(\b\w+(?:Error|Exception): [^\n]+)",
        r"(SparkException: [^\n]+)",
    )
    step = re.search(r"epochal step: ([^\n]+)", text)
    where = f" [{step.group(1)}]" if step else ""
    spark = re.search(r"terminated with exception: ([^\n]+)", text)
    if spark and "Traceback" not in text:  # a JVM-side failure: Spark's own words
        return spark.group(1)[:2000] + where
    for pattern in patterns:
        found = re.findall(pattern, text)
        if found:
            return found[0][:2000] + where
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:2000] if lines else "unknown failure"


def main() -> None:
    """``python -m epochal.driver --profile P (--epoch N SNAPSHOT_DIR JOB | --standby
    [--keep-warm])``."""
    files.private_process()  # the checkpoint, the store, Spark's scratch files: owner-only
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m epochal.driver")
    parser.add_argument("snapshot_dir", nargs="?", help="the job's snapshot directory")
    parser.add_argument("job", nargs="?", help="the job's name")
    parser.add_argument("--profile", required=True, help="the session profile (JSON)")
    parser.add_argument("--epoch", type=int, help="the lease epoch this driver runs at")
    parser.add_argument("--standby", action="store_true", help="warm up, wait for promotion")
    parser.add_argument("--launched", type=float, default=None, help="when it was started")
    parser.add_argument(
        "--keep-warm", action="store_true", help="with --standby: stay warm while it waits"
    )
    args = parser.parse_args()
    if args.standby == (args.epoch is not None):
        parser.error("give exactly one of --epoch and --standby")
    if args.keep_warm and not args.standby:
        parser.error("--keep-warm is for a warm driver (--standby)")
    if args.epoch is not None and not (args.snapshot_dir and args.job):
        parser.error("--epoch needs the snapshot directory and the job")
    supervision = Supervision()
    supervision.start()
    driver = Driver(supervision, SessionProfile.from_json(args.profile))
    job = None if args.standby else (args.epoch, args.snapshot_dir, args.job)
    code = driver.main(job, args.launched or time.time(), keep_warm=args.keep_warm)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
