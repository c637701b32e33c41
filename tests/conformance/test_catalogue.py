"""The kit's bug catalogue: the kit fails every broken variant of the reference connectors
(``python -m tests.conformance.catalogue``) and passes the unmodified references (no false
alarm); the table is printed. A variant only a Spark scenario catches (a sink blind to the
transactions of writers gone after the job's parallelism changed) runs that scenario alone. And the
Spark layer: the crash point between receive and store (``ack_source.after_receive``) catches
a source that acknowledges on receipt in a real job."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.control.launcher import DriverPool
from tests.conformance.catalogue import SPARK_CASES, plugins_loaded, run, spark_problem
from tests.conformance.mutants import MUTANT_PARTS

pytestmark = pytest.mark.conformance


@pytest.mark.spark
def test_the_kit_catches_every_variant_and_passes_the_references(
    capsys: pytest.CaptureFixture[str], epochal_driver_pool: DriverPool | None
) -> None:
    catalogue = run(report=lambda line: None, pool=epochal_driver_pool)
    with capsys.disabled():
        print("\n" + catalogue.table())
    assert not catalogue.false_alarms, [
        (r.connector, r.caught_by, r.detail) for r in catalogue.false_alarms
    ]
    assert not catalogue.survivors, [r.connector for r in catalogue.survivors]
    contracts = {r.contract for r in catalogue.variants}
    assert contracts == {"replayable", "acknowledging", "transactional", "idempotent"}
    for contract in contracts:
        assert sum(r.contract == contract for r in catalogue.variants) >= 5, contract
    assert len(catalogue.variants) == len(MUTANT_PARTS)


@pytest.mark.spark
def test_a_crash_between_receive_and_store_loses_what_was_acknowledged_on_receipt(
    epochal_driver_pool: DriverPool | None, tmp_path: Path
) -> None:
    name = "mutant-testqueue-ack-on-receipt"
    with plugins_loaded():
        problem = spark_problem(
            SPARK_CASES[name], MUTANT_PARTS[name][0], name, str(tmp_path), epochal_driver_pool
        )
    assert problem is not None and problem.startswith("lost records"), problem
