"""The kit's bug catalogue: the kit run against every broken variant of the reference
connectors (:mod:`tests.conformance.mutants`), and a table of what caught each one.

::

    python -m tests.conformance.catalogue            # the table
    python -m tests.conformance.catalogue --json     # the same, as JSON
    python -m tests.conformance.catalogue --spark    # also each variant's Spark case, if any

For each variant the kit's cases run cheapest first and stop at the first failure: the
contract checks of its contract (:mod:`epochal.testing.contract_checks`, no Spark), then, only
if every check passed, the Spark scenarios of a suite for its contract (one warm driver pool
for all of them; only the one named in :data:`CAUGHT_ONLY_BY` for a variant whose bug only
that one can show). The unmodified reference connectors (``map`` source and sink in both modes,
``testqueue``) run every check first: a check that fails there is a false alarm. The command
exits non-zero when a variant survives or a reference fails. ``--spark`` also runs, for the
variants that name one, the Spark scenario that catches the bug in a real job (the crash point
``ack_source.after_receive`` against acknowledgement on receipt).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from epochal.base.fault_plan import Fault
from epochal.control.launcher import DriverPool
from epochal.parts import registry
from epochal.testing.broker import TestBroker
from epochal.testing.contract_checks import ContractCheck, Subject, checks_of
from epochal.testing.runner import run_case
from epochal.testing.scenarios import Scenario
from epochal.testing.suite import ConformanceSuite, scenario_problem
from epochal.testing.under_test import SinkUnderTest, SourceUnderTest
from epochal_map.testing import MapSinkUnderTest, MapSourceUnderTest
from epochal_sdk import Guarantee
from tests.conformance.mutants import MUTANT_PARTS, bug_of

PLUGINS = ("epochal.testing.broker", "tests.conformance.mutants")
"""The plugin modules the catalogue loads (here and in the drivers): the test queue and the
variants."""
SIDE = {
    "replayable": "source",
    "acknowledging": "source",
    "transactional": "sink",
    "idempotent": "sink",
}
REFERENCES = {
    "replayable": "map",
    "acknowledging": "testqueue",
    "transactional": "map",
    "idempotent": "map",
}
"""The reference connector of each contract (the variants are broken copies of it)."""
SPARK_CASES = {
    "mutant-testqueue-ack-on-receipt": Scenario(
        "points",
        Guarantee.EXACTLY_ONCE,
        "transactional",
        (Fault("ack_source.after_receive", action="worker"),),
    ),
}
"""The Spark scenario that catches a variant's bug in a real job, for ``--spark``."""
ARRIVAL_DEADLINE = 10.0
"""Seconds a replayable source's checks wait here for produced records to show: the
references and their variants are local files, which show them at once (a variant that never
does, ``mutant-map-first-look-end``, is caught when this ends)."""
CAUGHT_ONLY_BY = {"mutant-map-todays-writers-in-doubt": "session-failures"}
"""Variants whose bug only one of the suite's Spark scenarios can show (by kind): the one
whose job changes its parallelism while transactions are prepared (driver B paused before
its decision with 4 writers prepared, C with one). Once the contract checks
passed such a variant, the catalogue runs that scenario alone rather than every cheaper one
before it (they pass it: their jobs keep two writers)."""


class QueueUnderTest(SourceUnderTest):
    """A queue of the test queue (``testqueue``) as the source under test: message IDs are
    the record IDs."""

    connector = "testqueue"
    id_expr = "CAST(id AS BIGINT)"

    def __init__(self, path: str | Path, queue: str = "orders") -> None:
        self.path, self.queue = str(path), queue

    def options(self) -> dict[str, str]:
        return {"path": self.path, "queue": self.queue, "receiveTimeoutMs": "300"}

    def produce(self, ids: Sequence[int]) -> None:
        broker = TestBroker(self.path)
        try:
            broker.send(self.queue, [(str(i), f"order {i}") for i in ids])
        finally:
            broker.close()

    def unsettled(self) -> list[str]:
        broker = TestBroker(self.path)
        try:
            states = broker.states(self.queue)
        finally:
            broker.close()
        return [f"{n} message(s) {state}" for state, n in states.items() if state != "acked"]


def under_test(contract: str, connector: str, directory: str) -> SourceUnderTest | SinkUnderTest:
    """The side of ``contract`` under test as the reference's, named ``connector``."""
    base: type[SourceUnderTest] | type[SinkUnderTest]
    if contract == "replayable":
        base, file = MapSourceUnderTest, "source.sqlite"
    elif contract == "acknowledging":
        base, file = QueueUnderTest, "queue.sqlite"
    else:
        base, file = MapSinkUnderTest, "sink.sqlite"
    renamed = type(base.__name__, (base,), {"connector": connector})
    return renamed(os.path.join(directory, file))


