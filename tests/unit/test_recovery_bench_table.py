"""The recovery benchmark's table: every kind measured, and the plain-PySpark peer's row."""

from __future__ import annotations

from integration.bench.recovery import FLOOR_KIND, Sample, spread, table


def test_table_has_the_median_of_each_kind_and_size_and_the_peer_row() -> None:
    samples = [
        Sample("cold", 1, 13.0, 18.0),
        Sample("cold", 1, 12.0, 17.0),
        Sample("cold", 1, 14.0, 19.0),
        Sample("standby", 100, 2.5, 3.0),
    ]
    lines = table(samples, floor=[10.4, 10.9, 10.6]).splitlines()

    assert (
        lines[0] == "| recovery | 1 MB: first batch / caught up | 100 MB: first batch / caught up |"
    )
    assert "| cold | 13.0 s / 18.0 s (n=3) | - |" in lines
    assert "| standby | - | 2.5 s / 3.0 s (n=1) |" in lines
    assert "| in-place | - | - |" in lines
    peer = "10.6 s / - (n=3)"
    assert lines[-1] == f"| {FLOOR_KIND} | {peer} | {peer} |"


def test_table_without_the_peer_has_no_peer_row() -> None:
    assert FLOOR_KIND not in table([Sample("in-place", 1, 1.7, 1.8)], floor=[])


def test_kills_with_state_files_copied_get_rows_of_their_own() -> None:
    """``--state-files links,copies``: the same kills side by side, copies in rows below."""
    samples = [
        Sample("in-place", 1000, 2.2, 2.3),
        Sample("in-place", 1000, 5.3, 5.4, state_files="copies"),
        Sample("in-place", 1000, 5.5, 5.6, state_files="copies"),
    ]
    lines = table(samples).splitlines()
    assert "| in-place | 2.2 s / 2.3 s (n=1) |" in lines
    assert "| in-place, state files copied | 5.4 s / 5.5 s (n=2) |" in lines
    assert not any(line.startswith("| cold, state files copied") for line in lines)


def test_the_demo_jobs_peer_is_a_row_in_each_of_its_conditions() -> None:
    """``--workloads demo``: the kills and the peer side by side, each condition in its rows;
    no counts job measured, so no empty rows of its default conditions."""
    samples = [
        Sample("standby", 0, 7.9, None, workload="demo", kill_after=30.0, standby_ready=False),
        Sample("standby", 0, 7.0, None, workload="demo", kill_after=30.0, standby_ready=True),
        Sample(FLOOR_KIND, 0, 12.8, None, workload="demo"),
        Sample(FLOOR_KIND, 0, 19.5, None, workload="demo", neighbour=True),
    ]
    lines = table(samples).splitlines()
    assert lines[2:] == [
        "| standby, demo job, killed 30 s after start | 7.5 s / - (n=2) |",
        f"| {FLOOR_KIND}, demo job | 12.8 s / - (n=1) |",
        f"| {FLOOR_KIND}, demo job, second Spark job running | 19.5 s / - (n=1) |",
    ]
    assert "7.90 (standby warming), 7.00" in spread(samples)
