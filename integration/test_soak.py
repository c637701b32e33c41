"""A small soak (issue "real failures"): Kafka → Spark → PostgreSQL exactly-once through the
public commands only, a steady producer, and one kill of every kind at random moments (the
whole driver, the supervisor then a resume from a new process, a Python worker, an executor
JVM, Kafka or PostgreSQL). Independent readers must count 0 lost, 0 duplicated and nothing
left prepared or open. The long run (50 kills) is reported in docs/evidence/soak.md."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_small_soak_loses_and_duplicates_nothing(tmp_path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "integration.soak",
            "--kills",
            "5",
            "--cycle",
            "--short-lived-jvms",
            "--seed",
            "11",
            "--rate",
            "100",
            "--per-batch",
            "1000",
            "--min-gap",
            "1",
            "--max-gap",
            "4",
            "--dir",
            str(tmp_path / "soak"),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    output = result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    match = re.match(
        r"soak: kills=(\d+) lost=(\d+) duplicates=(\d+) in_doubt=(\d+) "
        r"recovery_p50=([\d.]+)s recovery_max=([\d.]+)s$",
        last,
    )
    assert match, f"no summary line:\n{output[-4000:]}"
    kills, lost, duplicates, in_doubt = (int(match.group(i)) for i in range(1, 5))
    assert (kills, lost, duplicates, in_doubt) == (5, 0, 0, 0), output[-4000:]
    for kind in ("driver", "supervisor", "worker", "executor", "server"):
        assert f": {kind} " in output, f"no {kind} kill happened:\n{output[-4000:]}"
    assert result.returncode == 0, output[-4000:]
