"""What a new user sees when a job fails: the job's name, where the logs are, what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.spark
def test_a_failed_run_names_the_job_its_logs_and_how_to_go_on(tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    (tmp_path / "orders_app.py").write_text("def build(spark):\n    import no_such_module\n")
    result = subprocess.run(
        [
            sys.executable, "-m", "epochal", "run", "orders_app:build",
            "--name", "orders", "--snapshot-dir", str(snapshots), "--available-now",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "No module named 'no_such_module'" in result.stdout
    hint = result.stderr.strip().splitlines()[-1]
    assert hint.startswith("[orders] the job FAILED; its snapshots are kept."), hint
    assert f"Driver logs: {snapshots / 'orders' / 'logs'}." in hint
    assert f"`python -m epochal jobs resume orders --snapshot-dir {snapshots}`" in hint
    assert any((snapshots / "orders" / "logs").iterdir())
