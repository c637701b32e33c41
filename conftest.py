"""The suite on two cores: which tests go to which pytest-xdist worker, and in what order.

``scripts/test.sh`` runs the suite as ``pytest -n 2 --dist loadgroup``: two worker processes,
each taking the next unit of work when it is nearly done with its own. This hook decides the
units (:func:`work_unit`) and hands them out longest first (:func:`order_by_cost`), so the
last minutes are not one long test running alone:

- a module is one unit, so a module's shared fixtures (a SparkSession, a virtual
  environment, a database) are made once, by one worker;
- a crash test of the conformance kit is a unit of its own (its fixtures are per test), and
  so is each pyspark release of tests/releases (its own virtual environment).

Session fixtures (the integration servers, the kit's warm drivers) are per worker: a server
both workers need is started by each. Without ``-n`` nothing here changes the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent
#: Seconds each test took in a recent whole run (``python -m integration.harness.timing
#: --update`` rewrites it from a run's ``EPOCHAL_TEST_TIMES`` file); only the order of the
#: units depends on it, never a result. A test it does not know counts one second.
DURATIONS = ROOT / "tests" / "durations.json"


def work_unit(item: pytest.Item) -> str:
    """The unit of work ``item`` belongs to (tests of one unit run on one worker, in order)."""
    if "conformance_case" in getattr(item, "fixturenames", ()):
        return f"case:{item.nodeid}"
    if "pyspark_release" in getattr(item, "fixturenames", ()):
        return f"release:{item.nodeid}"
    return f"module:{item.nodeid.split('::', 1)[0]}"


def _known_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def order_by_cost(units: dict[str, list[Any]], known: dict[str, float]) -> list[str]:
    """The units, longest first."""

    def cost(unit: str) -> float:
        return sum(known.get(item.nodeid, 1.0) for item in units[unit])

    return sorted(units, key=lambda unit: (-cost(unit), unit))


def distributed_by_group(config: Any) -> bool:
    """Whether this process collects for ``--dist loadgroup``: the controller's option, or
    the flag xdist leaves a worker's configuration with."""
    option = config.option
    return getattr(option, "dist", "no") == "loadgroup" or bool(getattr(option, "loadgroup", False))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    """Under ``--dist loadgroup``: group the items into units and order them by cost.

    The hook runs in each xdist worker (they collect; the controller only schedules), where
    xdist has set ``dist`` to ``"no"`` and kept the mode as ``loadgroup`` instead."""
    if not distributed_by_group(config):
        return
    units: dict[str, list[Any]] = {}
    for item in items:
        units.setdefault(work_unit(item), []).append(item)
    ordered = order_by_cost(units, _known_durations())
    items[:] = [item for unit in ordered for item in units[unit]]
    for unit in ordered:
        for item in units[unit]:
            item.add_marker(pytest.mark.xdist_group(unit))
