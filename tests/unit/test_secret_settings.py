"""Secrets in Spark settings stay off command lines: the driver gives Spark the settings
that are references or hold a secret only after its JVM started (which settings those are,
resolved), and the object store's settings carry no credential. The whole path, with a real
JVM: ``test_a_secret_spark_setting_reaches_the_session_but_no_command_line`` in
tests/spark/test_jobs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.startup.session import private_settings
from epochal.state import objectstore
from epochal_sdk import ConfigError

ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-1",
    "AWS_ACCESS_KEY_ID": "AKIA-key-1d",
    "AWS_SECRET_ACCESS_KEY": "s3cr3t-access-key",
    "AWS_SESSION_TOKEN": "s3ss10n-token",
    "AWS_SHARED_CREDENTIALS_FILE": "/etc/epochal/aws-credentials",
}


def test_the_object_stores_spark_settings_carry_no_credential() -> None:
    conf = objectstore.spark_conf(ENV)
    for secret in ("AKIA-key-1d", "s3cr3t-access-key", "s3ss10n-token"):
        assert all(secret not in value for value in conf.values()), conf
    assert not any(name in key for key in conf for name in objectstore.NOT_FORWARDED)
    assert (
        conf["spark.executorEnv.AWS_SHARED_CREDENTIALS_FILE"] == ENV["AWS_SHARED_CREDENTIALS_FILE"]
    )
    assert conf["spark.executorEnv.AWS_REGION"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"


def test_references_and_secrets_are_the_private_settings_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_file = tmp_path / "s3-secret"
    secret_file.write_text("from-a-file\n")
    monkeypatch.setenv("S3_KEY_ID", "from-the-env")
    conf = {
        "spark.hadoop.fs.s3a.access.key": "${env:S3_KEY_ID}",
        "spark.hadoop.fs.s3a.secret.key": f"${{file:{secret_file}}}",
        "spark.authenticate.secret": "given-as-it-is",  # refused at submit; private anyway
        "spark.sql.shuffle.partitions": "2",
        "spark.hadoop.fs.s3a.aws.credentials.provider": "x.Provider",
    }
    assert private_settings(conf) == {
        "spark.hadoop.fs.s3a.access.key": "from-the-env",
        "spark.hadoop.fs.s3a.secret.key": "from-a-file",
        "spark.authenticate.secret": "given-as-it-is",
    }
    monkeypatch.delenv("S3_KEY_ID")
    with pytest.raises(ConfigError, match=r"option 'spark.hadoop.fs.s3a.access.key'.*S3_KEY_ID"):
        private_settings(conf)
