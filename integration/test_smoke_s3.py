"""Smoke tests: the object store is a real S3 server with what a snapshot store relies on.

Objects round-trip through signed requests; ``If-None-Match: *`` and ``If-Match: <etag>``
make writes conditional (also under concurrent writers, where exactly one wins); data
survives ``kill -9``; pyarrow's S3 filesystem works against it (without conditional
writes); Spark reads and writes ``s3a://`` and a streaming query restarts from a
checkpoint kept there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from integration.harness.s3 import S3Bucket, S3Server, spark_s3a_conf
from integration.harness.spark_cluster import driver_argv, driver_result

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
WRITERS = 4


def _status(error: Any) -> tuple[int, str]:
    """HTTP status and S3 error code of a botocore ``ClientError``."""
    response = error.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def _body(bucket: S3Bucket, key: str) -> bytes:
    return bytes(bucket.client().get_object(Bucket=bucket.name, Key=key)["Body"].read())


def test_put_get_list_delete(s3_bucket: S3Bucket) -> None:
    """Objects round-trip; listing pages, prefixes and delimiters work; deletes stick."""
    client = s3_bucket.client()
    keys = [f"snap/{n:03d}/manifest.json" for n in range(5)] + ["snap/latest", "other/x"]
    for key in keys:
        client.put_object(Bucket=s3_bucket.name, Key=key, Body=key.encode())

    assert _body(s3_bucket, "snap/002/manifest.json") == b"snap/002/manifest.json"
    head = client.head_object(Bucket=s3_bucket.name, Key="snap/latest")
    assert head["ContentLength"] == len(b"snap/latest")
    assert head["ETag"].strip('"')  # the conditional writes below rely on ETags

    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=s3_bucket.name, Prefix="snap/", PaginationConfig={"PageSize": 2}
    )
    listed = [item["Key"] for page in pages for item in page.get("Contents", [])]
    assert listed == sorted(k for k in keys if k.startswith("snap/"))
    top = client.list_objects_v2(Bucket=s3_bucket.name, Prefix="snap/", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == [f"snap/{n:03d}/" for n in range(5)]
    assert [item["Key"] for item in top["Contents"]] == ["snap/latest"]

    client.delete_object(Bucket=s3_bucket.name, Key="snap/latest")
    client.delete_objects(
        Bucket=s3_bucket.name,
        Delete={"Objects": [{"Key": f"snap/{n:03d}/manifest.json"} for n in range(5)]},
    )
    assert s3_bucket.keys() == ["other/x"]
    with pytest.raises(client.exceptions.ClientError) as missing:
        client.get_object(Bucket=s3_bucket.name, Key="snap/latest")
    assert _status(missing.value) == (404, "NoSuchKey")


def test_if_none_match_refuses_to_overwrite(s3_bucket: S3Bucket) -> None:
    """``If-None-Match: *`` creates a key once; a second create fails with 412."""
    client = s3_bucket.client()
    created = client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"first", IfNoneMatch="*")
    assert created["ResponseMetadata"]["HTTPStatusCode"] == 200

    with pytest.raises(client.exceptions.ClientError) as refused:
        client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"second", IfNoneMatch="*")
    assert _status(refused.value) == (412, "PreconditionFailed")
    assert _body(s3_bucket, "lease") == b"first"


def test_if_match_needs_the_current_etag(s3_bucket: S3Bucket) -> None:
    """``If-Match`` succeeds with the current ETag only; a stale one fails with 412."""
    client = s3_bucket.client()
    first = client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"epoch-1")["ETag"]
    second = client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"epoch-2", IfMatch=first)
    assert second["ETag"] != first

    with pytest.raises(client.exceptions.ClientError) as stale:
        client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"epoch-2b", IfMatch=first)
    assert _status(stale.value) == (412, "PreconditionFailed")
    assert _body(s3_bucket, "lease") == b"epoch-2"

    # SeaweedFS answers If-Match on a missing key with 412 (AWS says 404 NoSuchKey).
    with pytest.raises(client.exceptions.ClientError) as missing:
        client.put_object(Bucket=s3_bucket.name, Key="absent", Body=b"x", IfMatch=first)
    assert _status(missing.value)[0] in (404, 412)
    assert s3_bucket.keys() == ["lease"]


def _race(
    bucket: S3Bucket, clients: list[Any], key: str, tag: str, condition: dict[str, str]
) -> list[int]:
    """Every client PUTs ``<tag>-writer-<i>`` to ``key`` at once under ``condition``; the
    winners' indexes. Bodies differ per round: an ETag is the MD5 of the content, so
    rewriting identical bytes would leave the ETag unchanged and an If-Match still true."""
    barrier = threading.Barrier(len(clients))
    winners: list[int] = []
    failures: list[Any] = []

    def write(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            clients[index].put_object(
                Bucket=bucket.name, Key=key, Body=f"{tag}-writer-{index}".encode(), **condition
            )
            winners.append(index)
        except clients[index].exceptions.ClientError as exc:
            if _status(exc) != (412, "PreconditionFailed"):
                failures.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, f"unexpected errors: {failures}"
    return winners


def test_conditional_writes_have_one_winner_under_contention(s3_bucket: S3Bucket) -> None:
    """Concurrent conditional PUTs on one key: exactly one succeeds, the rest get 412.

    (SeaweedFS serialises them on a per-key lock: a loser waits up to ~1 s per writer
    queued before it, so the rounds are kept small.)
    """
    clients = [s3_bucket.client(max_pool_connections=2) for _ in range(WRITERS)]
    for round_ in range(2):
        key = f"create-{round_}"
        winners = _race(s3_bucket, clients, key, key, {"IfNoneMatch": "*"})
        assert len(winners) == 1, f"If-None-Match round {round_}: winners {winners}"
        assert _body(s3_bucket, key) == f"{key}-writer-{winners[0]}".encode()

    client = clients[0]
    etag = client.put_object(Bucket=s3_bucket.name, Key="swap", Body=b"base")["ETag"]
    for round_ in range(2):
        tag = f"swap-{round_}"
        winners = _race(s3_bucket, clients, "swap", tag, {"IfMatch": etag})
        assert len(winners) == 1, f"If-Match round {round_}: winners {winners}"
        assert _body(s3_bucket, "swap") == f"{tag}-writer-{winners[0]}".encode()
        etag = client.head_object(Bucket=s3_bucket.name, Key="swap")["ETag"]


def test_requests_must_be_signed_with_the_secret(s3_server: S3Server, s3_bucket: S3Bucket) -> None:
    """A wrong secret and an anonymous request are refused (403): credentials are real."""
    s3_bucket.client().put_object(Bucket=s3_bucket.name, Key="k", Body=b"v")
    forged = S3Server(
        s3_server.backend,
        endpoint_url=s3_server.endpoint_url,
        access_key=s3_server.access_key,
        secret_key="not-the-secret",
        region=s3_server.region,
    ).client(retries={"total_max_attempts": 1})
    with pytest.raises(forged.exceptions.ClientError) as denied:
        forged.get_object(Bucket=s3_bucket.name, Key="k")
    assert _status(denied.value) == (403, "SignatureDoesNotMatch")
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{s3_server.endpoint_url}/{s3_bucket.name}/k", timeout=10)
    assert anonymous.value.code == 403


def test_data_and_conditions_survive_kill_and_restart(
    s3_server: S3Server, s3_bucket: S3Bucket
) -> None:
    """Objects written before ``kill -9`` are there after a restart on the same data dir,
    and conditional writes still see them."""
    s3_server.require_faults()
    client = s3_bucket.client()
    payload = os.urandom(3 * 1024 * 1024)
    etag = client.put_object(Bucket=s3_bucket.name, Key="big", Body=payload)["ETag"]
    client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"held", IfNoneMatch="*")

    s3_server.kill()
    assert not s3_server.running
    started = time.monotonic()
    s3_server.start()
    restart_seconds = time.monotonic() - started

    client = s3_bucket.client()
    assert _body(s3_bucket, "big") == payload
    assert client.head_object(Bucket=s3_bucket.name, Key="big")["ETag"] == etag
    with pytest.raises(client.exceptions.ClientError) as refused:
        client.put_object(Bucket=s3_bucket.name, Key="lease", Body=b"again", IfNoneMatch="*")
    assert _status(refused.value) == (412, "PreconditionFailed")
    client.put_object(Bucket=s3_bucket.name, Key="big", Body=b"replaced", IfMatch=etag)
    assert _body(s3_bucket, "big") == b"replaced"
    assert restart_seconds < 30, f"restart took {restart_seconds:.1f}s"


def test_pyarrow_s3_filesystem(s3_server: S3Server, s3_bucket: S3Bucket) -> None:
    """pyarrow.fs.S3FileSystem reads, writes, lists, moves and deletes on the server.

    It has no conditional writes: ``open_output_stream`` overwrites an existing object
    without a precondition, so exclusive creation needs an S3 client (boto3) instead.
    """
    from pyarrow import fs

    arrow = s3_server.arrow_filesystem()
    base = f"{s3_bucket.name}/store"
    with arrow.open_output_stream(f"{base}/a/one.bin") as out:
        out.write(b"one")
    with arrow.open_input_stream(f"{base}/a/one.bin") as src:
        assert src.read() == b"one"
    arrow.move(f"{base}/a/one.bin", f"{base}/b/two.bin")  # copy + delete: not atomic
    infos = arrow.get_file_info(fs.FileSelector(base, recursive=True))
    assert sorted(i.path for i in infos if i.type == fs.FileType.File) == [f"{base}/b/two.bin"]

    with arrow.open_output_stream(f"{base}/b/two.bin") as out:  # no If-None-Match: replaced
        out.write(b"overwritten")
    assert _body(s3_bucket, "store/b/two.bin") == b"overwritten"

    # The URI form (what the snapshot store's FileSystem.from_uri gets) reaches the same data.
    from_uri, path = fs.FileSystem.from_uri(s3_bucket.arrow_uri("store/b/two.bin"))
    with from_uri.open_input_stream(path) as src:
        assert src.read() == b"overwritten"
    arrow.delete_dir_contents(base)  # leaves an empty "directory marker" object, store/
    assert [k for k in s3_bucket.keys("store/") if not k.endswith("/")] == []


# --- Spark on s3a:// --------------------------------------------------------------------

ROWS_PER_BATCH = 5


def _streaming_driver(args: dict[str, Any]) -> dict[str, Any]:
    """Run in a child process: a rate-micro-batch -> Parquet query on s3a, two runs."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("epochal-s3a-smoke")
    for key, value in args["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    runs: list[list[int]] = []
    try:
        for _ in range(2):  # the second query restarts from the first one's checkpoint
            query = (
                spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", ROWS_PER_BATCH)
                .option("numPartitions", 1)
                .load()
                .select("value")
                .writeStream.format("parquet")
                .option("path", args["output"])
                .option("checkpointLocation", args["checkpoint"])
                .trigger(processingTime="200 milliseconds")
                .start()
            )
            batches: set[int] = set()
            deadline = time.monotonic() + 120
            while len(batches) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"query made no progress: {query.status}")
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                batches.update(p["batchId"] for p in query.recentProgress if p["numInputRows"])
                time.sleep(0.1)
            query.stop()
            runs.append(sorted(batches))
        values = [row.value for row in spark.read.parquet(args["output"]).collect()]
    finally:
        spark.stop()
    return {"runs": runs, "values": sorted(values)}


