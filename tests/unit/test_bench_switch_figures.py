"""The switch bench's throughput windows (`keyshift.bench.switch.events_in`, `window_throughput`)
on hand-made progress records: pure arithmetic over batch spans."""

from __future__ import annotations

import pytest

from keyshift.bench.switch import caught_up_ms, events_in, window_throughput


def batch(start_s: float, seconds: float, rows: int) -> dict:
    return {"timestamp_ms": start_s * 1000, "batch_duration_ms": seconds * 1000, "input_rows": rows}


def test_events_in_spreads_a_batch_over_its_span():
    progress = [batch(0, 2, 200), batch(2, 2, 400)]
    assert events_in(progress, 0, 4000) == pytest.approx(600)
    assert events_in(progress, 1000, 3000) == pytest.approx(100 + 200)  # half of each batch
    assert events_in(progress, 4000, 9000) == 0
    assert events_in([batch(0, 1, 0), {"timestamp_ms": 0, "batch_duration_ms": None, "input_rows": 50}], 0, 1000) == 0


def steady(start_s: float, end_s: float, rate: float, every_s: float = 2.0) -> list[dict]:
    """Batches of `every_s` from start to end at `rate` events/s."""
    out, t = [], start_s
    while t + every_s <= end_s + 1e-9:
        out.append(batch(t, every_s, int(rate * every_s)))
        t += every_s
    return out


def test_a_pause_made_up_within_the_window_costs_nothing():
    # 3,000 ev/s; a 4 s pause at 100 s; the first batch after it holds the 12,000 events that arrived meanwhile,
    # then the job is back at the feed's rate: the minute after equals the minute before
    progress = [batch(0, 10, 1000)] + steady(10, 100, 3000) + [batch(102, 2, 3000 * 4)] + steady(104, 250, 3000)
    found = window_throughput(progress, [(100_000, 104_000)], 0)
    assert found["window_seconds"] == 60.0
    assert found["before_events_per_s"] == pytest.approx(3000, rel=1e-6)
    assert found["after_events_per_s"] == pytest.approx(3000, rel=1e-6)
    assert found["after_over_before"] == pytest.approx(1.0)


def test_a_slower_job_after_the_switch_shows_in_the_ratio():
    progress = steady(0, 100, 3000) + steady(104, 250, 2400)
    found = window_throughput(progress, [(100_000, 104_000)], 0)
    assert found["after_over_before"] == pytest.approx(2400 * 56 / 60 / 3000, rel=1e-3)  # 4 s without batches, then 2,400 ev/s


def test_windows_stop_short_of_other_switches_and_the_runs_start():
    progress = [batch(0, 10, 1000)] + steady(10, 300, 3000)
    pauses = [(30_000, 33_000), (50_000, 53_000), (200_000, 203_000)]
    first, second, third = (window_throughput(progress, pauses, i) for i in range(3))
    assert first["window_seconds"] == 20.0  # from the end of the run's first batch (10 s) to the pause at 30 s
    assert second["window_seconds"] == 17.0  # from the first pause's end (33 s)
    assert third["window_seconds"] == 60.0
    assert window_throughput([], pauses, 0)["after_over_before"] is None


def test_no_window_holds_the_start_ups_backlog():
    # the query starts late: 20,000-record batches (the cap) until it caught up at 40 s
    progress = [batch(0, 20, 20_000), batch(20, 10, 20_000), batch(30, 10, 20_000), batch(40, 2, 6000)] + steady(42, 300, 3000)
    for record in progress:
        record["segment"] = 0
    assert caught_up_ms(progress) == 42_000
    found = window_throughput(progress, [(90_000, 93_000)], 0, earliest_ms=caught_up_ms(progress))
    assert found["window_seconds"] == 48.0 and found["before_events_per_s"] == pytest.approx(3000)
    assert caught_up_ms([]) is None
