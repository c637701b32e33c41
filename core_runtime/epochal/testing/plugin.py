"""The pytest plugin of the conformance kit (loaded through the ``pytest11`` entry point).

It parametrizes :class:`~epochal.testing.suite.ConformanceSuite` subclasses with their
scenarios (marked ``conformance`` and ``spark``) and their contract checks (marked
``conformance``: no Spark), keeps warm drivers for the scenarios (``epochal_driver_pool``),
prints a one-line summary per scenario with ``-v`` (faults fired, runs, restarts, lost,
duplicated), and at the end of the session a coverage table (every crash point of every
connector under test, per guarantee, sink mode and kind of kill, with whether it passed; a
failed scenario marks FAILED the crash point it can blame, see
:func:`~epochal.testing.points.fault_results`) and the contract checks that ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from epochal.base.switches import env_switch
from epochal.control.launcher import DriverPool, use_pool
from epochal.testing.points import (
    CONTRACT_RESULTS,
    EXPECTED,
    FAILED,
    NOT_REACHED,
    NOT_RUN,
    PASSED,
    ContractRow,
    CoverageRow,
    coverage_rows,
)
from epochal.testing.suite import ConformanceSuite

POOL_ENV = "EPOCHAL_KIT_POOL"
"""``0`` turns the kit's warm drivers off (every scenario starts its drivers cold)."""


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "conformance: crash tests of the epochal conformance kit")
    config.addinivalue_line("markers", "spark: starts Spark")


def pytest_generate_tests(metafunc: Any) -> None:
    cls = metafunc.cls
    if cls is None or not issubclass(cls, ConformanceSuite):
        return
    if "conformance_case" in metafunc.fixturenames:
        cases = cls.cases()
        metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])
    if "contract_case" in metafunc.fixturenames:
        checks = cls.contract_cases()
        metafunc.parametrize("contract_case", checks, ids=[c.id for c in checks])


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "conformance_case" in names:
            item.add_marker(pytest.mark.conformance)
            item.add_marker(pytest.mark.spark)
        elif "contract_case" in names:
            item.add_marker(pytest.mark.conformance)


def pytest_collection_finish(session: Any) -> None:
    """Every row the selected scenarios must cover (deselected ones are not expected)."""
    for item in session.items:
        case = getattr(getattr(item, "callspec", None), "params", {}).get("conformance_case")
        if case is not None and item.cls is not None:
            for row in coverage_rows(item.cls, case):
                EXPECTED.setdefault(row, NOT_RUN)


@pytest.fixture(scope="session", autouse=True)
def epochal_driver_pool(tmp_path_factory: Any) -> Iterator[DriverPool | None]:
    """Warm drivers shared by the session's jobs (every ``Job.submit`` of this process with
    a local master): a job starts on a driver that has its JVM and SparkSession up, and a
    whole-driver kill is recovered on the next one. Killing them is as real as killing a
    cold one. They skip the warm-up query (about 9 CPU seconds a driver, most of what a
    driver costs before its first batch): the kit needs a driver started, not a fast first
    batch, and on two cores the CPU is what the suite is short of. Their logs and run records
    are in the session's own temporary directory (``epochal-pool*`` under pytest's base one);
    each driver's scratch directory, which its JVM's temporary files go to, is removed when
    the driver ends. After each test module, the pool stops keeping drivers for the profiles
    that no job asked for during it (see :func:`pytest_runtest_teardown`)."""
    if not env_switch(POOL_ENV, True):
        yield None
        return
    pool = DriverPool(size=2, directory=str(tmp_path_factory.mktemp("epochal-pool")), warm_up=False)
    use_pool(pool)
    global _pool
    _pool = pool
    try:
        yield pool
    finally:
        _pool = None
        use_pool(None)
        pool.close()


_pool: DriverPool | None = None


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> None:
    """At the end of a test module, retire the warm drivers of every session profile that no
    job asked for during it (a module's jobs share a profile; the next module's often have
    another): each waiting driver is a JVM that costs CPU to start and keeps costing some
    while it waits, which on a small machine slows the tests that run beside it."""
    if _pool is not None and (nextitem is None or nextitem.path != item.path):
        _pool.retire_unasked()


def pytest_runtest_logreport(report: Any) -> None:
    if report.when != "call":
        return
    summary = dict(report.user_properties).get("epochal")
    reporter = _reporter
    if summary and reporter is not None and reporter.verbosity > 0:
        reporter.write_line(f"    {summary}")


_reporter: Any = None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: Any) -> None:
    global _reporter
    _reporter = session.config.pluginmanager.get_plugin("terminalreporter")


def pytest_sessionfinish(session: Any) -> None:
    """Under pytest-xdist, a worker hands its rows to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["epochal_coverage"] = [
            [*dataclasses.astuple(row), state] for row, state in EXPECTED.items()
        ]
        workeroutput["epochal_contracts"] = [
            [*dataclasses.astuple(row), state] for row, state in CONTRACT_RESULTS.items()
        ]


#: When workers disagree on a row, the state that tells more wins.
_STATE_RANK = {NOT_RUN: 0, NOT_REACHED: 1, PASSED: 2, FAILED: 3}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The xdist controller: merge the rows of a worker (every worker collects every
    scenario, each runs some: a row run by one is ``not run`` on the others)."""
    output = getattr(node, "workeroutput", {})
    for *fields, state in output.get("epochal_coverage", []):
        row = CoverageRow(*fields)
        known = EXPECTED.get(row)
        if known is None or _STATE_RANK.get(state, 1) > _STATE_RANK.get(known, 1):
            EXPECTED[row] = state
    for *fields, state in output.get("epochal_contracts", []):
        contract = ContractRow(*fields)
        if CONTRACT_RESULTS.get(contract) != FAILED:
            CONTRACT_RESULTS[contract] = state


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if terminalreporter.config.option.collectonly:
        return
    if CONTRACT_RESULTS:
        terminalreporter.section("epochal contract checks")
        _table(
            terminalreporter.write_line,
            ("connector", "check", "mode", "result"),
            sorted((r.connector, r.check, r.mode, state) for r, state in CONTRACT_RESULTS.items()),
        )
    if not EXPECTED:
        return
    write = terminalreporter.write_line
    terminalreporter.section("epochal conformance coverage")
    header = ("connector", "crash point", "guarantee", "mode", "kill", "result")
    rows = sorted(
        (r.connector, r.point, r.guarantee, r.mode, r.kill, state) for r, state in EXPECTED.items()
    )
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        write("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)))
    states = [state for _, _, _, _, _, state in rows]
    write(
        f"{states.count(PASSED)} of {len(states)} covered and passed; "
        f"{states.count(FAILED)} failed; {states.count(NOT_REACHED)} not reached (their "
        f"scenario failed before their turn); {states.count(NOT_RUN)} not run"
    )


def _table(write: Any, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        write("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)))
