"""Metrics of a job, per batch and per part: what flowed, how long the protocol steps took,
what recovery found; shown by ``epochal jobs status``, ``epochal jobs metrics`` (Prometheus
text), a textfile beside the job and the supervisor's endpoint (``--metrics-port``).

Where they come from:

* every protocol step of a part reports what it measured as a small *pending* file under
  ``<job>/metrics/pending/`` (:func:`report`): a sink's per-batch commit (records and bytes
  written by its tasks, as the tasks' commit messages carry them; the decision and phase-2
  latencies; stray transactions rolled back; the connector's own metrics), an acknowledging
  source's driver side (records and bytes stored, duplicates dropped, acknowledgement
  latency), a replayable source's read tasks (records and bytes read, when the executors
  see the job's directory: local mode and shared file systems), a sink's recovery (in-doubt
  transactions found, committed, rolled back);
* after each batch the driver folds them into ``<job>/metrics/state.json`` with Spark's
  progress of the batch (:func:`collect`) and rewrites the textfile ``epochal.prom``;
* restarts, runs and recovery times come from the job record at the moment of reading.

Metrics are best effort: a failure to write or read them is logged and never fails a job.
Spark's own query progress carries what Spark measures (input rows, durations); Spark 4.3
has no way for a Python data source to add metrics of its own to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from epochal.parts.records import PartRecord, read_parts
from epochal.state import files
from epochal_sdk import Guarantee

if TYPE_CHECKING:
    from epochal.state.jobs import JobDirectory

log = logging.getLogger("epochal.ops.metrics")

PENDING = "pending"
STATE = "state.json"
TEXTFILE = "epochal.prom"
KEEP_BATCHES = 20
"""Batches of per-part detail kept in the state (for ``jobs status --json``)."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

COUNTERS = {
    "records_in": "records read (a replayed batch's records count again)",
    "bytes_in": "bytes read (Arrow, in memory)",
    "records_out": "records written by the part's tasks (replays and retries count again)",
    "bytes_out": "bytes written (Arrow, in memory)",
    "dedupe_dropped": "redelivered messages dropped by the dedupe window",
    "redeliveries_outside_window": "redelivered messages older than the dedupe window",
    "acked": "messages acknowledged",
    "in_doubt": "in-doubt transactions found (recovery, and failed attempts after a batch)",
    "committed": "transactions committed by the driver (phase 2 and recovery)",
    "rolled_back": "transactions rolled back (undecided at recovery, failed attempts)",
    "replays_skipped": "tasks of an already decided batch that wrote nothing",
    "batches": "batches this part took part in",
}
"""The runtime's counters of a part, by the key a step reports them under."""

PHASES = {
    "plan": "planning a batch (latest offsets, receiving and storing messages)",
    "read": "a read task",
    "store": "storing an acknowledging source's batch",
    "ack": "acknowledging a batch",
    "write": "a write task (writing, then prepare or flush)",
    "prepare": "phase 1 in a task (prepare)",
    "flush": "an idempotent task's flush",
    "decide": "recording the commit decision",
    "commit": "phase 2 (committing the decided transactions)",
    "recover": "recovery at the start of a run",
}
"""Timed protocol phases: a step reports ``<phase>_seconds`` and ``<phase>_seconds_count``."""

CONNECTOR_PREFIX = "connector."
"""Values a connector recorded through its context's metrics handle carry this prefix."""


# -- where -----------------------------------------------------------------------------------
def metrics_dir(job_dir: str | None) -> str | None:
    """This machine's metrics directory of a job: ``<job>/metrics`` when the job's directory
    is local, else the job's local directory (see :func:`epochal.state.layout.local_dir`)."""
    if not job_dir:
        return None
    if "://" not in job_dir:
        return f"{job_dir}/metrics"
    from epochal.state.layout import local_dir

    snapshot_dir, _, name = job_dir.rstrip("/").rpartition("/")
    return os.path.join(local_dir(snapshot_dir, name), "metrics")