@pytest.mark.spark
def test_spark_streaming_checkpoint_on_s3a(s3_server: S3Server, s3_bucket: S3Bucket) -> None:
    """A streaming query keeps its checkpoint and output on s3a:// and restarts from them:
    the second run continues after the first one's batches, the output has every row once."""
    args = {
        "conf": {
            **spark_s3a_conf(s3_server),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "1",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
        "checkpoint": s3_bucket.s3a_url("job/checkpoint"),
        "output": s3_bucket.s3a_url("job/output"),
    }
    result = _run_driver("_streaming_driver", args, timeout=300)

    first, second = result["runs"]
    assert min(first) == 0
    assert min(second) > max(first), f"the restart did not continue: {result['runs']}"
    values = result["values"]
    assert values == list(range(len(values))), "output rows missing or duplicated"
    assert len(values) >= ROWS_PER_BATCH * (max(second) + 1)
    keys = s3_bucket.keys("job/checkpoint/")
    for batch in (*first, *second):
        assert f"job/checkpoint/offsets/{batch}" in keys
        assert f"job/checkpoint/commits/{batch}" in keys
    assert "job/checkpoint/metadata" in keys
    assert any(k.endswith(".parquet") for k in s3_bucket.keys("job/output/"))


def _run_driver(function: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``function(args)`` of this module in a fresh Python process (its own Spark JVM)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        driver_argv("integration.test_smoke_s3", function, args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )
    result = driver_result(proc.stdout)
    assert proc.returncode == 0 and result is not None, (
        f"driver failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return result
