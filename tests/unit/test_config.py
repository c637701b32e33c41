"""JobConfig: durations, guarantees, validation and the dict round trip."""

from __future__ import annotations

import json

import pytest

from epochal.config import JobConfig, parse_duration
from epochal_sdk import ConfigError, Guarantee


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("500ms", 0.5),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1.5h", 5400.0),
        (" 250 ms ", 0.25),
        ("3", 3.0),
        ("0.25", 0.25),
        (5, 5.0),
        (0.1, 0.1),
        (0, 0.0),
    ],
)
def test_parse_duration(value: str | float, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["fast", "1 minute", "2d", "-1s", "1s2", ""])
def test_parse_duration_refuses_text(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "snapshot_interval")
    assert info.value.connector == "job"
    assert info.value.option == "snapshot_interval"
    assert f"{value!r} is not a duration" in str(info.value)
    assert "500ms" in str(info.value)


def test_parse_duration_refuses_negative_numbers() -> None:
    with pytest.raises(ConfigError, match="'restart_backoff': -1 is negative"):
        parse_duration(-1, "restart_backoff")


def test_job_config_defaults() -> None:
    config = JobConfig()
    assert config.guarantee is Guarantee.EXACTLY_ONCE
    assert config.snapshot_interval == 1.0
    assert config.restart_backoff == 1.0
    assert config.max_restart_backoff == 30.0
    assert config.faults == ""


def test_job_config_parses_durations_and_guarantee() -> None:
    config = JobConfig(
        guarantee="at-least-once",
        snapshot_interval="500ms",
        restart_backoff="2s",
        max_restart_backoff="1m",
    )
    assert config.guarantee is Guarantee.AT_LEAST_ONCE
    assert config.snapshot_interval == 0.5
    assert config.restart_backoff == 2.0
    assert config.max_restart_backoff == 60.0
    assert JobConfig(guarantee="NONE").guarantee is Guarantee.NONE
    assert JobConfig(guarantee=Guarantee.AT_LEAST_ONCE).guarantee is Guarantee.AT_LEAST_ONCE


@pytest.mark.parametrize(
    ("settings", "option", "problem"),
    [
        ({"snapshot_interval": "soon"}, "snapshot_interval", "is not a duration"),
        ({"snapshot_interval": 0}, "snapshot_interval", "must be above zero"),
        ({"snapshot_interval": "0ms"}, "snapshot_interval", "must be above zero"),
        ({"restart_backoff": -2}, "restart_backoff", "is negative"),
        ({"max_restart_backoff": "x"}, "max_restart_backoff", "is not a duration"),
        ({"max_restarts": -1}, "max_restarts", "is negative"),
        ({"snapshot_dir": "  "}, "snapshot_dir", "is empty"),
        ({"faults": "sink.after_coffee@3"}, "faults", "unknown crash point 'sink.after_coffee'"),
        ({"faults": "sink.after_commit@x"}, "faults", "batch is not a number"),
        ({"master": " SC://localhost:15002"}, "master", "is a Spark Connect URL"),
    ],
)
def test_invalid_settings_name_the_setting(settings: dict, option: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        JobConfig(**settings)
    assert info.value.connector == "job"
    assert info.value.option == option
    assert problem in str(info.value)


def test_invalid_guarantee_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        JobConfig(guarantee="exactly-twice")
    assert info.value.option == "guarantee"


def test_valid_faults_are_accepted() -> None:
    config = JobConfig(faults="sink.after_decision@3, source.after_read")
    assert config.faults == "sink.after_decision@3, source.after_read"


def test_to_dict_from_dict_round_trip() -> None:
    config = JobConfig(
        guarantee="at-least-once",
        snapshot_interval="250ms",
        available_now=True,
        allow_downgrade=True,
        max_restarts=3,
        snapshot_dir="/tmp/snaps",
        master="local[4]",
        spark_conf={"spark.sql.shuffle.partitions": "2"},
        faults="job.after_batch@2",
    )
    data = config.to_dict()
    assert data["guarantee"] == "at-least-once"
    assert data["snapshot_interval"] == 0.25
    assert json.loads(json.dumps(data)) == data  # JSON-ready
    again = JobConfig.from_dict(json.loads(json.dumps(data)))
    assert again == config
    assert again.to_dict() == data
    # to_dict is a copy
    data["spark_conf"]["x"] = "y"
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "2"}


def test_from_dict_refuses_unknown_keys() -> None:
    data = JobConfig().to_dict()
    data["snapshot_intervall"] = "2s"
    data["zzz"] = 1
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(data)
    assert info.value.option == "snapshot_intervall"
    assert "is not a JobConfig setting" in str(info.value)
    assert "snapshot_interval" in info.value.fix


def test_from_dict_validates_values() -> None:
    with pytest.raises(ConfigError, match="snapshot_interval"):
        JobConfig.from_dict({"snapshot_interval": "-5s"})