# -- reporting (any process of a job) ----------------------------------------------------------
def report(
    job_dir: str | None,
    kind: str,
    part_id: str,
    connector: str,
    batch: int | None,
    values: dict[str, float],
    *,
    task_side: bool = False,
) -> None:
    """Leave what one step of a part measured for the driver to collect. ``batch`` None:
    the batch the driver completes next. A task only reports when the job's directory is
    on a file system it sees (``task_side``). Never raises."""
    directory = metrics_dir(job_dir)
    if directory is None or not values:
        return
    if task_side and not os.path.isdir(directory.rsplit("/", 1)[0]):
        return  # an executor that does not see the job's directory: nothing to leave
    entry = {
        "kind": kind,
        "part": part_id,
        "connector": connector,
        "batch": batch,
        "values": {k: float(v) for k, v in values.items()},
    }
    try:
        pending = f"{directory}/{PENDING}"
        files.makedirs(pending)
        name = f"{pending}/{kind}-{part_id}-{uuid.uuid4().hex}"
        with files.open_private(f"{name}.tmp") as fh:
            json.dump(entry, fh)
        os.replace(f"{name}.tmp", f"{name}.json")
    except OSError as exc:
        log.debug("metrics of %s %s not reported: %s", kind, part_id, exc)


@contextlib.contextmanager
def timed(values: dict[str, float], phase: str) -> Iterator[None]:
    """Add the block's duration to ``values`` as one timing of ``phase``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add(
            values, {f"{phase}_seconds": time.perf_counter() - started, f"{phase}_seconds_count": 1}
        )


def add(values: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Sum ``more`` into ``values`` (returns ``values``)."""
    for key, value in more.items():
        values[key] = values.get(key, 0.0) + float(value)
    return values


def connector_values(drained: dict[str, float]) -> dict[str, float]:
    """A connector's metrics (its context's handle, drained) under :data:`CONNECTOR_PREFIX`."""
    return {f"{CONNECTOR_PREFIX}{k}": v for k, v in drained.items()}


# -- collecting (the driver, after each batch) --------------------------------------------------
def collect(
    job_dir: str, batch: int, progress: dict[str, Any] | None, job_created: float
) -> dict[str, Any]:
    """Fold the pending reports into the job's metrics state, attribute those without a
    batch to ``batch``, note Spark's ``progress`` of it, rewrite the state; returns it."""
    directory = metrics_dir(job_dir)
    assert directory is not None
    state = load_state(job_dir)
    if state.get("job_created") != job_created:  # a job started over (replaced, cancelled)
        state = {"job_created": job_created, "parts": {}, "spark": {}}
    pending = f"{directory}/{PENDING}"
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(pending)):
            if not name.endswith(".json"):
                continue
            path = f"{pending}/{name}"
            try:
                with open(path) as fh:
                    entry = json.load(fh)
                os.unlink(path)
            except (OSError, ValueError) as exc:
                log.debug("metrics: skipping %s: %s", name, exc)
                continue
            _fold(state, entry, batch)
    if progress is not None:
        spark = state.setdefault("spark", {})
        spark["batch"] = batch
        spark["input_rows_total"] = int(spark.get("input_rows_total", 0)) + int(
            progress.get("numInputRows") or 0
        )
        spark["output_rows_total"] = int(spark.get("output_rows_total", 0)) + max(
            0, int((progress.get("sink") or {}).get("numOutputRows") or 0)
        )
        spark["duration_ms"] = {k: int(v) for k, v in (progress.get("durationMs") or {}).items()}
    _write_json(f"{directory}/{STATE}", state)
    return state


def _fold(state: dict[str, Any], entry: dict[str, Any], batch: int | None) -> None:
    key = f"{entry['kind']}-{entry['part']}"
    part = state["parts"].setdefault(
        key,
        {
            "kind": entry["kind"],
            "part": entry["part"],
            "connector": entry.get("connector", ""),
            "totals": {},
            "batches": [],
        },
    )
    values = {k: float(v) for k, v in entry["values"].items()}
    at = entry["batch"] if entry.get("batch") is not None else batch
    batches = part["batches"]
    current = next((b for b in batches if b["batch"] == at), None)
    if current is None:
        current = {"batch": at, "values": {}}
        batches.append(current)
        batches.sort(key=lambda b: -1 if b["batch"] is None else b["batch"])
        del batches[:-KEEP_BATCHES]
        if "batches" not in values and at is not None:
            values["batches"] = 1.0
    add(current["values"], values)
    add(part["totals"], values)


