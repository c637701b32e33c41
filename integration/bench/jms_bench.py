"""JMS (STOMP, ActiveMQ Artemis) throughput benchmark: source and sink, epochal exactly-once
and at-least-once, against a bare stomp.py loop on the same broker in the same run.

    python -m integration.bench.jms_bench [--rounds 8] [--records 30000] [--batch 5000]
                                          [--body 100] [--plot jms-bench.png] [--smoke]

``--smoke``: one round of 2 000 messages, 500 per batch, no warm-up (a check that the command
works, not a measurement).

Source: a queue filled with ``records`` persistent messages of ``body`` bytes is read by
* ``stomp.py consume/ack loop``: one subscription, ``ack:client-individual``, an ACK per
  message, the last ACK of each batch with a receipt;
* ``epochal source exactly-once`` / ``at-least-once``: ``epochal.jms`` → Spark → ``noop``.
Sink: a map journal with ``records`` records is written to a queue by
* ``stomp.py send loop``: one STOMP transaction of ``batch`` messages (with ``_AMQ_DUPL_ID``),
  committed with a receipt;
* ``epochal sink exactly-once`` / ``at-least-once``: ``epochal.map`` → Spark → ``epochal.jms``.

Spark variants run in one SparkSession (``local[2]``, ``Trigger.AvailableNow``, the same
per-batch limit). A round runs every variant once, on new queues and checkpoints, in an order
rotated from round to round (after one unmeasured warm-up round); a variant's figure of a round
is its steady rate: the rows of its batches after the first (which pays the query's start-up)
over their summed durations (Spark's ``triggerExecution``). Each ratio is computed within a
round and printed as the median over the rounds with its spread; the plot shows the rates per
round, the per-batch latencies and the ratios per round. The broker comes from the harness.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from epochal_jms.client import BrokerConfig, StompClient
from epochal_jms.testing import MARKER_HEADER, send, url_of

from integration.bench.common import (
    SMOKE_HELP,
    Result,
    bench_session,
    epochal_options,
    machine,
    quantile,
    ratio_lines,
    rotated,
    run_available_now,
    smoke_run,
    write_plot,
)

CONSUME_LOOP = "stomp.py consume/ack loop"
SOURCE_EO = "epochal source exactly-once"
SOURCE_ALO = "epochal source at-least-once"
SEND_LOOP = "stomp.py send loop"
SINK_EO = "epochal sink exactly-once"
SINK_ALO = "epochal sink at-least-once"
WAYS = (CONSUME_LOOP, SOURCE_EO, SOURCE_ALO, SEND_LOOP, SINK_EO, SINK_ALO)
"""Every variant, in the order of the first round (later rounds rotate it)."""
SOURCE_RATIO = "source exactly-once / at-least-once"
SINK_RATIO = "sink exactly-once / at-least-once"
RATIOS = {
    SOURCE_RATIO: (SOURCE_EO, SOURCE_ALO),
    SINK_RATIO: (SINK_EO, SINK_ALO),
    "source at-least-once / consume loop": (SOURCE_ALO, CONSUME_LOOP),
    "sink at-least-once / send loop": (SINK_ALO, SEND_LOOP),
}
TARGETS = {SOURCE_RATIO: 0.9}
"""The issue's target (exactly-once at >= 0.9x at-least-once for the JMS source)."""


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
    """One availableNow query; figures (and Spark's phases, mean ms over the batches after
    the first) from its progress reports."""
    progress = run_available_now(reader, fmt, options, cp)
    batch_ms = [float(p["durationMs"]["triggerExecution"]) for p in progress]
    batch_rows = [int(p["numInputRows"]) for p in progress]
    names = sorted({k for p in progress for k in p["durationMs"]} - {"triggerExecution"})
    measured = progress[1:] or progress
    phases = {k: statistics.mean(float(p["durationMs"].get(k, 0)) for p in measured) for k in names}
    return Result(
        name, sum(batch_rows), sum(batch_ms) / 1000, batch_ms, batch_rows=batch_rows, phases=phases
    )


def drain(config: BrokerConfig, destination: str, timeout: float = 120.0) -> int:
    """Consume (and so delete) every message on a queue, returning how many there were: a
    marker is sent last and everything up to it is taken with automatic acknowledgement.
    Each variant's output is drained, so the broker's heap does not fill over the rounds."""
    marker = uuid.uuid4().hex
    send(config, destination, [""], {MARKER_HEADER: marker})
    client = StompClient(config).connect()
    taken = 0
    try:
        client.conn.subscribe(destination, id="drain", ack="auto")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"draining {destination}: the marker did not come back")
            frame = client.messages.get(timeout=remaining)
            if frame.headers.get(MARKER_HEADER) == marker:
                return taken
            taken += 1
    finally:
        client.close()


