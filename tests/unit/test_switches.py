"""The environment's on/off switches read one way (epochal.base.switches), by every part that
has one."""

from __future__ import annotations

import pytest

from epochal.base.switches import OFF, ON, SwitchError, env_switch
from epochal.config import TIMELINE_ENV, timeline_enabled
from epochal.spark import attach

NAME = "EPOCHAL_TEST_SWITCH"


@pytest.mark.parametrize("default", [True, False])
def test_unset_or_empty_is_the_default(monkeypatch: pytest.MonkeyPatch, default: bool) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert env_switch(NAME, default) is default
    monkeypatch.setenv(NAME, "  ")
    assert env_switch(NAME, default) is default


@pytest.mark.parametrize("value", [*ON, "TRUE", " On "])
def test_every_word_for_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NAME, value)
    assert env_switch(NAME, False) is True


@pytest.mark.parametrize("value", [*OFF, "False", " OFF "])
def test_every_word_for_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NAME, value)
    assert env_switch(NAME, True) is False


def test_anything_else_is_refused_naming_the_variable_and_the_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(NAME, "of")
    with pytest.raises(SwitchError) as raised:
        env_switch(NAME, True)
    message = str(raised.value)
    assert f"{NAME}='of'" in message and "0" in message and "1" in message
    assert "default: on" in message


def test_the_parts_read_their_switches_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMELINE_ENV, "on")  # a word the timeline's own parser did not take
    assert timeline_enabled()
    monkeypatch.setenv(TIMELINE_ENV, "nope")
    with pytest.raises(SwitchError):
        timeline_enabled()
    monkeypatch.setenv(attach.ENV, "off")
    assert not attach.enabled()
    monkeypatch.setenv(attach.ENV, "nope")  # the attachment never breaks an interpreter
    with pytest.warns(UserWarning, match=attach.ENV):
        assert attach.enabled()
