"""What an operator sees of a job: who runs it (supervisor, driver, lease), where it is (its
phase), and how its runs went (time from start to the first committed batch, recovery time).

A job whose record says it runs but whose lease is not live has lost its supervisor: it is
shown as ``ORPHANED``, with the command that resumes it, instead of a ``RUNNING`` that nobody
keeps true.
"""

from __future__ import annotations

import time
from typing import Any

from epochal.ops.recovery import recoveries
from epochal.state import retention
from epochal.state.jobs import JobDirectory, JobRecord, JobStatus

ORPHANED = "ORPHANED"


def job_status(jobdir: JobDirectory, record: JobRecord | None = None) -> dict[str, Any]:
    """The status of a job as a JSON-ready dict."""
    record = record or jobdir.load()
    lease = jobdir.lease.read()
    now = time.time()
    live = bool(lease and lease.live)
    status = record.status.value
    if record.status.live and not live:
        status = ORPHANED
    out: dict[str, Any] = {
        "name": record.name,
        "status": status,
        "phase": record.status.value.lower(),
        "target": record.target,
        "guarantee": record.job_config.guarantee.label,
        "run": record.run,
        "restarts": record.restarts,
        "restarts_in_a_row": record.restarts_in_a_row,
        "supervisor": dict(record.supervisor),
        "driver": dict(record.driver),
        "lease": None,
        "progress": dict(record.progress),
        "failure": record.failure,
        "runs": [_run(entry) for entry in record.runs[-10:]],
        "recoveries": [r.as_dict() for r in recoveries(record.runs[-10:])],
        "standby": standby_state(record.supervisor, now),
        "updated_ago_s": round(now - record.updated, 1),
        "metrics": _metrics(jobdir),
        "retention": {b.record: f"{b.kept} {b.unit}" for b in retention.bounds()},
    }
    if lease:
        out["lease"] = {
            "epoch": lease.epoch,
            "owner": lease.owner,
            "holder": lease.holder,
            "pid": lease.pid,
            "host": lease.host,
            "ttl_s": lease.ttl,
            "renewed_ago_s": round(lease.age(now), 1) if lease.renewed else None,
            "live": live,
        }
    if status == ORPHANED and not record.target:
        out["hint"] = (
            "the driver that ran this job's query in its own SparkSession is gone (its lease "
            "was released or expired): the application's restarter (YARN, Kubernetes, a "
            "restart loop) starts it again, and it takes the job over"
        )
    elif status == ORPHANED:
        out["hint"] = (
            f"no supervisor holds this job's lease (its supervisor died or was stopped): resume "
            f"it with `python -m epochal jobs resume {record.name} --snapshot-dir "
            f"{jobdir.snapshot_dir}`"
        )
    return out