@dataclass
class Bench:
    """What every round shares: the broker, the one SparkSession, the sink's input journal."""

    config: BrokerConfig
    spark: Any
    workdir: str
    records: int
    batch: int
    body: int
    map_path: str = ""

    def queue(self, kind: str) -> str:
        """A new queue for one variant of one round."""
        return f"/queue/bench-{kind}-{uuid.uuid4().hex[:8]}"

    def common(self, job: str, guarantee: str) -> dict[str, str]:
        """The epochal options of one query (its own job, so no state is shared)."""
        return epochal_options(f"{self.workdir}/snap", guarantee, job)

    def consume_loop(self, turn: int) -> Result:
        """The bare client, source side."""
        queue = self.queue("loop")
        fill(self.config, queue, self.records, self.body)
        return consume_loop(self.config, queue, self.records, self.batch)

    def send_loop(self, turn: int) -> Result:
        """The bare client, sink side."""
        queue = self.queue("out")
        result = send_loop(self.config, queue, self.records, self.batch)
        drain(self.config, queue)
        return result

    def source(self, guarantee: str, turn: int) -> Result:
        """``epochal.jms`` → Spark → ``noop`` over a queue filled for this run."""
        queue = self.queue("src")
        fill(self.config, queue, self.records, self.body)
        job = f"src-{guarantee}-{turn}"
        reader = (
            self.spark.readStream.format("epochal.jms")
            .options(
                url=url_of(self.config),
                destination=queue,
                maxRecordsPerBatch=str(self.batch),
                **self.common(job, guarantee),
            )
            .load()
            .select("id", "body")
        )
        result = run_query(
            f"epochal source {guarantee}", reader, "noop", {}, f"{self.workdir}/cp-{job}"
        )
        if result.records != self.records:
            result.note = f"read {result.records} of {self.records}"
        return result

    def sink(self, guarantee: str, turn: int) -> Result:
        """``epochal.map`` journal → Spark → ``epochal.jms``; every message must arrive."""
        queue = self.queue("sink")
        job = f"sink-{guarantee}-{turn}"
        common = self.common(job, guarantee)
        reader = (
            self.spark.readStream.format("epochal.map")
            .options(path=self.map_path, map="input", maxRecordsPerBatch=str(self.batch), **common)
            .load()
            .select("key", "value")
        )
        result = run_query(
            f"epochal sink {guarantee}",
            reader,
            "epochal.jms",
            {"url": url_of(self.config), "destination": queue, **common},
            f"{self.workdir}/cp-{job}",
        )
        arrived = drain(self.config, queue)
        if arrived != self.records:
            result.note = f"{arrived} of {self.records} messages on the queue"
        return result

    def runners(self) -> dict[str, Callable[[int], Result]]:
        """Each variant's run, by name."""
        return {
            CONSUME_LOOP: self.consume_loop,
            SOURCE_EO: lambda turn: self.source("exactly-once", turn),
            SOURCE_ALO: lambda turn: self.source("at-least-once", turn),
            SEND_LOOP: self.send_loop,
            SINK_EO: lambda turn: self.sink("exactly-once", turn),
            SINK_ALO: lambda turn: self.sink("at-least-once", turn),
        }


@dataclass
class Rounds:
    """The results of the measured rounds, by round and variant."""

    rounds: list[dict[str, Result]] = field(default_factory=list)

    def rates(self, way: str) -> list[float]:
        """The variant's steady msg/s, one per round."""
        return [r[way].steady for r in self.rounds if way in r]

    def latencies(self, way: str) -> list[float]:
        """Every measured batch's ms (a query's first batch left out)."""
        skip = 0 if way in (CONSUME_LOOP, SEND_LOOP) else 1
        return [ms for r in self.rounds if way in r for ms in r[way].batch_ms[skip:]]

    def ratio(self, top: str, bottom: str) -> list[float]:
        """``top``'s steady rate over ``bottom``'s, within each round."""
        return [r[top].steady / r[bottom].steady for r in self.rounds if r[bottom].steady]

    def phases(self, way: str) -> dict[str, float]:
        """Spark's phases of the variant, mean ms per batch over the rounds."""
        mine = [r[way].phases for r in self.rounds if r[way].phases]
        names = sorted({k for p in mine for k in p})
        return {k: statistics.mean(p.get(k, 0.0) for p in mine) for k in names}


