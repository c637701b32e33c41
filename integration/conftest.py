"""Fixtures for integration tests (everything under ``integration/``).

The fixtures and hooks live in :mod:`integration.harness.plugin` so that they can also be
loaded as a plugin (``-p integration.harness.plugin``); see ``docs/contributing/testing.md``.
"""

from integration.harness.plugin import (  # noqa: F401 - re-exported as conftest fixtures/hooks
    _restore_servers,
    hdfs_server,
    jms_queue,
    jms_server,
    kafka_cluster,
    kafka_server,
    kafka_topic,
    postgres_db,
    postgres_server,
    pytest_configure,
    pytest_runtest_makereport,
    s3_bucket,
    s3_server,
    spark_cluster,
    spark_connect_server,
    yarn_cluster,
)