def other_side(contract: str, directory: str) -> SourceUnderTest | SinkUnderTest:
    """The reference map connector on the side not under test (for Spark scenarios)."""
    if SIDE[contract] == "source":
        return MapSinkUnderTest(os.path.join(directory, "other-sink.sqlite"))
    return MapSourceUnderTest(os.path.join(directory, "other-source.sqlite"))


def suite_for(contract: str) -> type[ConformanceSuite]:
    """A conformance suite for one contract, as a connector package writes it."""
    source = SIDE[contract] == "source"
    return type(
        f"CatalogueSuite_{contract}",
        (ConformanceSuite,),
        {
            "scope": "source" if source else "sink",
            "source_contract": contract if source else "replayable",
            "sink_modes": ("transactional",) if source else (contract,),
        },
    )


@dataclass
class Row:
    """One line of the table: a variant (or a reference) and what the kit did to it."""

    contract: str
    connector: str
    bug: str
    caught_by: str
    seconds: float
    detail: str = ""
    spark: str = ""

    @property
    def survived(self) -> bool:
        """A variant no case caught."""
        return self.caught_by == ""


@dataclass
class Catalogue:
    """The catalogue's outcome: the references' checks and the variants."""

    references: list[Row]
    variants: list[Row]
    seconds: float

    @property
    def false_alarms(self) -> list[Row]:
        """References a check failed."""
        return [r for r in self.references if r.caught_by]

    @property
    def survivors(self) -> list[Row]:
        """Variants nothing caught."""
        return [r for r in self.variants if r.survived]

    def ok(self) -> bool:
        """Every variant caught, no false alarm."""
        return not self.false_alarms and not self.survivors

    def table(self) -> str:
        """The table: contract, variant, bug, caught by, time."""
        header = ("contract", "variant", "bug", "caught by", "time")
        lines = [
            (
                r.contract,
                r.connector,
                r.bug,
                (r.caught_by or "SURVIVED") + (f"; Spark: {r.spark}" if r.spark else ""),
                f"{r.seconds:.1f} s",
            )
            for r in self.variants
        ]
        out = _aligned(header, lines)
        out.append("")
        out.append(
            f"{len(self.variants) - len(self.survivors)} of {len(self.variants)} variants "
            f"caught; references: {len(self.references) - len(self.false_alarms)} of "
            f"{len(self.references)} checks passed; {self.seconds:.0f} s in all"
        )
        for row in self.false_alarms:
            out.append(
                f"FALSE ALARM {row.connector} ({row.contract}) {row.caught_by}: {row.detail}"
            )
        return "\n".join(out)

    def as_json(self) -> str:
        """The outcome as JSON."""
        return json.dumps(
            {
                "variants": [asdict(r) for r in self.variants],
                "references": [asdict(r) for r in self.references],
                "survivors": [r.connector for r in self.survivors],
                "false_alarms": [r.connector for r in self.false_alarms],
                "seconds": round(self.seconds, 1),
            },
            indent=2,
        )


def _aligned(header: tuple[str, ...], lines: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    ]


@contextlib.contextmanager
def plugins_loaded() -> Iterator[None]:
    """The test queue and the variants registered (here and in drivers started meanwhile)."""
    before = os.environ.get(registry.EXTRA_PLUGINS_ENV)
    extra = [p for p in (before or "").split(",") if p.strip()]
    os.environ[registry.EXTRA_PLUGINS_ENV] = ",".join(dict.fromkeys([*extra, *PLUGINS]))
    registry.plugin_manager.cache_clear()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(registry.EXTRA_PLUGINS_ENV, None)
        else:
            os.environ[registry.EXTRA_PLUGINS_ENV] = before
        registry.plugin_manager.cache_clear()


def check_problem(check: ContractCheck, contract: str, connector: str, root: str) -> str | None:
    """Run one check on a fresh side named ``connector``; what failed, or None."""
    directory = tempfile.mkdtemp(prefix=f"{check.name}-", dir=root)
    under = under_test(contract, connector, directory)
    mode = contract if SIDE[contract] == "sink" else "transactional"
    subject = Subject(
        source=under if SIDE[contract] == "source" else None,  # type: ignore[arg-type]
        sink=under if SIDE[contract] == "sink" else None,  # type: ignore[arg-type]
        mode=mode,
        workdir=directory,
        arrival_deadline=ARRIVAL_DEADLINE,
    )
    try:
        check.run(subject)
    except Exception as exc:  # a violation, or any error a test would fail with
        return f"{type(exc).__name__}: {exc}"
    return None


