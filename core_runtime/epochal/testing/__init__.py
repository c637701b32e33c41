"""epochal.testing: the conformance kit (a pytest plugin) for connector packages.

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

from epochal.testing.kit import (
    Case,
    ConformanceSuite,
    Outcome,
    Scenario,
    SinkUnderTest,
    SourceUnderTest,
    run_case,
)
from epochal.testing.transactions import prepare_transaction

__all__ = [
    "Case",
    "ConformanceSuite",
    "Outcome",
    "Scenario",
    "SinkUnderTest",
    "SourceUnderTest",
    "prepare_transaction",
    "run_case",
]