def load_state(job_dir: str | None) -> dict[str, Any]:
    """The job's metrics state (empty when there is none yet)."""
    directory = metrics_dir(job_dir)
    if directory is None:
        return {}
    try:
        with open(f"{directory}/{STATE}") as fh:
            return dict(json.load(fh))
    except (OSError, ValueError):
        return {}


def _write_json(path: str, value: Any) -> None:
    files.makedirs(os.path.dirname(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    with files.open_private(tmp) as fh:
        json.dump(value, fh, sort_keys=True)
    os.replace(tmp, path)


# -- views --------------------------------------------------------------------------------------
def part_guarantees(jobdir: JobDirectory) -> dict[str, PartRecord]:
    """``<kind>-<part id>`` → the part's record (connector, effective guarantee, contract)
    as the run noted it when its query started."""
    try:
        return read_parts(jobdir.store)
    except Exception:  # no live epoch yet (a job never run): no parts
        return {}


def current_state(job_dir: str) -> dict[str, Any]:
    """The metrics state with the reports not collected yet folded in (read only): what a
    step reported after the driver's last batch (e.g. a job's last batch) shows too."""
    state = load_state(job_dir) or {"parts": {}, "spark": {}}
    state.setdefault("parts", {})
    directory = metrics_dir(job_dir)
    last = (state.get("spark") or {}).get("batch")
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(f"{directory}/{PENDING}")):
            if name.endswith(".json"):
                try:
                    with open(f"{directory}/{PENDING}/{name}") as fh:
                        _fold(state, json.load(fh), last)
                except (OSError, ValueError):
                    continue
    return state


def summary(jobdir: JobDirectory) -> dict[str, Any]:
    """Per part: connector, effective guarantee, totals and the last batch's values; and
    Spark's last progress. For ``jobs status``."""
    state = current_state(jobdir.path)
    records = part_guarantees(jobdir)
    parts: dict[str, Any] = {}
    for key in sorted(set(state.get("parts", {})) | set(records)):
        known = state.get("parts", {}).get(key, {})
        record = records.get(key)
        last = (known.get("batches") or [None])[-1]
        parts[key] = {
            "kind": known.get("kind") or (record.kind if record else key.split("-", 1)[0]),
            "connector": known.get("connector") or (record.connector if record else ""),
            "guarantee": record.guarantee if record else None,
            "contract": record.contract if record else None,
            "totals": known.get("totals", {}),
            "last_batch": last,
        }
    return {"parts": parts, "spark": state.get("spark", {})}


def _labels(**labels: Any) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items() if v is not None)
    return "{" + inner + "}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


