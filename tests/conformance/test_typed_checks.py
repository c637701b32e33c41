"""The typed contract checks fail where they must: a sink that accepts a type its suite says
it does not map, and a suite that does not say which types its sink maps (skipped, with the
reason)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.testing.contract_checks import CheckNotApplicableError, ContractViolationError, Subject
from epochal.testing.contract_checks.sinks import check_typed_values
from epochal.testing.contract_checks.typed import ALL_TYPES
from epochal_map.testing import MapSinkUnderTest

pytestmark = pytest.mark.conformance


class MapWithoutBinary(MapSinkUnderTest):
    """The map, its suite saying it does not map binary (the map accepts it)."""

    types = tuple(t for t in ALL_TYPES if t != "binary")


class MapUnsaid(MapSinkUnderTest):
    """The map, its suite saying nothing of types (as before the typed checks)."""

    types = None


@pytest.mark.parametrize("mode", ["transactional", "idempotent"])
def test_a_type_accepted_that_the_suite_says_is_not_mapped_fails_the_check(
    tmp_path: Path, mode: str
) -> None:
    subject = Subject(
        sink=MapWithoutBinary(tmp_path / "sink.sqlite"), mode=mode, workdir=str(tmp_path)
    )
    with pytest.raises(ContractViolationError, match=r"accepted a binary column \(c_binary\)"):
        check_typed_values(subject)


def test_a_suite_that_does_not_say_its_types_is_not_checked(tmp_path: Path) -> None:
    subject = Subject(
        sink=MapUnsaid(tmp_path / "sink.sqlite"), mode="idempotent", workdir=str(tmp_path)
    )
    with pytest.raises(CheckNotApplicableError, match=r"SinkUnderTest\.types"):
        check_typed_values(subject)