def standby_state(supervisor: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The warm standby driver, if the job has one: ready, or still warming up (and for how
    long): a standby that is not ready yet recovers the job barely faster than a new
    driver."""
    if "standby_pid" not in supervisor:
        return None
    launched = supervisor.get("standby_launched")
    return {
        "pid": supervisor["standby_pid"],
        "ready": bool(supervisor.get("standby_ready")),
        "up_s": round(now - float(launched), 1) if launched else None,
        "warmup_s": supervisor.get("standby_warmup_s"),
    }


def _metrics(jobdir: JobDirectory) -> dict[str, Any]:
    """The parts' metrics (see :mod:`epochal.metrics`); empty when there are none."""
    try:
        from epochal.metrics.exposition import summary

        return summary(jobdir)
    except Exception as exc:  # status must show even when metrics cannot be read
        return {"error": f"{type(exc).__name__}: {exc}"}


def _run(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": entry.get("run"),
        "epoch": entry.get("epoch"),
        "kind": entry.get("kind"),
        "driver_pid": entry.get("driver_pid"),
        "start_to_first_batch_s": entry.get("first_batch_s"),
        "first_batch": entry.get("first_batch"),
        "recovery_s": entry.get("recovery_s"),
        "outcome": entry.get("outcome"),
    }


def _renewed(ago: Any) -> str:
    """When the lease was last renewed, or that its holder released it."""
    return "released" if ago is None else f"renewed {ago}s ago"


def render(status: dict[str, Any]) -> str:
    """The status as text for a terminal."""
    lines = [f"job {status['name']}: {status['status']}  ({status['guarantee']})"]
    if status.get("hint"):
        lines.append(f"  !! {status['hint']}")
    lease = status.get("lease") or {}
    supervisor = status.get("supervisor") or {}
    driver = status.get("driver") or {}
    # a standby belongs to a live supervisor: a suspended or finished job's record may still
    # name the last one
    live = status.get("phase", "").upper() in {s.value for s in JobStatus if s.live}
    standby = status.get("standby") if live else None
    lines.append(
        f"  supervisor pid {supervisor.get('pid', '-')} on {supervisor.get('host', '-')}"
        + (
            f", standby driver pid {standby['pid']} "
            + (
                f"ready (warm-up {standby['warmup_s']}s)"
                if standby["ready"]
                else f"warming up for {standby['up_s']}s (not ready: a kill now recovers "
                "barely faster than a new driver)"
            )
            if standby
            else ""
        )
    )
    lines.append(
        f"  lease epoch {lease.get('epoch', '-')}, owner pid {lease.get('pid', '-')} on "
        f"{lease.get('host', '-')}, {_renewed(lease.get('renewed_ago_s', '-'))} "
        f"(ttl {lease.get('ttl_s', '-')}s, {'live' if lease.get('live') else 'not live'})"
    )
    lines.append(
        f"  driver pid {driver.get('pid', '-')} at epoch {driver.get('epoch', '-')}; run "
        f"{status['run']}, restarts {status['restarts']} ({status['restarts_in_a_row']} in a row)"
    )
    progress = status.get("progress") or {}
    lines.append(
        f"  last batch {progress.get('batch', '-')}, rows {progress.get('rows', 0)}"
        + (f"; failure: {status['failure']}" if status.get("failure") else "")
    )
    lines += _render_parts(status.get("metrics") or {})
    if status["runs"]:
        lines.append("  runs:  run epoch kind      start->1st batch  recovery  outcome")
        for run in status["runs"]:
            lines.append(
                f"         {run['run']!s:>3} {run['epoch']!s:>5} {run['kind']!s:<9} "
                f"{_seconds(run['start_to_first_batch_s']):>16}  "
                f"{_seconds(run['recovery_s']):>8}  {str(run['outcome'] or '')[:60]}"
            )
    for recovery in status.get("recoveries") or []:
        phases = " + ".join(f"{k} {v:.2f}" for k, v in recovery["phases"].items())
        lines.append(f"  recovery of run {recovery['run']}: {recovery['seconds']:.2f}s = {phases}")
    return "\n".join(lines)


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}s"


def _render_parts(view: dict[str, Any]) -> list[str]:
    """One line per part: guarantee, records and bytes, and the last batch's protocol
    latencies and settlements."""
    lines = []
    for key, part in (view.get("parts") or {}).items():
        totals = part.get("totals") or {}
        flow = (
            f"in {int(totals.get('records_in', 0))} rec/{_bytes(totals.get('bytes_in', 0))}"
            if part.get("kind") == "source"
            else f"out {int(totals.get('records_out', 0))} rec/{_bytes(totals.get('bytes_out', 0))}"
        )
        extra = [
            f"{name.replace('_', ' ')} {int(totals[name])}"
            for name in ("dedupe_dropped", "acked", "in_doubt", "rolled_back", "replays_skipped")
            if totals.get(name)
        ]
        lines.append(
            f"  {part.get('kind', '?')} {key.split('-', 1)[-1]} ({part.get('connector', '?')}, "
            f"{part.get('guarantee') or '?'}): {flow}" + "".join(f", {e}" for e in extra)
        )
        last = part.get("last_batch") or {}
        values = last.get("values") or {}
        phases = [
            f"{phase} {1000 * values[f'{phase}_seconds'] / values[f'{phase}_seconds_count']:.0f}ms"
            for phase in ("plan", "read", "store", "ack", "write", "decide", "commit", "recover")
            if values.get(f"{phase}_seconds_count")
        ]
        if phases:
            lines.append(f"      last batch {last.get('batch')}: " + ", ".join(phases))
    return lines


def _bytes(value: Any) -> str:
    amount = float(value or 0)
    for unit in ("B", "KB", "MB", "GB"):
        if amount < 1024 or unit == "GB":
            return f"{amount:.0f}{unit}" if unit == "B" else f"{amount:.1f}{unit}"
        amount /= 1024
    return f"{amount:.1f}GB"