def spark_problem(
    scenario: Scenario, contract: str, connector: str, root: str, pool: DriverPool | None
) -> str | None:
    """Run one Spark scenario with the side named ``connector``; what went wrong, or None."""
    directory = tempfile.mkdtemp(prefix=f"{scenario.id}-", dir=root)
    under = under_test(contract, connector, directory)
    other = other_side(contract, directory)
    source, sink = (under, other) if SIDE[contract] == "source" else (other, under)
    try:
        outcome = run_case(
            scenario,
            source,  # type: ignore[arg-type]
            sink,  # type: ignore[arg-type]
            os.path.join(directory, "snapshots"),
            records=300,
            per_batch=100,
            pool=pool,
            replayable=contract != "acknowledging",
        )
    except AssertionError as exc:  # a step of the scenario found what it checks broken
        return f"{type(exc).__name__}: {exc}"
    return scenario_problem(scenario, outcome, source, sink)  # type: ignore[arg-type]


class Runner:
    """Runs the catalogue; one driver pool for every Spark scenario (started when the first
    one is needed, unless one is given)."""

    def __init__(
        self, root: str, pool: DriverPool | None = None, report: Callable[[str], None] = print
    ) -> None:
        self.root, self.report = root, report
        self._pool, self._own_pool = pool, False

    def pool(self) -> DriverPool:
        """The driver pool (started now if needed)."""
        if self._pool is None:
            self._pool, self._own_pool = DriverPool(size=1), True
        return self._pool

    def close(self) -> None:
        """Stop the pool if this runner started it."""
        if self._own_pool and self._pool is not None:
            self._pool.close()

    def reference(self, contract: str) -> list[Row]:
        """Every check of ``contract`` against its reference connector."""
        rows = []
        for check in checks_of(contract):
            started = time.perf_counter()
            failed = check_problem(check, contract, REFERENCES[contract], self.root)
            rows.append(
                Row(
                    contract,
                    REFERENCES[contract],
                    f"(the reference, check {check.name})",
                    check.name if failed else "",
                    time.perf_counter() - started,
                    failed or "passed",
                )
            )
            outcome = f"FAILED {failed}" if failed else "passed"
            self.report(f"reference {REFERENCES[contract]} ({contract}) {check.name}: {outcome}")
        return rows

    def variant(self, name: str, spark: bool = False) -> Row:
        """The kit's cases against variant ``name``, cheapest first, until one fails."""
        contract = MUTANT_PARTS[name][0]
        started = time.perf_counter()
        row = Row(contract, name, bug_of(name), "", 0.0)
        for check in checks_of(contract):
            failed = check_problem(check, contract, name, self.root)
            if failed:
                row.caught_by, row.detail = f"check {check.name}", failed
                break
        else:
            scenarios = suite_for(contract).cases()
            if name in CAUGHT_ONLY_BY:
                scenarios = [s for s in scenarios if s.kind == CAUGHT_ONLY_BY[name]]
            for scenario in scenarios:
                failed = spark_problem(scenario, contract, name, self.root, self.pool())
                if failed:
                    row.caught_by, row.detail = f"Spark {scenario.id}", failed
                    break
        row.seconds = time.perf_counter() - started
        if spark and name in SPARK_CASES:
            scenario = SPARK_CASES[name]
            failed = spark_problem(scenario, contract, name, self.root, self.pool())
            row.spark = f"{scenario.plan} caught it" if failed else f"{scenario.plan} SURVIVED"
        self.report(f"{name}: {row.caught_by or 'SURVIVED'} ({row.seconds:.1f} s)")
        return row


def run(
    names: Sequence[str] | None = None,
    *,
    spark: bool = False,
    pool: DriverPool | None = None,
    report: Callable[[str], None] = print,
) -> Catalogue:
    """Run the catalogue (every variant, or ``names``): references first, then each variant."""
    chosen = list(names or MUTANT_PARTS)
    unknown = [n for n in chosen if n not in MUTANT_PARTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(MUTANT_PARTS)}")
    started = time.perf_counter()
    with (
        plugins_loaded(),
        tempfile.TemporaryDirectory(prefix="epochal-catalogue-") as root,
    ):
        runner = Runner(root, pool, report)
        try:
            contracts = dict.fromkeys(MUTANT_PARTS[n][0] for n in chosen)
            references = [row for c in contracts for row in runner.reference(c)]
            variants = [runner.variant(name, spark) for name in chosen]
        finally:
            runner.close()
    return Catalogue(references, variants, time.perf_counter() - started)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.conformance.catalogue``: print the table (or JSON); 1 when a variant
    survives or a reference fails a check."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.catalogue",
        description="Run the conformance kit against broken variants of the reference "
        "connectors and show which case catches each.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--spark", action="store_true", help="also run each variant's Spark case, if it has one"
    )
    parser.add_argument("variants", nargs="*", help="only these variants (default: all)")
    args = parser.parse_args(argv)
    logging.getLogger("epochal").setLevel(logging.ERROR)  # the variants' expected warnings
    quiet = args.json
    catalogue = run(
        args.variants or None,
        spark=args.spark,
        report=(lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr)),
    )
    print(catalogue.as_json() if args.json else catalogue.table())
    return 0 if catalogue.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
