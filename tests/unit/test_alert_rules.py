"""The Prometheus alert rules shipped in ops/alerts: ``promtool check rules`` accepts them,
``promtool test rules`` fires them on the series of epochal.rules.test.yml as expected, and
every epochal metric they use is one the runtime exposes. CI installs promtool (Debian's
``prometheus`` package, .ci/install-integration); without it locally the promtool tests skip
and say so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_metrics_catalogue import families_in_the_code

ALERTS = Path(__file__).resolve().parents[2] / "ops" / "alerts"
RULES = ALERTS / "epochal.rules.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (apt-get install prometheus; CI installs it)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=ALERTS, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_rules_fire_as_their_tests_expect() -> None:
    done = promtool("test", "rules", "epochal.rules.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_use_only_metrics_the_runtime_exposes() -> None:
    used = set(re.findall(r"\b(epochal_[a-z_]+)", RULES.read_text()))
    known = families_in_the_code()
    assert used, "the rules use no epochal metric"
    assert used <= known, f"metrics the runtime does not expose: {sorted(used - known)}"
