"""The watermark bench's pure parts: which backfill run a row reports, and the goals."""

from __future__ import annotations

from keyshift.bench.watermark import add_backfill, evaluate_targets, median_run


def _run(run_id: str, events_per_second: float | None) -> dict:
    return {"run_id": run_id, "events_per_second": events_per_second, "events_per_second_whole_run": 1.0, "late_events": 0,
            "events": 100, "steady": {}, "reconciled": True}


def test_the_median_run_is_reported_with_every_repeat_and_the_range():
    chosen = median_run([_run("a", 300.0), _run("b", 100.0), _run("c", 200.0)])
    assert chosen["run_id"] == "c" and chosen["events_per_second"] == 200.0
    assert [r["run_id"] for r in chosen["repeats"]] == ["a", "b", "c"]  # in round order
    assert chosen["events_per_second_range"] == [100.0, 300.0]


def test_an_even_count_takes_the_lower_middle_and_unmeasured_runs_are_left_out():
    assert median_run([_run("a", 400.0), _run("b", 100.0)])["run_id"] == "b"
    chosen = median_run([_run("a", None), _run("b", 50.0), _run("c", 70.0), _run("d", 60.0)])
    assert chosen["run_id"] == "d" and chosen["events_per_second_range"] == [50.0, 70.0]
    nothing = median_run([_run("a", None)])
    assert nothing["run_id"] == "a" and nothing["events_per_second_range"] is None


def _paced(mode: str, disorder: float, late: int, p95: float) -> dict:
    return {"mode": mode, "disorder": disorder, "events_per_second": None, "late_fraction": late / 100, "latency_p50_s": p95 / 2,
            "latency_p95_s": p95, "state_bytes": 10, "performance_ratio_E": 1.0, "bound_ms": 60_000, "events": 100,
            "late_events": late, "windows": 5, "windows_equal_reference": True, "events_per_second_whole_run": None,
            "backfill_late_events": None, "backfill_late_fraction": None, "needed_bound_ms": 60_000, "extra": "kept"}


def test_add_backfill_fills_the_throughput_and_keeps_the_paced_figures():
    row = add_backfill(_paced("key", 0.5, 0, 3.0), [_run("r1", 90.0), _run("r2", 110.0), _run("r3", 100.0)])
    assert row["events_per_second"] == 100.0 and row["backfill"]["run_id"] == "r3"
    assert row["latency_p95_s"] == 3.0 and row["extra"] == "kept" and row["backfill_late_events"] == 0
    assert list(row)[:8] == ["mode", "disorder", "events_per_second", "late_fraction", "latency_p50_s", "latency_p95_s",
                             "state_bytes", "performance_ratio_E"]


def test_the_throughput_goal_compares_the_medians_level_by_level():
    rows = []
    for disorder, key_eps, global_eps in ((0.0, 100.0, 99.0), (0.5, 100.0, 101.0)):
        rows.append(add_backfill(_paced("key", disorder, 0, 3.0), [_run("k", key_eps)]))
        rows.append(add_backfill(_paced("global", disorder, 5 if disorder else 0, 4.0), [_run("g", global_eps)]))
    goal = next(t for t in evaluate_targets(rows) if t["target"].startswith("key events per second"))
    assert {d: (v["key"], v["global"]) for d, v in goal["value"].items()} == {"0": (100.0, 99.0), "0.5": (100.0, 101.0)}
    assert goal["met"] is False and goal["unpaired_medians_met"] is False
    rows[3] = add_backfill(_paced("global", 0.5, 5, 4.0), [_run("g", 100.0)])
    assert next(t for t in evaluate_targets(rows) if t["target"].startswith("key events per second"))["met"] is True


def test_events_per_cpu_second_is_the_median_of_the_runs_and_has_its_own_goal():
    def run(run_id: str, eps: float, per_cpu: float) -> dict:
        return {**_run(run_id, eps), "events_per_cpu_second": per_cpu}

    key = add_backfill(_paced("key", 0.5, 0, 3.0), [run("k1", 90.0, 40.0), run("k2", 120.0, 44.0), run("k3", 100.0, 50.0)])
    assert key["events_per_cpu_second"] == 44.0  # its own median, not the median-throughput run's figure
    glob = add_backfill(_paced("global", 0.5, 5, 4.0), [run("g1", 130.0, 42.0)])
    goal = next(t for t in evaluate_targets([key, glob]) if t["target"].startswith("key events per CPU second"))
    assert goal["value"] == {"0.5": {"key": 44.0, "global": 42.0}} and goal["met"] is True
    throughput = next(t for t in evaluate_targets([key, glob]) if t["target"].startswith("key events per second"))
    assert throughput["met"] is False  # round 1: 90 < 130: the two measures can disagree, both are reported


def test_the_throughput_goal_pairs_the_runs_of_one_round():
    """A slow spell that falls on one round drags both modes' runs of that round: the paired
    ratio compares within rounds, so it holds where the two medians (from different rounds) do not."""
    key = add_backfill(_paced("key", 0.0, 0, 3.0), [_run("k1", 120.0), _run("k2", 80.0), _run("k3", 101.0)])
    glob = add_backfill(_paced("global", 0.0, 0, 4.0), [_run("g1", 118.0), _run("g2", 78.0), _run("g3", 105.0)])
    goal = next(t for t in evaluate_targets([key, glob]) if t["target"].startswith("key events per second"))
    level = goal["value"]["0"]
    assert (level["key"], level["global"]) == (101.0, 105.0)  # the medians: key behind
    assert level["round_ratios"] == [round(120 / 118, 4), round(80 / 78, 4), round(101 / 105, 4)]
    assert level["paired_ratio"] == round(120 / 118, 4)  # the median of the three ratios
    assert goal["met"] is True and goal["unpaired_medians_met"] is False
    glob = add_backfill(_paced("global", 0.0, 0, 4.0), [_run("g1", 125.0), _run("g2", 85.0), _run("g3", 100.0)])
    assert next(t for t in evaluate_targets([key, glob]) if t["target"].startswith("key events per second"))["met"] is False
