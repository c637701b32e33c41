"""How the suite is spread over two workers (the root ``conftest.py``) and how its time is
reported (``integration.harness.timing``)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.harness import timing

ROOT = Path(__file__).resolve().parents[2]


def _root_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("epochal_root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class _Item:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)


def test_a_module_is_one_unit_and_a_crash_test_of_the_kit_one_of_its_own() -> None:
    conftest = _root_conftest()
    a = _Item("tests/spark/test_plan.py::test_a")
    b = _Item("tests/spark/test_plan.py::test_b")
    case = _Item("tests/x/test_kit.py::Suite::test_crash_and_recover[points]", ["conformance_case"])
    check = _Item("tests/x/test_kit.py::Suite::test_contract[replay]", ["contract_case"])
    units = {conftest.work_unit(i) for i in (a, b)}
    assert units == {"module:tests/spark/test_plan.py"}
    assert conftest.work_unit(case) == f"case:{case.nodeid}"
    assert conftest.work_unit(check) == "module:tests/x/test_kit.py"


def test_each_pyspark_release_is_a_unit_of_its_own() -> None:
    conftest = _root_conftest()
    releases = [
        _Item(f"tests/releases/test_r.py::test_demo[{r}]", ["pyspark_release"])
        for r in ("4.0.5", "4.1.4")
    ]
    assert [conftest.work_unit(i) for i in releases] == [f"release:{i.nodeid}" for i in releases]


def test_units_go_out_longest_first_and_an_unknown_test_counts_one_second() -> None:
    conftest = _root_conftest()
    units = {
        "module:short": [_Item("short::a"), _Item("short::b")],
        "module:long": [_Item("long::a")],
        "module:new": [_Item("new::a"), _Item("new::b"), _Item("new::c")],
    }
    known = {"short::a": 1.0, "short::b": 0.5, "long::a": 90.0}
    assert conftest.order_by_cost(units, known) == ["module:long", "module:new", "module:short"]


def test_the_durations_the_scheduler_reads_are_seconds_by_test() -> None:
    durations = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert durations and all(isinstance(v, float | int) and v >= 0 for v in durations.values())
    assert all("::" in k and "@" not in k.rsplit("]", 1)[-1] for k in durations)


def test_xdist_s_group_suffix_is_taken_off_a_test_s_id() -> None:
    assert timing._plain("t.py::test_x@module:t.py") == "t.py::test_x"
    assert timing._plain("t.py::test_x[a@b]") == "t.py::test_x[a@b]"
    assert timing._plain("t.py::test_x") == "t.py::test_x"
    case = "t.py::S::test_crash[points-eo]"
    assert timing._plain(f"{case}@case:{case}") == case
    assert timing._plain("t.py::test_d[4.0.5]@release:t.py::test_d[4.0.5]") == "t.py::test_d[4.0.5]"


def test_a_jvm_is_counted_for_the_test_whose_process_started_it(tmp_path: Path) -> None:
    program = tmp_path / "Wait.java"  # a JVM that lives until this test has looked
    program.write_text(
        "class Wait { public static void main(String[] a) throws Exception { System.in.read(); } }"
    )
    sampler = timing._Sampler(current="t.py::test_starts_a_jvm")
    stranger = timing._Sampler(current="t.py::other", root=0)  # no process descends from 0
    java = subprocess.Popen(["java", str(program)], stdin=subprocess.PIPE)
    try:
        while java.pid not in sampler.jvms:
            assert java.poll() is None, "the JVM ended before the sampler saw it"
            sampler.sample()
        stranger.sample()
    finally:
        java.communicate(b"\n", timeout=60)
    assert sampler.jvms[java.pid].test == "t.py::test_starts_a_jvm"
    assert java.pid not in stranger.jvms


def test_the_report_names_the_slowest_tests_with_their_phases(tmp_path: Path) -> None:
    times = tmp_path / "times.jsonl"
    test_file = tmp_path / "test_two.py"
    test_file.write_text(
        "import time\n\ndef test_slow():\n    time.sleep(0.3)\n\ndef test_fast():\n    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "integration.harness.timing", str(test_file)],
        cwd=ROOT,
        env={**_env(), "EPOCHAL_TEST_TIMES": str(times), "EPOCHAL_SLOWEST": "5"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert "slowest tests spend it" in result.stdout
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    assert [r["test"].rsplit("::", 1)[-1] for r in rows] == ["test_slow", "test_fast"]
    assert rows[0]["call"] >= 0.3 and rows[0]["setup"] >= 0 and rows[0]["jvms"] == {}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_the_suite_command_keeps_the_longest_first_order() -> None:
    """xdist's loadgroup scheduler puts the groups with the most tests first unless told
    not to: without ``--no-loadscope-reorder`` a one-test unit of minutes (the YARN job,
    the soak) would run last, alone on one core, however the root conftest.py orders it."""
    root = Path(__file__).resolve().parents[2]
    for command in (root / "scripts" / "test.sh", root / "Makefile"):
        for line in command.read_text().splitlines():
            if "--dist loadgroup" in line:
                assert "--no-loadscope-reorder" in line, f"{command.name}: {line.strip()}"


def test_two_workers_run_each_module_on_one_worker(tmp_path: Path) -> None:
    """The grouping holds in a real two-worker run: the hook runs in the workers (they
    collect; xdist has set their ``dist`` option to "no"), and pytest-xdist can put the unit
    into each test's id (pytest 9.2 keeps the id where xdist 3.8 cannot: every test became a
    unit of its own, a module's fixtures were made on both workers and its tests ran at
    the same time as each other). The order is the same hook's (tested above)."""
    for name, count in (("test_few", 2), ("test_many", 4)):
        body = "".join(f"def test_{i}():\n    pass\n\n" for i in range(count))
        (tmp_path / f"{name}.py").write_text(body)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-v"),
            *("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"),
            *("--rootdir", str(tmp_path), str(tmp_path)),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", result.stdout)
    assert len(ran) == 6, result.stdout[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, test in ran:
        workers.setdefault(test.split("::")[0].split("@")[0], set()).add(worker)
    assert len(workers) == 2 and all(len(w) == 1 for w in workers.values()), workers


def test_the_full_lane_names_tests_that_exist_and_only_those() -> None:
    """Each of the root conftest.py's FULL_LANE_ONLY names a test that is there (a renamed
    test would otherwise run in no lane's list and the entry cover nothing), and a pattern
    matches its parameters, not a neighbour's."""
    conftest = _root_conftest()
    for pattern in conftest.FULL_LANE_ONLY:
        path, _, rest = pattern.partition("::")
        names = rest.split("[")[0].split("::")
        # a kit case's test is the kit's (epochal.testing.suite): its class is the module's
        name = names[0].partition("*")[0]  # a pattern's name: the part before its *
        defined = f"class {name}" if len(names) > 1 else f"def {name}("
        assert defined in (ROOT / path).read_text(), pattern
    jdbc = "integration/jdbc/test_jdbc_conformance.py::TestJdbcSinkConformance::"
    assert conftest.full_lane_reason(
        f"{jdbc}test_crash_and_recover[points-idempotent-at-least-once]"
    )
    assert not conftest.full_lane_reason(
        f"{jdbc}test_crash_and_recover[points-idempotent-exactly-once]"
    )
    spark_kafka = "integration/kafka/test_spark_kafka_source.py::TestSparkKafkaSourceIntoKafka::"
    assert conftest.full_lane_reason(
        f"{spark_kafka}test_crash_and_recover[points-transactional-exactly-once]"
    )
    kit = "tests/conformance/test_map_conformance.py::TestMapConformance::test_crash_and_recover"
    assert conftest.full_lane_reason(f"{kit}[points-idempotent-at-least-once]")
    assert not conftest.full_lane_reason(f"{kit}[points-transactional-at-least-once]")


def test_ports_picked_together_are_all_different() -> None:
    from integration.harness._process import free_ports

    for _ in range(20):
        ports = free_ports(16)
        assert len(set(ports)) == 16, ports
