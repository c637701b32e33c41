"""The option reference (docs/reference/options.md) names every ``epochal.*`` option the
runtime accepts, every option it reads from each source and sink, and every field of
``JobConfig``: one added in the code fails here until the page has it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from epochal.config import JobConfig
from epochal.parts.registry import CONTRACT_OPTIONS, PART_OPTIONS, RUNTIME_OPTIONS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "options.md"


def first_cells() -> set[str]:
    """Every backticked name in the first cell of the page's table rows."""
    names: set[str] = set()
    for cell in re.findall(r"^\| ([^|]+) \|", PAGE.read_text(), re.M):
        names |= set(re.findall(r"`([^`]+)`", cell))
    return names


def test_every_runtime_option_is_on_the_page() -> None:
    assert RUNTIME_OPTIONS - first_cells() == set()


def test_every_option_of_a_part_is_on_the_page() -> None:
    options = set(PART_OPTIONS).union(*CONTRACT_OPTIONS.values())
    assert options - first_cells() == set()


def test_every_jobconfig_field_is_on_the_page() -> None:
    fields = {f.name for f in dataclasses.fields(JobConfig)}
    assert fields - first_cells() == set()
