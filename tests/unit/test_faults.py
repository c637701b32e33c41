"""Fault plans: parsing, and crash points that kill the process once (run in subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.base.fault_plan import DRIVER_POINTS, EXECUTOR_POINTS, POINTS, Fault, FaultPlan
from epochal.base.processes import RUN_TOKEN_ENV
from epochal_sdk import ConfigError


def test_parse_points_and_batches() -> None:
    plan = FaultPlan.parse(" sink.after_prepare@2, sink.after_decision@4 ,job.after_batch ")
    assert plan.faults == (
        Fault("sink.after_prepare", 2),
        Fault("sink.after_decision", 4),
        Fault("job.after_batch", None),
    )
    assert [f.label for f in plan.faults] == [
        "sink.after_prepare@2",
        "sink.after_decision@4",
        "job.after_batch",
    ]
    assert plan.marker_dir is None
    assert bool(plan)


def test_parse_empty() -> None:
    for text in ("", " , ", None):
        plan = FaultPlan.parse(text)  # type: ignore[arg-type]
        assert plan.faults == ()
        assert not plan
    FaultPlan.parse("").reach("sink.after_commit", 3)  # nothing to do, no crash


def test_points_are_split_between_driver_and_executors() -> None:
    assert set(DRIVER_POINTS).isdisjoint(EXECUTOR_POINTS)
    assert set(POINTS) == set(DRIVER_POINTS) | set(EXECUTOR_POINTS)
    assert "sink.after_prepare" in EXECUTOR_POINTS
    assert "sink.after_decision" in DRIVER_POINTS


def test_unknown_point_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        FaultPlan.parse("sink.after_commit@1, sink.before_everything@2")
    message = str(info.value)
    assert info.value.option == "faults"
    assert "unknown crash point 'sink.before_everything'" in message
    for point in POINTS:
        assert point in message


@pytest.mark.parametrize("text", ["sink.after_commit@three", "sink.after_commit@1.5"])
def test_bad_batch(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        FaultPlan.parse(text)
    assert f"{text!r}: batch is not a number" in str(info.value)
    assert "point@3" in str(info.value)


# -- firing (in subprocesses: a fault kills its process with SIGKILL) -----------------------

SCRIPT = """
import sys
from epochal.base.fault_plan import FaultPlan
plan = FaultPlan.parse(sys.argv[1], sys.argv[2])
plan.reach(sys.argv[3], int(sys.argv[4]))
print("survived", flush=True)
"""


def reach_in_subprocess(
    plan: str, marker_dir: Path, point: str, batch: int, run_token: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV}
    if run_token is not None:
        env[RUN_TOKEN_ENV] = run_token
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, plan, str(marker_dir), point, str(batch)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_driver_fault_fires_once(tmp_path: Path) -> None:
    markers = tmp_path / "faults"
    first = reach_in_subprocess("sink.after_commit@3", markers, "sink.after_commit", 3)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert "survived" not in first.stdout
    assert "fault sink.after_commit@3 at batch 3: driver" in first.stderr
    assert FaultPlan.parse("sink.after_commit@3", str(markers)).fired() == ["sink.after_commit@3"]

    second = reach_in_subprocess("sink.after_commit@3", markers, "sink.after_commit", 3)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "survived"
    marker = json.loads((markers / "sink.after_commit@3").read_text())
    assert marker["pid"] > 0  # the process that fired it


WATCHED_SCRIPT = """
import os, sys
from epochal.base.fault_plan import FaultPlan
marker = os.path.join(sys.argv[2], sys.argv[3])
synced = os.fsync
def fsync(fd):
    print("visible" if os.path.exists(marker) else "hidden", "while synced", flush=True)
    synced(fd)
