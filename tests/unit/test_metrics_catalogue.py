"""The metrics catalogue (docs/reference/metrics.md) lists exactly the metric families the
runtime exposes, and every protocol phase a part is timed in: a metric added, renamed or
dropped in the code fails here until the page says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from epochal.metrics import exposition
from epochal.metrics.recording import COUNTERS, PHASES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "metrics.md"


def families_in_the_code() -> set[str]:
    """Every family :mod:`epochal.metrics.exposition` can write: its literal names, one per
    counter of a part, and the connector families as ``<name>`` patterns."""
    tree = ast.parse(Path(exposition.__file__).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"epochal_[a-z_]*[a-z]", node.value):  # not an f-string piece
                names.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            pattern = "".join(
                part.value if isinstance(part, ast.Constant) else "{}" for part in node.values
            )
            if pattern.startswith("epochal_"):
                names.add(pattern)
    expanded = {name for name in names if "{}" not in name}
    for pattern in names - expanded:
        if pattern == "epochal_part_{}_total":
            expanded |= {f"epochal_part_{name}_total" for name in COUNTERS}
        elif pattern.startswith("epochal_connector_"):
            expanded.add(pattern.replace("{}", "<name>"))
        else:
            raise AssertionError(f"a metric name the catalogue cannot expand: {pattern}")
    return expanded


def families_on_the_page() -> set[str]:
    """The first column of the page's tables that name a metric."""
    rows = re.findall(r"^\| `(epochal_[a-z_<>]+)` \|", PAGE.read_text(), re.M)
    names = set(rows)
    for row in rows:
        if row.startswith("epochal_connector_") and row.endswith("_seconds"):
            names.discard(row)
            names.add(row.removesuffix("_seconds"))  # a timing's family has no suffix
    return names


def test_the_catalogue_lists_exactly_the_metrics_the_code_defines() -> None:
    code, page = families_in_the_code(), families_on_the_page()
    assert code - page == set(), f"metrics the page does not list: {sorted(code - page)}"
    assert page - code == set(), f"metrics the code does not define: {sorted(page - code)}"


def test_the_catalogue_lists_every_timed_phase() -> None:
    listed = set(re.findall(r"^\| `([a-z]+)` \|", PAGE.read_text(), re.M))
    assert set(PHASES) <= listed, sorted(set(PHASES) - listed)
