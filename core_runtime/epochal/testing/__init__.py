"""epochal.testing: the conformance kit (a pytest plugin) for connector packages.

The suite (:mod:`~epochal.testing.suite`), the catalogue of crash points and the coverage
table (:mod:`~epochal.testing.points`), the scenario runner
(:mod:`~epochal.testing.scenarios`), the outside failures with and without a supervisor
(:mod:`~epochal.testing.real_failures`, :mod:`~epochal.testing.session_failures`), the
contract checks without Spark (:mod:`~epochal.testing.contract_checks`, their crashes played
by :mod:`~epochal.testing.crashing`). The bug catalogue that measures the kit (broken
variants of the reference connectors and the command that runs the kit against them) is part
of epochal's own tests (``tests/conformance/mutants.py``, ``tests/conformance/catalogue.py``).

Example (a connector's tests)::

    from epochal.testing import ConformanceSuite, SinkUnderTest

    class TestMySink(ConformanceSuite):
        sink_modes = ("transactional",)

        @pytest.fixture
        def epochal_sink(self, my_server):
            return MySinkUnderTest(my_server)

        @pytest.fixture
        def epochal_source(self, epochal_map_source):
            return epochal_map_source
"""

from epochal.testing.runner import run_case
from epochal.testing.scenarios import Outcome, Scenario
from epochal.testing.suite import ConformanceSuite
from epochal.testing.transactions import prepare_transaction
from epochal.testing.under_test import SinkUnderTest, SourceUnderTest

__all__ = [
    "ConformanceSuite",
    "Outcome",
    "Scenario",
    "SinkUnderTest",
    "SourceUnderTest",
    "prepare_transaction",
    "run_case",
]
