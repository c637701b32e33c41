"""pytest plugin: where each test spends its time (``-p integration.harness.timing``).

For every test it records its setup, call and teardown time, how busy the machine's cores
were meanwhile (``/proc/stat``: busy core-seconds against the wall time of all cores), and
the JVMs that started while it ran (found by a sampling thread that reads ``/proc`` every
half second), by kind (Spark drivers, executors, servers) with the CPU seconds they used.
At the end it prints the slowest tests (``EPOCHAL_SLOWEST``, 100) with those figures, so
that a slow test tells at a glance whether it waits (idle cores), starts JVMs, or works;
with ``EPOCHAL_TEST_TIMES=path`` it also writes one JSON line per test there.

Where the tests are reported (the xdist controller, or the one process) it also says each
failure the moment it happens, and on SIGTERM (a CI run past its time) which tests were
running and for how long before pytest's own summary of what failed: a run that is stopped
still tells what went wrong. With ``EPOCHAL_TEST_BUDGET=seconds`` it sends itself that
SIGTERM once the session has run that long (CI sets it below the time CI allows), so an
overrun ends in that report instead of a kill from outside that prints nothing.

Linux only (it reads ``/proc``); elsewhere it records wall times alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: How often the sampler looks for new JVMs (seconds).
SAMPLE_EVERY = 0.5
#: The kinds of JVM, by a piece of their command line (first match wins).
JVM_KINDS = (
    ("CoarseGrainedExecutorBackend", "executor"),
    ("org.apache.spark.deploy.SparkSubmit", "driver"),
    ("org.apache.spark.sql.connect", "connect"),
    ("org.apache.spark.deploy.master", "spark-master"),
    ("org.apache.spark.deploy.worker", "spark-worker"),
    ("kafka.Kafka", "kafka"),
    ("artemis", "artemis"),
    ("yarn", "yarn"),
    ("hdfs", "hdfs"),
)
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CORES = os.cpu_count() or 1


def _busy_seconds() -> float | None:
    """Busy core-seconds of the whole machine since boot (None off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / TICKS


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _descends_from(pid: int, root: int) -> bool:
    """Whether ``root`` is among the ancestors of ``pid`` (this test run started it)."""
    while pid > 1:
        pid = _parent(pid)
        if pid == root:
            return True
    return False


_UNIT_SUFFIX = re.compile(r"@(?:module|case|release):.*$")
"""The ``@<unit>`` pytest-xdist's ``loadgroup`` appends to a test's id: the root
conftest.py's units, which can end in a parameter's ``]`` themselves."""


def _plain(nodeid: str) -> str:
    """A test's id without the ``@group`` that pytest-xdist's ``loadgroup`` appends."""
    plain = _UNIT_SUFFIX.sub("", nodeid)
    if plain != nodeid:
        return plain
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def _jvm_kind(cmdline: str) -> str:
    for needle, kind in JVM_KINDS:
        if needle in cmdline:
            return kind
    return "other"


@dataclass
class _Jvm:
    kind: str
    test: str
    cpu: float = 0.0


@dataclass
class _Sampler:
    """Finds JVMs as they start and keeps their CPU time up to date."""

    current: str = "(between tests)"
    root: int = field(default_factory=os.getpid)
    jvms: dict[int, _Jvm] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        if os.path.isdir("/proc"):
            threading.Thread(target=self._loop, name="epochal-test-timing", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self.sample()

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    stat = fh.read()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                if comm != "java" and pid not in self.jvms:
                    continue
                rest = stat[stat.rindex(")") + 2 :].split()
                if pid not in self.jvms and not _descends_from(pid, self.root):
                    continue  # another test run's, or a session's of its own
                cpu = (int(rest[11]) + int(rest[12])) / TICKS  # utime + stime
                jvm = self.jvms.get(pid)
                if jvm is None:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
                    jvm = self.jvms[pid] = _Jvm(_jvm_kind(cmdline), self.current)
                jvm.cpu = cpu
            except (OSError, ValueError, IndexError):
                continue


@dataclass
class _Times:
    nodeid: str
    phases: dict[str, float] = field(default_factory=dict)
    busy: float = 0.0

    @property
    def wall(self) -> float:
        return sum(self.phases.values())


class TimingPlugin:
    """Collects the figures where tests run; prints the slowest tests at the end of the
    session. Under pytest-xdist each worker measures its own tests and hands its rows to the
    controller, which prints them all."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.sampler = _Sampler()
        self.times: dict[str, _Times] = {}
        self.merged: list[dict[str, Any]] = []  # rows from xdist workers (the controller)
        self.runs_tests = not _is_xdist_controller(config)
        if self.runs_tests:
            self.sampler.start()
        self.reports = not hasattr(config, "workerinput")  # where results are reported
        self.running: dict[str, float] = {}  # test -> when it started (monotonic)
        if self.reports and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._stopped)
            budget = float(os.environ.get("EPOCHAL_TEST_BUDGET") or 0)
            if budget > 0:
                timer = threading.Timer(budget, self._over_budget, args=(budget,))
                timer.daemon = True
                timer.start()

    def _over_budget(self, budget: float) -> None:
        self._write(f"\n=== the suite ran past EPOCHAL_TEST_BUDGET ({budget:.0f} s)")
        os.kill(os.getpid(), signal.SIGTERM)

    def _write(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)

    def _stopped(self, signum: int, frame: Any) -> None:
        """SIGTERM: say what was running, then stop as Ctrl-C would (pytest then prints its
        summary of the failures so far)."""
        now = time.monotonic()
        self._write("=== stopped by SIGTERM; running:")
        for nodeid, started in sorted(self.running.items(), key=lambda kv: kv[1]):
            self._write(f"  {now - started:7.0f} s  {nodeid}")
        raise KeyboardInterrupt

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        if self.reports:
            self.running[_plain(nodeid)] = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.reports:
            return
        nodeid = _plain(report.nodeid)
        if report.failed:
            started = self.running.get(nodeid, time.monotonic())
            crash = getattr(report.longrepr, "reprcrash", None)
            why = crash.message.splitlines()[0][:300] if crash and crash.message else ""
            self._write(
                f"\nFAILED ({report.when}, {time.monotonic() - started:.0f} s) {nodeid}: {why}"
            )
        if report.when == "teardown":
            self.running.pop(nodeid, None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, None]:
        nodeid = _plain(item.nodeid)
        self.sampler.current = nodeid
        times = self.times.setdefault(nodeid, _Times(nodeid))
        busy = _busy_seconds()
        yield
        after = _busy_seconds()
        if busy is not None and after is not None:
            times.busy = after - busy
        self.sampler.current = "(between tests)"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, Any, None]:
        yield
        nodeid = _plain(item.nodeid)
        self.times.setdefault(nodeid, _Times(nodeid)).phases[call.when] = call.stop - call.start

    def rows(self) -> list[dict[str, Any]]:
        """One row per test: wall time by phase, cores busy, JVMs started and their CPU."""
        self.sampler.sample()
        jvms: dict[str, list[_Jvm]] = {}
        for jvm in self.sampler.jvms.values():
            jvms.setdefault(jvm.test, []).append(jvm)
        out = []
        for times in self.times.values():
            started = jvms.get(times.nodeid, [])
            kinds: dict[str, int] = {}
            for jvm in started:
                kinds[jvm.kind] = kinds.get(jvm.kind, 0) + 1
            wall = times.wall
            out.append(
                {
                    "test": times.nodeid,
                    "wall": round(wall, 2),
                    "setup": round(times.phases.get("setup", 0.0), 2),
                    "call": round(times.phases.get("call", 0.0), 2),
                    "teardown": round(times.phases.get("teardown", 0.0), 2),
                    "busy_cores": round(times.busy / wall, 2) if wall > 0 else 0.0,
                    "idle_core_s": round(max(0.0, CORES * wall - times.busy), 1),
                    "jvms": kinds,
                    "jvm_cpu_s": round(sum(j.cpu for j in started), 1),
                    "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                }
            )
        return out

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.sampler.stop()
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller prints
            workeroutput["epochal_test_times"] = self.rows()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """The xdist controller: a worker's rows."""
        self.merged.extend(getattr(node, "workeroutput", {}).get("epochal_test_times", []))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        rows = self.merged + (self.rows() if self.runs_tests else [])
        if not rows:
            return
        rows.sort(key=lambda row: -row["wall"])
        path = os.environ.get("EPOCHAL_TEST_TIMES")
        if path:
            with open(path, "w") as fh:
                for row in rows:
                    fh.write(json.dumps(row) + "\n")
        count = int(os.environ.get("EPOCHAL_SLOWEST", "100"))
        write = terminalreporter.write_line
        terminalreporter.section(f"where the {min(count, len(rows))} slowest tests spend it")
        write(
            f"{'wall s':>7} {'setup':>6} {'call':>6} {'cores':>5} {'idle':>6} "
            f"{'JVMs (kind x n)':<28} {'JVM cpu':>7} {'on':>3}  test   [cores: the machine's "
            f"busy cores of {CORES}; idle: its unused core-seconds]"
        )
        for row in rows[:count]:
            kinds = " ".join(f"{k}x{n}" for k, n in sorted(row["jvms"].items())) or "-"
            write(
                f"{row['wall']:7.1f} {row['setup']:6.1f} {row['call']:6.1f} "
                f"{row['busy_cores']:5.2f} {row['idle_core_s']:6.0f} {kinds:<28} "
                f"{row['jvm_cpu_s']:7.0f} {row['worker'][-3:]:>3}  {row['test']}"
            )
        total = sum(r["wall"] for r in rows)
        jvm_count = sum(sum(r["jvms"].values()) for r in rows)
        jvm_cpu = sum(r["jvm_cpu_s"] for r in rows)
        write(
            f"all {len(rows)} tests: {total:.0f} s of test time, {jvm_count} JVMs started "
            f"using {jvm_cpu:.0f} CPU seconds"
        )


def _is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to pytest-xdist workers instead of running them."""
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin (once, whatever loaded this module)."""
    if not config.pluginmanager.has_plugin("epochal-test-timing"):
        config.pluginmanager.register(TimingPlugin(config), "epochal-test-timing")


def main(argv: list[str] | None = None) -> int:
    """``python -m integration.harness.timing --update TIMES``: rewrite the durations the
    suite's scheduler orders its units by (``tests/durations.json``, see the root
    ``conftest.py``) from a whole run's ``EPOCHAL_TEST_TIMES`` file."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m integration.harness.timing")
    parser.add_argument("--update", metavar="TIMES", required=True, help="a run's JSON lines")
    args = parser.parse_args(argv)
    target = Path(__file__).resolve().parents[2] / "tests" / "durations.json"
    rows = [json.loads(line) for line in Path(args.update).read_text().splitlines() if line]
    durations = {row["test"]: round(row["wall"], 1) for row in rows}
    target.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
    print(f"{target}: {len(durations)} tests, {sum(durations.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
