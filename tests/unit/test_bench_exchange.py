"""`keyshift bench exchange`'s pure parts: the batch-latency percentile, per-run figures from
progress records, the report's ratio and shuffle fractions, and its file format check."""

from __future__ import annotations

import pytest

from keyshift.bench.exchange import ROW_FIELDS, _figures, check_report, p95, summarize
from keyshift.errors import JobError


def test_p95_is_the_nearest_rank():
    assert p95([]) is None
    assert p95([3.0]) == 3.0
    assert p95(list(range(1, 21))) == 19  # rank ceil(0.95 * 20) = 19
    assert p95(list(range(1, 101))) == 95
    assert p95([5, 1, 4, 2, 3]) == 5


def test_figures_skip_batch_zero_for_the_steady_rate_and_empty_batches_for_latency():
    progress = [{"batch_id": 0, "input_rows": 1_000, "batch_duration_ms": 9_000},
                {"batch_id": 1, "input_rows": 2_000, "batch_duration_ms": 1_000},
                {"batch_id": 2, "input_rows": 2_000, "batch_duration_ms": 3_000},
                {"batch_id": 3, "input_rows": 0, "batch_duration_ms": 50_000}]
    got = _figures(5_000, 20.0, progress, 1234)
    assert got["events_per_second"] == 250.0
    assert got["steady_events_per_second"] == 1_000.0  # 4,000 events in 4 s after batch 0
    assert got["latency_p95_s"] == 3.0  # neither batch 0 (start-up) nor the empty batch
    assert _figures(1_000, 9.0, progress[:1], None)["latency_p95_s"] == 9.0  # one batch: that one
    assert got["batches"] == 4 and got["shuffle_bytes"] == 1234


def row(job, strategy, eps, shuffle, identical=True, placement=None):
    placement = placement or ("hash" if strategy in ("ahead_keyby", "plain_spark") else "round_robin")
    return {"job": job, "strategy": strategy, "events_per_second": eps, "shuffle_bytes": shuffle, "latency_p95_s": 1.0,
            "results_identical": identical, "topic_placement": placement}


def test_summary_ratio_and_shuffle_fractions():
    rows = [row("flights", "plain", 100, 1_000), row("flights", "local_merge", 150, 250), row("flights", "global_merge", 90, 0),
            row("flights", "ahead_keyby", 160, 100), row("ysb", "plain", 50, 400), row("ysb", "ahead_keyby", 60, 40),
            row("ysb", "global_merge", 30, 0), row("ysb", "global_merge", 60, 0, placement="hash"),
            row("ysb", "global_merge", 80, 0, placement="hash"), row("ysb", "plain_spark", 50, 10)]
    report = summarize(rows)
    assert report["ysb_vs_plain_throughput_ratio"] == 1.4  # global_merge on the hash topic: median 70 over 50
    assert report["ysb_ratio_by_run"] == {"plain@round_robin": 1.0, "ahead_keyby@hash": 1.2, "global_merge@round_robin": 0.6,
                                          "global_merge@hash": 1.4}
    assert report["shuffle_fraction_of_plain"]["ysb"]["global_merge"] == 0.0
    assert report["shuffle_fraction_of_plain"]["flights"] == {"plain": 1.0, "local_merge": 0.25, "global_merge": 0.0,
                                                             "ahead_keyby": 0.1}
    assert report["shuffle_fraction_of_plain"]["ysb"]["local_merge"] is None  # not run
    assert report["all_results_identical"] and all(g["met"] for g in report["goals"])
    worse = summarize(rows + [row("ysb", "plain_spark", 200, 10, identical=False)])
    assert worse["ysb_vs_plain_throughput_ratio"] == pytest.approx(70 / 125, abs=1e-3)
    assert not worse["all_results_identical"] and not any(g["met"] for g in worse["goals"])


def test_check_report_names_a_missing_field():
    check_report({"rows": [row("ysb", "plain", 1, 1)]})
    broken = {k: v for k, v in row("ysb", "plain", 1, 1).items() if k != "latency_p95_s"}
    with pytest.raises(JobError, match="latency_p95_s"):
        check_report({"rows": [broken]})
    assert set(ROW_FIELDS) <= set(row("a", "b", 1, 1))
