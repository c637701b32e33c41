"""JMS (STOMP, ActiveMQ Artemis) throughput benchmark: source and sink, epochal exactly-once
and at-least-once, against a bare stomp.py loop on the same broker in the same run.

    python -m integration.bench.jms_bench [--records 20000] [--batch 5000] [--body 100]

Source: a queue filled with ``records`` persistent messages of ``body`` bytes is read by
* ``stomp.py consume/ack loop``: one subscription, ``ack:client-individual``, an ACK per
  message, the last ACK of each batch with a receipt;
* ``epochal source exactly-once`` / ``at-least-once``: ``epochal.jms`` → Spark → ``noop``.
Sink: a map journal with ``records`` records is written to a queue by
* ``stomp.py send loop``: one STOMP transaction of ``batch`` messages (with ``_AMQ_DUPL_ID``),
  committed with a receipt;
* ``epochal sink exactly-once`` / ``at-least-once``: ``epochal.map`` → Spark → ``epochal.jms``.

Spark variants run in one SparkSession (``local[2]``, ``Trigger.AvailableNow``, the same
per-batch limit); messages/s counts the rows of the batches over their summed durations (the
query start-up excluded). The broker comes from the harness.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from epochal_jms.client import BrokerConfig, StompClient
from epochal_jms.testing import browse, url_of

from integration.bench.common import Result, bench_session, run_available_now
from integration.bench.kafka_bench import machine


def fill(config: BrokerConfig, destination: str, records: int, body: int) -> None:
    """``records`` persistent messages (body = the id, padded), confirmed at the end."""
    client = StompClient(config).connect()
    pad = "x" * max(0, body - 10)
    try:
        receipt = client.receipt()
        for i in range(records):
            extra = {"receipt": receipt} if i == records - 1 else {}
            client.conn.send(destination, f"{i:010d}{pad}", headers={"persistent": "true", **extra})
        client.wait_receipt(receipt, "filling the queue", timeout=300)
    finally:
        client.close()


def consume_loop(config: BrokerConfig, destination: str, records: int, batch: int) -> Result:
    """stomp.py: receive, ACK each message, a receipt on the last ACK of each batch."""
    client = StompClient(config).connect()
    client.conn.subscribe(
        destination,
        id="bench",
        ack="client-individual",
        headers={"consumer-window-size": str(2 * batch * 300)},
    )
    done, latencies = 0, []
    started = time.perf_counter()
    batch_start = started
    try:
        while done < records:
            frame = client.messages.get(timeout=60)
            done += 1
            last = done % batch == 0 or done == records
            receipt = client.receipt() if last else None
            client.conn.ack(frame.headers["ack"], receipt=receipt)
            if receipt:
                client.wait_receipt(receipt, "ack")
                now = time.perf_counter()
                latencies.append((now - batch_start) * 1000)
                batch_start = now
        return Result("stomp.py consume/ack loop", done, time.perf_counter() - started, latencies)
    finally:
        client.close()


def send_loop(config: BrokerConfig, destination: str, records: int, batch: int) -> Result:
    """stomp.py: one transaction of ``batch`` messages, committed with a receipt."""
    client = StompClient(config).connect()
    body = "x" * 100
    latencies = []
    started = time.perf_counter()
    try:
        for low in range(0, records, batch):
            begun = time.perf_counter()
            txn = client.conn.begin()
            for i in range(low, min(records, low + batch)):
                headers = {"persistent": "true", "_AMQ_DUPL_ID": f"loop.{uuid.uuid4().hex}.{i}"}
                client.conn.send(destination, body, headers=headers, transaction=txn)
            receipt = client.receipt()
            client.conn.commit(txn, headers={"receipt": receipt})
            client.wait_receipt(receipt, "commit")
            latencies.append((time.perf_counter() - begun) * 1000)
        return Result("stomp.py send loop", records, time.perf_counter() - started, latencies)
    finally:
        client.close()


def run_query(name: str, reader: Any, fmt: str, options: dict[str, str], cp: str) -> Result:
    """One availableNow query; figures from its progress reports."""
    progress = run_available_now(reader, fmt, options, cp)
    rows = sum(p["numInputRows"] for p in progress)
    batch_ms = [float(p["durationMs"]["triggerExecution"]) for p in progress]
    batch_rows = [int(p["numInputRows"]) for p in progress]
    return Result(name, rows, sum(batch_ms) / 1000, batch_ms, batch_rows=batch_rows)


def count(config: BrokerConfig, destination: str) -> int:
    """Messages on a queue (browsed, left there)."""
    return len(browse(config, destination, timeout=60))


def spark_variants(
    config: BrokerConfig, records: int, batch: int, body: int, workdir: str
) -> list[Result]:
    """The four epochal variants in one session."""
    from epochal_map.store import MapStore

    spark = bench_session("epochal-jms-bench", ["jms", "map"])
    url = url_of(config)
    results = []
    source_queues: list[tuple[Result, str]] = []
    for guarantee in ("exactly-once", "at-least-once"):
        queue = f"/queue/bench-src-{uuid.uuid4().hex[:8]}"
        fill(config, queue, records, body)
        common = {
            "epochal.snapshotDir": f"{workdir}/snap",
            "epochal.guarantee": guarantee,
            "epochal.job": f"bench-src-{guarantee}",
        }
        reader = (
            spark.readStream.format("epochal.jms")
            .options(url=url, destination=queue, maxRecordsPerBatch=str(batch), **common)
            .load()
            .select("id", "body")
        )
        result = run_query(
            f"epochal source {guarantee}", reader, "noop", {}, f"{workdir}/cp-src-{guarantee}"
        )
        results.append(result)
        source_queues.append((result, queue))
    map_path = f"{workdir}/input.sqlite"
    with MapStore(map_path) as store:
        store.append_events("input", [(str(i), "x" * body) for i in range(records)])
    for guarantee in ("exactly-once", "at-least-once"):
        queue = f"/queue/bench-sink-{uuid.uuid4().hex[:8]}"
        common = {
            "epochal.snapshotDir": f"{workdir}/snap",
            "epochal.guarantee": guarantee,
            "epochal.job": f"bench-sink-{guarantee}",
        }
        reader = (
            spark.readStream.format("epochal.map")
            .options(path=map_path, map="input", maxRecordsPerBatch=str(batch), **common)
            .load()
            .select("key", "value")
        )
        result = run_query(
            f"epochal sink {guarantee}",
            reader,
            "epochal.jms",
            {"url": url, "destination": queue, **common},
            f"{workdir}/cp-sink-{guarantee}",
        )
        result.note = f"{count(config, queue)} messages on the queue"
        results.append(result)
    spark.stop()  # the reader's stop() (last acks) does not run here: see docs/performance/jms.md
    for result, queue in source_queues:
        result.note = f"{count(config, queue)} left on the queue"
    return results


def table(results: list[Result]) -> str:
    """The figures, with the ratio to the bare loop of the same direction."""
    loops = {"source": "stomp.py consume/ack loop", "sink": "stomp.py send loop"}
    by_name = {r.name: r for r in results}
    lines = [
        f"{'variant':30} {'messages':>9} {'msg/s':>9} {'steady/s':>9} {'batches':>8} "
        f"{'batch p50 ms':>13} {'batch max ms':>13} {'vs loop':>8}  note"
    ]
    for r in results:
        side = "source" if "source" in r.name or "consume" in r.name else "sink"
        loop = by_name.get(loops[side])
        p50 = statistics.median(r.batch_ms) if r.batch_ms else 0.0
        worst = max(r.batch_ms) if r.batch_ms else 0.0
        ratio = f"{r.rate / loop.rate:.2f}x" if loop and loop.rate else "-"
        lines.append(
            f"{r.name:30} {r.records:>9} {r.rate:>9.0f} {r.steady:>9.0f} {len(r.batch_ms):>8} "
            f"{p50:>13.0f} {worst:>13.0f} {ratio:>8}  {r.note}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.jms_bench")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=5_000, help="messages per batch")
    parser.add_argument("--body", type=int, default=100, help="body bytes")
    args = parser.parse_args(argv)

    from integration.harness.jms import start_jms

    server = start_jms()
    config = BrokerConfig(server.host, server.port, server.user, server.password)
    workdir = tempfile.mkdtemp(prefix="epochal-jms-bench-")
    try:
        print(f"machine: {machine()}")
        print(f"broker: {server.server_header} at {server.host}:{server.port}")
        print(f"{args.records} messages of {args.body} B, {args.batch} per batch")
        queue = f"/queue/bench-loop-{uuid.uuid4().hex[:8]}"
        fill(config, queue, args.records, args.body)
        results = [consume_loop(config, queue, args.records, args.batch)]
        results.append(
            send_loop(config, f"/queue/bench-out-{uuid.uuid4().hex[:8]}", args.records, args.batch)
        )
        results += spark_variants(config, args.records, args.batch, args.body, workdir)
        order = ["consume", "source", "send", "sink"]
        results.sort(key=lambda r: next(i for i, k in enumerate(order) if k in r.name))
        print(table(results))
    finally:
        server.backend.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
