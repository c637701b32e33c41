"""HDFS snapshot directories without a server: paths, settings, the layout they share with S3.

The store itself runs against a real NameNode and DataNode in
``integration/hdfs/test_hdfs_lease.py``.
"""

from __future__ import annotations

import pytest

from epochal.state import objectstore, webhdfs
from epochal.state.lease.fence import checkpoint_location, state_dir, state_location
from epochal.state.store import SnapshotStore
from epochal_sdk import ConfigError


def test_hdfs_paths_keep_the_state_at_one_prefix_and_spark_uses_them_as_they_are() -> None:
    assert webhdfs.split_uri("hdfs://nn:8020/a/b/") == ("nn:8020", "a/b")
    assert objectstore.has_conditional_writes("hdfs://nn:8020/a")
    assert objectstore.has_conditional_writes("s3://bucket/a")
    assert not objectstore.has_conditional_writes("/local/hdfs/a")
    assert not objectstore.has_conditional_writes("mock:///a")
    assert state_location("hdfs://nn:8020/snap/job/epochs/3") == "hdfs://nn:8020/snap/job/state"
    assert (
        checkpoint_location(state_dir("hdfs://nn:8020/snap/job", 3))
        == "hdfs://nn:8020/snap/job/state/checkpoint"
    )
    store = SnapshotStore("hdfs://nn:8020/snap/job")
    assert store.conditional and isinstance(store.objects, webhdfs.HdfsStore)
    assert store.objects.bucket == "nn:8020" and store.base == "nn:8020/snap/job"


def test_a_user_or_options_in_the_uri_are_refused() -> None:
    with pytest.raises(ConfigError, match="user or options"):
        webhdfs.split_uri("hdfs://someone@nn:8020/snap")
    with pytest.raises(ConfigError, match="NameNode"):
        webhdfs.split_uri("hdfs:///snap")


def test_settings_and_spark_conf_come_from_the_environment() -> None:
    default = webhdfs.WebHdfsSettings.from_env("nn.example:8020", {"HADOOP_USER_NAME": "etl"})
    assert default == webhdfs.WebHdfsSettings("http://nn.example:9870", "etl")
    env = {"EPOCHAL_WEBHDFS_URL": "https://nn.example:9871/", "HADOOP_USER_NAME": "etl"}
    assert webhdfs.WebHdfsSettings.from_env("nn.example:8020", env).url == (
        "https://nn.example:9871"
    )
    assert webhdfs.spark_conf(env) == {
        "spark.executorEnv.EPOCHAL_WEBHDFS_URL": "https://nn.example:9871/",
        "spark.executorEnv.HADOOP_USER_NAME": "etl",
    }
    assert webhdfs.spark_conf({}) == {}
