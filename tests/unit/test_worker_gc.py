"""A Python worker's collector (epochal.spark.worker_gc): what the worker holds is frozen at
an epochal task's start whenever modules were imported since the last freeze, so PySpark's
collection after each task walks only what was made since; off with the environment switch.
Each case runs in a fresh interpreter (a freeze cannot be undone in this one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc, json, sys
    from epochal.spark import worker_gc

    frozen = [worker_gc.settle_imports()]
    after_first = gc.get_freeze_count()
    frozen.append(worker_gc.settle_imports())  # nothing imported since: no freeze
    import decimal, fractions, statistics  # a later task imports more
    frozen.append(worker_gc.settle_imports())
    print(json.dumps({"frozen": frozen, "after_first": after_first,
                      "after_all": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
    """
)


def _run(env_value: str | None) -> dict[str, object]:
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "EPOCHAL_WORKER_GC_FREEZE"}
    if env_value is not None:
        env["EPOCHAL_WORKER_GC_FREEZE"] = env_value
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True
    )
    return dict(json.loads(done.stdout))


def test_a_worker_freezes_what_it_imported_and_again_after_new_imports() -> None:
    seen = _run(None)
    assert seen["frozen"] == [True, False, True]
    assert int(seen["after_first"]) > 10_000  # the interpreter's and epochal's modules
    assert int(seen["after_all"]) > int(seen["after_first"])
    assert int(seen["tracked"]) < 1_000, "a full collection still walks what was imported"


@pytest.mark.parametrize("value", ["0", " 0 "])
def test_the_environment_switch_leaves_the_collector_alone(value: str) -> None:
    seen = _run(value)
    assert seen["frozen"] == [False, False, False]
    assert seen["after_all"] == 0
