"""The runbook (docs/how-to/runbook.md) says what to do for every error class epochal, its
SDK and the reference connectors raise on purpose (every ``EpochalError`` subclass) and for
every job state: one added in the code fails here until the runbook has a row for it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from epochal.ops.commands import UNREADABLE
from epochal.ops.status import ORPHANED
from epochal.state.jobs import JobStatus

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "runbook.md"
PACKAGES = [ROOT / "sdk" / "epochal_sdk", ROOT / "core_runtime" / "epochal"]
PACKAGES += sorted((ROOT / "connectors").glob("*/epochal_*"))


def error_classes() -> set[str]:
    """Every class that derives, directly or not, from ``EpochalError`` in the packages
    (read from their source, outside the kit's ``testing`` modules)."""
    parents: dict[str, set[str]] = {}
    for package in PACKAGES:
        for module in package.rglob("*.py"):
            if "testing" in module.relative_to(package).parts:
                continue
            for node in ast.walk(ast.parse(module.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = {
                        b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                        for b in node.bases
                    }
                    parents.setdefault(node.name, set()).update(bases)
    found = {"EpochalError"}
    while True:
        more = {name for name, bases in parents.items() if bases & found} - found
        if not more:
            return found - {"EpochalError"}
        found |= more


def first_cells(heading: str) -> set[str]:
    """The backticked names in the first cells of the table under ``## heading``."""
    section = PAGE.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for cell in re.findall(r"^\| ([^|]+) \|", section, re.M):
        names |= set(re.findall(r"`([^`]+)`", cell))
    return names


def test_every_error_class_has_a_row() -> None:
    missing = error_classes() - first_cells("Errors")
    assert missing == set(), f"errors the runbook does not cover: {sorted(missing)}"


def test_every_job_state_has_a_row() -> None:
    states = {status.value for status in JobStatus} | {ORPHANED, UNREADABLE}
    missing = states - first_cells("Job states")
    assert missing == set(), f"states the runbook does not cover: {sorted(missing)}"