def run_round(bench: Bench, turn: int, log: Callable[[str, Result], None]) -> dict[str, Result]:
    """Every variant once, in the order rotated by ``turn``."""
    runners = bench.runners()
    results = {}
    for way in rotated(WAYS, turn):
        results[way] = runners[way](turn)
        log(way, results[way])
    return results


def report(rounds: Rounds) -> str:
    """The per-variant table and the ratios with their spread."""
    lines = [
        f"{'variant':30} {'steady msg/s (median)':>22} {'IQR':>14} {'batch p50 ms':>13} "
        f"{'batch p99 ms':>13}  notes"
    ]
    for way in WAYS:
        rates, ms = rounds.rates(way), rounds.latencies(way)
        notes = sorted({r[way].note for r in rounds.rounds if r[way].note})
        lines.append(
            f"{way:30} {statistics.median(rates):>22.0f} "
            f"{quantile(rates, 0.25):>6.0f}-{quantile(rates, 0.75):<7.0f} "
            f"{quantile(ms, 0.5):>13.0f} {quantile(ms, 0.99):>13.0f}  {'; '.join(notes)}"
        )
    lines.append("ratios of steady rates, within each round (median, spread):")
    lines += ratio_lines({k: rounds.ratio(*pair) for k, pair in RATIOS.items()}, TARGETS)
    lines.append("Spark's phases, mean ms per batch after the first:")
    for way in (SOURCE_EO, SOURCE_ALO, SINK_EO, SINK_ALO):
        shown = ", ".join(f"{k} {v:.0f}" for k, v in rounds.phases(way).items() if v >= 1)
        lines.append(f"  {way:30} {shown}")
    return "\n".join(lines)


def log_run(turn: str, way: str, result: Result) -> None:
    """One line per run, as it ends (a long benchmark shows that it moves)."""
    print(
        f"  {turn}: {way:30} {result.steady:>8.0f} msg/s steady, "
        f"{len(result.batch_ms)} batches {result.note}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, write the plot."""
    parser = argparse.ArgumentParser(prog="python -m integration.bench.jms_bench")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved measured rounds")
    parser.add_argument("--records", type=int, default=30_000, help="messages per variant")
    parser.add_argument("--batch", type=int, default=5_000, help="messages per batch")
    parser.add_argument("--body", type=int, default=100, help="body bytes")
    parser.add_argument("--plot", default="jms-bench.png", help="PNG to write")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.records, args.batch = 1, 2_000, 500
        smoke_run()
    if min(args.rounds, args.records, args.batch, args.body) < 1:
        parser.error("--rounds, --records, --batch and --body must be at least 1")
    if args.records < 2 * args.batch:
        parser.error("--records must be at least twice --batch (the first batch is not measured)")

    from epochal_map.store import MapStore
    from integration.harness.jms import start_jms

    server = start_jms()
    config = BrokerConfig(server.host, server.port, server.user, server.password)
    workdir = tempfile.mkdtemp(prefix="epochal-jms-bench-")
    try:
        print(f"machine: {machine()}")
        print(f"broker: {server.server_header} at {server.host}:{server.port}")
        print(
            f"{args.records} messages of {args.body} B per variant and round, {args.batch} per "
            f"batch, {args.rounds} rounds after a warm-up round"
        )
        spark = bench_session("epochal-jms-bench", ["jms", "map"])
        bench = Bench(config, spark, workdir, args.records, args.batch, args.body)
        bench.map_path = f"{workdir}/input.sqlite"
        with MapStore(bench.map_path) as store:
            store.append_events("input", [(str(i), "x" * args.body) for i in range(args.records)])
        if not args.smoke:
            run_round(bench, -1, partial(log_run, "warm-up"))
        rounds = Rounds()
        for number in range(args.rounds):
            log = partial(log_run, f"round {number + 1}/{args.rounds}")
            rounds.rounds.append(run_round(bench, number, log))
        spark.stop()
        print(f"load at the end: {machine()}")
        print(report(rounds))
        problem = write_plot(
            args.plot,
            f"JMS (Artemis over STOMP), {args.rounds} rounds of {args.records} messages of "
            f"{args.body} B, {args.batch} per batch\n{machine()}",
            {way: rounds.rates(way) for way in WAYS},
            {way: rounds.latencies(way) for way in WAYS},
            ratios={label: rounds.ratio(*pair) for label, pair in RATIOS.items()},
            targets=TARGETS,
            rate_label="steady msg/s per round",
        )
        print(problem or f"plot: {args.plot}")
    finally:
        server.backend.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
