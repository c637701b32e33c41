"""The effective guarantee of a part: min of job, option and capability; refusal or downgrade."""

from __future__ import annotations

import logging

import pytest

from epochal.parts.effective import effective
from epochal_sdk import ConfigError, Guarantee
from epochal_sdk.errors import GuaranteeError

G = Guarantee

PART = "sink 'map' (map-1a2b3c4d5e)"


def run(asked: G, capable: G, options: dict | None = None, allow: bool = False) -> G:
    return effective(asked, capable, part=PART, options=options or {}, allow_downgrade=allow)


@pytest.mark.parametrize(
    ("asked", "capable", "option", "expected"),
    [
        (G.EXACTLY_ONCE, G.EXACTLY_ONCE, None, G.EXACTLY_ONCE),
        (G.AT_LEAST_ONCE, G.EXACTLY_ONCE, None, G.AT_LEAST_ONCE),
        (G.NONE, G.EXACTLY_ONCE, None, G.NONE),
        (G.AT_LEAST_ONCE, G.AT_LEAST_ONCE, None, G.AT_LEAST_ONCE),
        (G.EXACTLY_ONCE, G.EXACTLY_ONCE, "at-least-once", G.AT_LEAST_ONCE),
        (G.EXACTLY_ONCE, G.EXACTLY_ONCE, "none", G.NONE),
        # an option cannot raise the part above the job
        (G.AT_LEAST_ONCE, G.EXACTLY_ONCE, "exactly-once", G.AT_LEAST_ONCE),
    ],
)
def test_effective_is_the_minimum(asked: G, capable: G, option: str | None, expected: G) -> None:
    options = {"guarantee": option} if option else {}
    assert run(asked, capable, options) is expected


def test_refusal_names_the_part_and_the_fixes() -> None:
    with pytest.raises(GuaranteeError) as info:
        effective(
            G.EXACTLY_ONCE,
            G.AT_LEAST_ONCE,
            part=PART,
            options={"path": "/x"},
            allow_downgrade=False,
            why="the server has no transactions",
        )
    message = str(info.value)
    assert message.startswith(
        f"{PART} can give at most at-least-once (the server has no transactions), "
        "but the job asks for exactly-once. Refusing to start."
    )
    assert ".option('guarantee', 'at-least-once')" in message
    assert "allow_downgrade=True" in message
    assert "--allow-downgrade" in message


def test_refusal_of_none_capability() -> None:
    with pytest.raises(
        GuaranteeError, match="can give at most none, but the job asks for at-least"
    ):
        run(G.AT_LEAST_ONCE, G.NONE)


def test_allow_downgrade_returns_the_capability(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="epochal.guarantee"):
        assert run(G.EXACTLY_ONCE, G.AT_LEAST_ONCE, allow=True) is G.AT_LEAST_ONCE
    assert len(caplog.records) == 1
    assert caplog.records[0].levelno == logging.WARNING
    assert PART in caplog.records[0].getMessage()
    assert "running it at-least-once" in caplog.records[0].getMessage()


def test_explicit_lowering_needs_no_downgrade(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="epochal.guarantee"):
        got = run(G.EXACTLY_ONCE, G.AT_LEAST_ONCE, {"Guarantee": "AT_LEAST_ONCE"})
    assert got is G.AT_LEAST_ONCE
    assert caplog.records == []


def test_lowering_below_the_capability_is_still_refused_for_more() -> None:
    # asking at-least-once explicitly from a part that can give none is refused
    with pytest.raises(GuaranteeError, match="asks for at-least-once"):
        run(G.EXACTLY_ONCE, G.NONE, {"guarantee": "at-least-once"})


def test_bad_guarantee_option_names_the_part() -> None:
    with pytest.raises(ConfigError) as info:
        run(G.EXACTLY_ONCE, G.EXACTLY_ONCE, {"guarantee": "exactly-twice"})
    assert info.value.option == "guarantee"
    assert PART in str(info.value)
