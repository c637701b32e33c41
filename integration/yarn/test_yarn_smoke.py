"""Smoke test: YARN restarts a Spark driver (cluster mode) itself, and replaces a lost node.

One application (``blocking_app.py``, ``spark.yarn.maxAppAttempts=3``) runs a tiny job in
each attempt, leaves a marker ``attempt-<n>`` naming its driver's pids, and blocks until
the test writes ``stop``:

(a) the test SIGKILLs attempt 1's AM JVM (the driver): YARN starts attempt 2 by itself;
(b) the test SIGSTOPs the NodeManager hosting attempt 2's AM: the RM declares the node
    LOST and starts attempt 3 on the other node while attempt 2's driver still runs (two
    live drivers). The old driver learns at its next heartbeat to the RM that its attempt
    is gone, and exits; the test then SIGCONTs the NodeManager.

Then ``stop``: the application finishes. The durations of the steps are printed (``-s``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from integration.harness import HarnessError, wait_until
from integration.harness.yarn import FINAL_STATES, YarnCluster, process_alive

pytestmark = [pytest.mark.integration, pytest.mark.spark]

APP = Path(__file__).with_name("blocking_app.py")
STEP_TIMEOUT = 120.0


def _marker(markers: Path, attempt: int, cluster: YarnCluster, app_id: str) -> dict[str, str]:
    """Wait for attempt ``attempt``'s marker; return its fields (attempt, pid, jvm, ...)."""
    path = markers / f"attempt-{attempt}"

    def found() -> dict[str, str] | None:
        if not path.exists():
            if cluster.app_state(app_id) in FINAL_STATES:  # a HarnessError ends the wait
                raise HarnessError(f"{app_id} ended first:\n{cluster.logs(app_id)}")
            return None
        words = path.read_text().split()
        return dict(zip(words[::2], words[1::2], strict=True))

    return wait_until(found, STEP_TIMEOUT, path.name, on_timeout=lambda: cluster.logs(app_id))


def _watch_exits(pids: list[int], seconds: float) -> dict[int, float]:
    """Record (wall clock) when each process ends, polling every 20 ms in a thread."""
    ended: dict[int, float] = {}

    def watch() -> None:
        deadline = time.monotonic() + seconds
        while len(ended) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in ended and not process_alive(pid):
                    ended[pid] = time.time()
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return ended


def test_driver_restarted_by_yarn_and_lost_node_replaced(
    yarn_cluster: YarnCluster, tmp_path: Path
) -> None:
    """Kill the driver, then lose its node: YARN runs attempts 2 and 3 by itself."""
    cluster = yarn_cluster
    took: dict[str, float] = {}
    started = time.monotonic()
    proc = cluster.submit(APP, [str(tmp_path), "600"], conf={"spark.yarn.maxAppAttempts": "3"})
    app_id = cluster.app_id_of(proc)
    try:
        first = _marker(tmp_path, 1, cluster, app_id)
        took["submit -> attempt 1 ran its job"] = time.monotonic() - started
        assert first["sum"] == "9900"

        # (a) SIGKILL the driver (the AM's JVM): YARN starts attempt 2 by itself.
        mark = time.monotonic()
        assert cluster.kill_am_driver(app_id) == int(first["jvm"])
        cluster.wait_for_attempt(app_id, 2, STEP_TIMEOUT)
        took["driver killed -> attempt 2 allocated"] = time.monotonic() - mark
        second = _marker(tmp_path, 2, cluster, app_id)
        took["driver killed -> attempt 2 ran its job"] = time.monotonic() - mark
        assert not process_alive(int(first["pid"])), "attempt 1's Python driver survived"

        # (b) SIGSTOP attempt 2's NodeManager: the RM declares it LOST, starts attempt 3.
        node = cluster.am_node(app_id)
        old = [int(second["jvm"]), int(second["pid"])]
        ended = _watch_exits(old, 2 * STEP_TIMEOUT)
        mark = time.monotonic()
        cluster.pause_node(node)
        try:
            wait_until(lambda: cluster.node_state(node) == "LOST", STEP_TIMEOUT, "node LOST")
            took["NM stopped -> RM: LOST"] = time.monotonic() - mark
            third = cluster.wait_for_attempt(app_id, 3, STEP_TIMEOUT)
            took["NM stopped -> attempt 3 allocated"] = time.monotonic() - mark
            assert cluster.node_index(third["nodeId"]) != node, "attempt 3 on the lost node"
            # Two live drivers: the RM started attempt 3 before attempt 2's driver ended.
            # It ends by itself, its NM still stopped: its next call to the RM fails.
            wait_until(lambda: len(ended) == len(old), STEP_TIMEOUT, "attempt 2's driver to end")
            third_started = int(third["startTime"]) / 1000
            assert min(ended.values()) > third_started, (ended, third_started)
            took["attempt 3 started -> attempt 2's driver ended"] = (
                max(ended.values()) - third_started
            )
            stderr = cluster.nm_log_dirs[node] / app_id / second["container"] / "stderr"
            reason = next(
                (line for line in stderr.read_text().splitlines() if "Final app status" in line),
                "<no final status logged>",
            )
            _marker(tmp_path, 3, cluster, app_id)
            took["NM stopped -> attempt 3 ran its job"] = time.monotonic() - mark
        finally:
            cluster.resume_node(node)
        mark = time.monotonic()
        wait_until(lambda: cluster.node_state(node) == "RUNNING", STEP_TIMEOUT, "node back")
        took["NM resumed -> RM: RUNNING"] = time.monotonic() - mark
        (tmp_path / "stop").touch()
        mark = time.monotonic()
        wait_until(lambda: cluster.app_state(app_id) == "FINISHED", STEP_TIMEOUT, "app FINISHED")
        took["stop -> app FINISHED"] = time.monotonic() - mark
        assert cluster.app(app_id)["finalStatus"] == "SUCCEEDED", cluster.logs(app_id)
        assert [int(a["id"]) for a in cluster.attempts(app_id)] == [1, 2, 3]
    finally:
        if cluster.app_state(app_id) not in FINAL_STATES:
            cluster.kill_app(app_id)
    took["total"] = time.monotonic() - started
    for step, seconds in took.items():
        print(f"{step:48} {seconds:6.1f} s")
    print(f"attempt 2's driver: {reason}")