class _Exposition:
    """Prometheus text format 0.0.4: every family once, with its HELP and TYPE."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: str, value: float) -> None:
        family = self.families.setdefault(name, (kind, help_text, []))
        family[2].append(f"{name}{labels} {_number(value)}")

    def add_summary(
        self, name: str, help_text: str, labels: str, total: float, count: float
    ) -> None:
        family = self.families.setdefault(name, ("summary", help_text, []))
        family[2].append(f"{name}_sum{labels} {_number(total)}")
        family[2].append(f"{name}_count{labels} {_number(count)}")

    def text(self) -> str:
        lines = []
        for name, (kind, help_text, samples) in self.families.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines += samples
        return "\n".join(lines) + "\n"


def render_prometheus(jobdir: JobDirectory) -> str:
    """The job's metrics in Prometheus text format (version 0.0.4)."""
    record = jobdir.load()
    job = record.name
    out = _Exposition()
    out.add(
        "epochal_job_info",
        "gauge",
        "the job: its status and guarantee (value 1)",
        _labels(job=job, status=record.status.value, guarantee=record.job_config.guarantee.label),
        1,
    )
    out.add(
        "epochal_job_runs_total",
        "counter",
        "query starts (cold, in place, standby)",
        _labels(job=job),
        record.run,
    )
    out.add(
        "epochal_job_restarts_total",
        "counter",
        "restarts after failures",
        _labels(job=job),
        record.restarts,
    )
    if "standby_pid" in record.supervisor:
        out.add(
            "epochal_standby_ready",
            "gauge",
            "1 when the job's warm standby driver finished its warm-up, 0 while it warms up "
            "(a kill then recovers barely faster than with a new driver)",
            _labels(job=job),
            1 if record.supervisor.get("standby_ready") else 0,
        )
    if record.effective_guarantee:
        out.add(
            "epochal_job_effective_guarantee",
            "gauge",
            "the weakest guarantee of all the query's parts (0 none, 1 at-least-once, "
            "2 exactly-once)",
            _labels(job=job, guarantee=record.effective_guarantee),
            int(Guarantee.parse(record.effective_guarantee)),
        )
    recovered = [r for r in record.runs if r.get("recovery_s") is not None]
    if recovered:
        out.add(
            "epochal_job_last_recovery_seconds",
            "gauge",
            "time from the last failure to the first committed batch after it",
            _labels(job=job),
            float(recovered[-1]["recovery_s"]),
        )
        out.add_summary(
            "epochal_job_recovery_seconds",
            "recovery times of the runs in the job record",
            _labels(job=job),
            sum(float(r["recovery_s"]) for r in recovered),
            len(recovered),
        )
    if record.progress:
        out.add(
            "epochal_job_last_batch",
            "gauge",
            "the last committed batch",
            _labels(job=job),
            int(record.progress.get("batch", -1)),
        )
        out.add(
            "epochal_job_input_rows_total",
            "counter",
            "input rows (Spark's progress)",
            _labels(job=job),
            int(record.progress.get("rows", 0)),
        )
    view = summary(jobdir)
    for phase, millis in sorted((view["spark"].get("duration_ms") or {}).items()):
        out.add(
            "epochal_batch_duration_seconds",
            "gauge",
            "Spark's durations of the last batch, by phase (its query progress)",
            _labels(job=job, phase=phase),
            millis / 1000.0,
        )
    for key, part in view["parts"].items():
        labels = {
            "job": job,
            "part": key.split("-", 1)[1],
            "kind": part["kind"],
            "connector": part["connector"],
        }
        if part.get("guarantee"):
            out.add(
                "epochal_part_guarantee",
                "gauge",
                "the part's effective guarantee (0 none, 1 at-least-once, 2 exactly-once)",
                _labels(**labels, guarantee=part["guarantee"]),
                int(Guarantee.parse(part["guarantee"])),
            )
        totals = part["totals"]
        for name, help_text in COUNTERS.items():
            if name in totals:
                out.add(
                    f"epochal_part_{name}_total",
                    "counter",
                    help_text,
                    _labels(**labels),
                    totals[name],
                )
        for phase in PHASES:
            if f"{phase}_seconds_count" in totals:
                out.add_summary(
                    "epochal_part_phase_seconds",
                    "time spent in each protocol phase (sum and count)",
                    _labels(**labels, phase=phase),
                    totals.get(f"{phase}_seconds", 0.0),
                    totals[f"{phase}_seconds_count"],
                )
        last = part.get("last_batch")
        if last and last.get("batch") is not None:
            out.add(
                "epochal_part_last_batch",
                "gauge",
                "the last batch the part reported",
                _labels(**labels),
                last["batch"],
            )
        for name, value in sorted(totals.items()):
            if not name.startswith(CONNECTOR_PREFIX) or name.endswith("_seconds_count"):
                continue
            metric = name[len(CONNECTOR_PREFIX) :]
            if metric.endswith("_seconds"):
                out.add_summary(
                    f"epochal_connector_{metric}",
                    "a timing the connector recorded (its context's metrics)",
                    _labels(**labels),
                    value,
                    totals.get(f"{name}_count", 0.0),
                )
            else:
                out.add(
                    f"epochal_connector_{metric}_total",
                    "counter",
                    "a count the connector recorded (its context's metrics)",
                    _labels(**labels),
                    value,
                )
    return out.text()