os.fsync = fsync
FaultPlan.parse(sys.argv[3], sys.argv[2]).reach("sink.after_commit", 3)
"""


def test_a_marker_appears_whole(tmp_path: Path) -> None:
    """A reader that sees a fault's marker sees its pids: the marker's name appears only after
    its content is on disk (a supervisor read an empty marker between create and write)."""
    markers = tmp_path / "faults"
    env = {k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV}
    done = subprocess.run(
        [sys.executable, "-c", WATCHED_SCRIPT, "", str(markers), "sink.after_commit@3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.splitlines() == ["hidden while synced"]
    assert json.loads((markers / "sink.after_commit@3").read_text())["pid"] > 0
    assert os.listdir(markers) == ["sink.after_commit@3"]  # no temporary file left


def test_an_executor_fault_outside_an_executor_kills_the_worker(tmp_path: Path) -> None:
    markers = tmp_path / "faults"
    done = reach_in_subprocess("sink.after_prepare@1", markers, "sink.after_prepare", 1)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "survived" not in done.stdout
    assert FaultPlan.parse("", str(markers)).fired() == ["sink.after_prepare@1"]


def test_other_batches_and_points_do_not_fire(tmp_path: Path) -> None:
    markers = tmp_path / "faults"
    plan = FaultPlan.parse("sink.after_commit@3", str(markers))
    plan.reach("sink.after_commit", 2)
    plan.reach("sink.after_commit", None)
    plan.reach("sink.after_decision", 3)
    plan.reach("job.after_batch", 3)
    assert plan.fired() == []
    assert not markers.exists()


def test_a_fault_already_fired_does_not_fire_again_in_this_process(tmp_path: Path) -> None:
    markers = tmp_path / "faults"
    markers.mkdir()
    (markers / "job.after_batch").write_text("1\n")
    (markers / "sink.after_decision@2").write_text("1\n")
    plan = FaultPlan.parse("job.after_batch, sink.after_decision@2", str(markers))
    plan.reach("job.after_batch", 7)  # would kill this test process if it fired
    plan.reach("sink.after_decision", 2)
    assert plan.fired() == ["job.after_batch", "sink.after_decision@2"]


def test_fired_without_markers() -> None:
    assert FaultPlan.parse("job.after_batch").fired() == []
    assert FaultPlan.parse("job.after_batch", "/nonexistent/epochal-markers").fired() == []


def test_parse_actions_and_sequences() -> None:
    plan = FaultPlan.parse("source.after_plan > sink.after_decision@3:worker > job.after_batch")
    assert plan.sequential
    assert plan.faults == (
        Fault("source.after_plan"),
        Fault("sink.after_decision", 3, "worker"),
        Fault("job.after_batch"),
    )
    assert [f.kind for f in plan.faults] == ["driver", "worker", "driver"]
    assert Fault("sink.after_write").kind == "executor"
    with pytest.raises(ConfigError, match="unknown action 'explode'"):
        FaultPlan.parse("sink.after_write:explode")


def test_a_sequence_arms_one_fault_at_a_time(tmp_path: Path) -> None:
    """Only the next fault of a sequence can fire: a later one is skipped until the one
    before it fired (here the markers stand for faults that fired in earlier processes)."""
    markers = tmp_path / "faults"
    plan = FaultPlan.parse("job.after_batch > sink.after_commit", str(markers))
    plan.reach("sink.after_commit", 1)  # not armed yet: would kill this process otherwise
    assert plan.fired() == []
    markers.mkdir()
    (markers / "000-job.after_batch").write_text("{}")
    assert plan.fired() == ["job.after_batch"]
    plan.reach("job.after_batch", 2)  # fired already: never again
    done = reach_in_subprocess(
        "job.after_batch > sink.after_commit", markers, "sink.after_commit", 5
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert plan.fired() == ["job.after_batch", "sink.after_commit"]


def test_a_worker_fault_kills_only_that_process(tmp_path: Path) -> None:
    done = reach_in_subprocess(
        "sink.after_decision:worker", tmp_path / "faults", "sink.after_decision", 1
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "sink.after_decision:worker at batch 1: worker" in done.stderr


def _first_fault_fired_by(tmp_path: Path, plan: str, run_token: str) -> Path:
    """A marker directory in which the first fault of ``plan`` was fired by a process of the
    run ``run_token`` (as its marker records it)."""
    markers = tmp_path / "faults"
    markers.mkdir()
    first = FaultPlan.parse(plan).faults[0]
    info = {"pid": 1, "token": run_token, "supervisor": "2", "batch": 0, "at": 0.0}
    (markers / f"000-{first.label}").write_text(json.dumps(info))
    return markers


def test_a_run_that_a_fault_ended_fires_no_later_fault(tmp_path: Path) -> None:
    """An orphaned driver run (the fault before killed its supervisor) that reaches the next
    point of the sequence before it dies does not take that fault: it is meant for the run
    of the supervisor that takes the job over. (The kit's real-failures case once saw the
    orphan take the pause meant for the next supervisor's driver, 0.15 s after its own
    supervisor was killed.) A process of another run takes it."""
    plan = "job.after_batch:supervisor > sink.before_decision:worker"
    markers = _first_fault_fired_by(tmp_path, plan, "orphaned-run")
    orphan = reach_in_subprocess(plan, markers, "sink.before_decision", 1, "orphaned-run")
    assert orphan.returncode == 0, orphan.stderr
    assert FaultPlan.parse(plan, str(markers)).fired() == ["job.after_batch:supervisor"]
    successor = reach_in_subprocess(plan, markers, "sink.before_decision", 1, "next-run")
    assert successor.returncode == -signal.SIGKILL, successor.stderr
    assert FaultPlan.parse(plan, str(markers)).fired() == [
        "job.after_batch:supervisor",
        "sink.before_decision:worker",
    ]


def test_a_worker_fault_does_not_end_its_run_for_later_faults(tmp_path: Path) -> None:
    """Several crash points in one run: after a worker kill the run goes on, and takes the
    next fault of the sequence."""
    plan = "sink.after_decision:worker > job.after_batch:worker"
    markers = _first_fault_fired_by(tmp_path, plan, "one-run")
    again = reach_in_subprocess(plan, markers, "job.after_batch", 1, "one-run")
    assert again.returncode == -signal.SIGKILL, again.stderr
