"""The throughput bench's pure parts: configurations, ratios and goals from rows."""

from __future__ import annotations

import pytest

from keyshift.bench.throughput import Config, parse_configs, summarize
from keyshift.errors import ConfigurationError


def test_configs_parse_and_bad_ones_are_refused():
    assert parse_configs(["8:hash", "32:hot_split"]) == (Config(8, "hash"), Config(32, "hot_split"))
    for bad in ("8", "hash:8", "0:hash", "8:weight"):
        with pytest.raises(ConfigurationError):
            parse_configs([bad])


def _row(job, partitions, strategy, whole, steady, first=5.0, rss=1e9):
    return {"job": job, "partitions": partitions, "strategy": strategy if job == "keyshift" else "kafka_default",
            "events_per_second": whole, "steady_events_per_second": steady, "first_batch_seconds": first,
            "driver_peak_rss_bytes": rss, "python_peak_rss_bytes": 0, "reconciled": True, "windows_equal_reference": True}


def test_ratios_are_medians_over_medians_and_goals_follow_the_figures():
    rows = [_row("plain", 8, "hash", w, s) for w, s in ((100, 200), (110, 210), (90, 190))]
    rows += [_row("keyshift", 8, "hash", w, s, first=f) for w, s, f in ((95, 230, 9.0), (105, 250, 8.0), (99, 240, 12.0))]
    rows += [_row("plain", 32, "hot_split", 80, 150), _row("keyshift", 32, "hot_split", 84, 160)]
    report = summarize(rows, (Config(8, "hash"), Config(32, "hot_split")))
    assert report["ratio_whole"] == pytest.approx(99 / 100, abs=1e-3)
    assert report["ratio_steady"] == pytest.approx(240 / 200, abs=1e-3)
    assert report["p32_over_p8"] == pytest.approx(84 / 99, abs=1e-3)
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["whole-run ratio >= 1.0 (floor 0.9) at P=8"]["met"] is False
    assert goals["steady-state ratio >= 1.0"]["met"] is True
    assert goals["keyshift's first batch <= 10 s (slowest run)"] == {"goal": "keyshift's first batch <= 10 s (slowest run)",
                                                                       "target": 10.0, "measured": 12.0, "met": False}
    assert goals["P=32 throughput >= 0.8 x P=8"]["met"] is True
    assert report["ratio_cpu"] is None  # rows without CPU figures (older reports) give no CPU ratio
    for row, per_cpu in zip(rows[:6], (50, 60, 40, 45, 30, 55)):
        row["events_per_cpu_second"] = per_cpu
    assert summarize(rows, (Config(8, "hash"),))["ratio_cpu"] == pytest.approx(45 / 50, abs=1e-3)
    rows[3]["reconciled"] = False
    assert summarize(rows, (Config(8, "hash"),))["all_reconciled"] is False


def test_cold_start_rows_give_batch_0_and_the_median_of_later_batches():
    from keyshift.bench.throughput import cold_start_row, summarize_cold_start

    progress = [{"batch_id": 0, "input_rows": 10_000, "batch_duration_ms": 10_400}, {"batch_id": 1, "input_rows": 10_000, "batch_duration_ms": 2_000},
                {"batch_id": 2, "input_rows": 0, "batch_duration_ms": 50}, {"batch_id": 3, "input_rows": 10_000, "batch_duration_ms": 1_600},
                {"batch_id": 4, "input_rows": 9, "batch_duration_ms": 1_200}]
    ours = cold_start_row("keyshift", 1, {"events": 30_009, "first_batch_seconds": 10.4, "progress": progress, "reconciled": True,
                                          "windows_equal_reference": False, "run_dir": "x"})
    assert ours == {"job": "keyshift", "run": 1, "events": 30_009, "first_batch_seconds": 10.4, "steady_batch_seconds": 1.6,
                    "reconciled": True, "windows_equal_reference": False}
    plain = cold_start_row("plain", 0, {"events": 10_000, "first_batch_seconds": 9.5, "progress": progress[:1]})
    assert plain["steady_batch_seconds"] is None and "reconciled" not in plain
    summary = summarize_cold_start([ours, plain, {**plain, "run": 1, "first_batch_seconds": 9.9}])
    assert summary == {"plain_first_batch_seconds": 9.7, "plain_steady_batch_seconds": None,
                       "keyshift_first_batch_seconds": 10.4, "keyshift_steady_batch_seconds": 1.6}
    # a cold-start keyshift run whose windows differ from pandas fails the bench's correctness goal
    rows = [_row("plain", 8, "hash", 100, 200), _row("keyshift", 8, "hash", 100, 200)]
    assert summarize(rows, (Config(8, "hash"),))["all_windows_equal_reference"] is True
    assert summarize(rows, (Config(8, "hash"),), [ours, plain])["all_windows_equal_reference"] is False