def write_textfile(jobdir: JobDirectory) -> str | None:
    """Rewrite ``<job>/metrics/epochal.prom`` (for node_exporter's textfile collector);
    returns its path."""
    directory = metrics_dir(jobdir.path)
    if directory is None:
        return None
    path = f"{directory}/{TEXTFILE}"
    files.makedirs(directory)
    tmp = f"{path}.{os.getpid()}.tmp"
    with files.open_private(tmp) as fh:
        fh.write(render_prometheus(jobdir))
    os.replace(tmp, path)
    return path


# -- the supervisor's endpoint ------------------------------------------------------------------
MAX_CONNECTIONS = 8
"""Connections the endpoint serves at once (one thread each); more are closed at once."""
CONNECTION_TIMEOUT = 5.0
"""Seconds a connection may stay silent (before or inside its request) before it is closed."""


class MetricsServer(ThreadingHTTPServer):
    """The metrics endpoint's HTTP server, bounded: it serves at most ``max_connections``
    connections at once, each on its own daemon thread, closes any connection beyond them
    at once (a scraper retries at its next interval), and closes a connection that sends
    nothing for ``timeout`` seconds. It runs in the supervisor, beside the thread that
    renews the job's lease, so idle or slow clients must never pile up threads there.

    Made by :func:`listen` (bound, not yet serving: a busy port is refused before anything
    of the job is written); :func:`serve` starts it for a job."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = CONNECTION_TIMEOUT,
    ) -> None:
        self.jobdir: JobDirectory | None = None
        self.connection_timeout = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _MetricsHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own if a slot is free, else close it."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """One connection, on its thread; its slot is freed when it ends."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _MetricsHandler(BaseHTTPRequestHandler):
    """``GET /metrics`` (and ``/``): the job's metrics in Prometheus text, read afresh."""

    server: MetricsServer

    def setup(self) -> None:
        self.timeout = self.server.connection_timeout  # type: ignore[misc]  # per connection
        super().setup()

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is here")
            return
        try:
            assert self.server.jobdir is not None, "the endpoint serves no job yet"
            body = render_prometheus(self.server.jobdir).encode()
        except Exception as exc:  # a scrape must not take the supervisor down
            self.send_error(500, f"metrics: {type(exc).__name__}: {exc}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # no access log on the supervisor's output


def listen(
    port: int,
    host: str = "127.0.0.1",
    *,
    max_connections: int = MAX_CONNECTIONS,
    timeout: float = CONNECTION_TIMEOUT,
) -> MetricsServer:
    """A bounded metrics server bound to ``host:port`` (``port`` 0: a free one, see
    ``server.server_address``), not serving yet. Called before the job's lease is taken and
    before its record is written, so that a port that is out of range, busy or not this
    host's fails first.

    Raises:
        ConfigError: naming the address, why it cannot be listened on, and what to do.
    """
    from epochal_sdk import ConfigError

    if not 0 <= int(port) <= 65535:
        raise ConfigError(
            "job",
            "metrics_port",
            f"{port} is not a TCP port",
            "Give a port from 1 to 65535, or 0 for a free one (printed when it listens).",
        )
    try:
        return MetricsServer((host, int(port)), max_connections=max_connections, timeout=timeout)
    except OSError as exc:
        raise ConfigError(
            "job",
            "metrics_port",
            f"the metrics endpoint cannot listen on {host}:{port} "
            f"({exc.strerror or type(exc).__name__})",
            "Give a free port (0: one chosen and printed), or another --metrics-host; "
            "`ss -ltnp` shows which process holds a port.",
        ) from None


def serve(
    jobdir: JobDirectory, port: int | MetricsServer, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve ``GET /metrics`` (Prometheus text, read afresh at every scrape) for one job on
    a daemon thread, through ``port``: a server from :func:`listen`, or a port number to
    listen on (0 picks a free port: ``server.server_address``). Stop it with
    ``server.shutdown()`` and ``server.server_close()``."""
    server = port if isinstance(port, MetricsServer) else listen(port, host)
    server.jobdir = jobdir
    threading.Thread(target=server.serve_forever, name="epochal-metrics", daemon=True).start()
    return server
