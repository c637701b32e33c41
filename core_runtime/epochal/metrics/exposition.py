"""A job's metrics shown: the summary of ``epochal jobs status``, the Prometheus text of
``epochal jobs metrics``, the textfile beside the job (``epochal.prom``). What they show is
recorded by :mod:`epochal.metrics.recording`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from epochal.base import files
from epochal.metrics.recording import (
    CONNECTOR_PREFIX,
    COUNTERS,
    PHASES,
    TEXTFILE,
    current_state,
    metrics_dir,
)
from epochal.parts.records import PartRecord, read_parts
from epochal_sdk import Guarantee

if TYPE_CHECKING:
    from epochal.state.jobs import JobDirectory

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def part_guarantees(jobdir: JobDirectory) -> dict[str, PartRecord]:
    """``<kind>-<part id>`` → the part's record (connector, effective guarantee, contract)
    as the run noted it when its query started."""
    try:
        return read_parts(jobdir.store)
    except Exception:  # no live epoch yet (a job never run): no parts
        return {}


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
