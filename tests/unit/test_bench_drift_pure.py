"""`keyshift bench drift`'s pure parts: rows from a run's outputs (fake run folders), the issue's
targets, the repeats, the plot, and how `bench all` tells the report apart."""

from __future__ import annotations

import json

import pytest

from keyshift.bench.drift import (
    ROW_FIELDS,
    DriftBenchSettings,
    add_repeat,
    build_row,
    drift_per_batch,
    evaluate_targets,
    open_at_end_events,
    plain_row,
    plot_rows,
)
from keyshift.bench.report import drift_goals, identify_bench
from keyshift.errors import ConfigurationError, JobError

DAY = 86_400_000


def _summary(mode: str, topic: str, late=0, dead=0, speed=30_000.0, events=100):
    return {"run_id": f"r-{mode}-{topic}", "events_read": events, "wall_seconds": events / speed, "events_per_second": speed,
            "late_events": late, "dead_letters": dead, "dead_letters_by_reason": {"implausible_time": dead} if dead else {},
            "reconciled": True, "cpu_seconds": {"total": 3.5}}


def _progress(state=1_000_000):
    return [{"batch_id": 0, "input_rows": 40, "batch_duration_ms": 4_000, "state_store": {"rows": 5, "memory_bytes": state // 2}},
            {"batch_id": 1, "input_rows": 30, "batch_duration_ms": 1_000, "state_store": {"rows": 9, "memory_bytes": state}},
            {"batch_id": 2, "input_rows": 30, "batch_duration_ms": 2_000, "state_store": {"rows": 7, "memory_bytes": state // 4}}]


def _row(mode: str, topic: str, late=0, dead=0, speed=30_000.0, state=1_000_000, equal=True, bound=None):
    drift = [{"batch_id": 0, "drift_ms": 0, "idle_partitions": 0}, {"batch_id": 1, "drift_ms": 3 * DAY, "idle_partitions": 2}]
    comparison = {"equal": equal, "windows": 7, "reference_windows": 7, "events": 100 - late - dead}
    name = f"{mode} ({topic})" if bound is None else f"{mode}, drift bound ({topic})"
    return build_row(name, mode, topic, _summary(mode, topic, late, dead, speed), _progress(state), drift, comparison, bound)


def _all_rows(**overrides):
    rows = {("global", "drifted"): dict(late=50, equal=False), ("partition", "drifted"): dict(state=25_000_000),
            ("key", "drifted"): dict(speed=28_000.0), ("dynamic", "drifted"): {}, ("key", "undrifted"): dict(speed=30_000.0),
            ("partition", "undrifted"): dict(state=10_000_000),
            ("partition", "bounded"): dict(state=12_000_000, bound=3_600_000), ("key", "bounded"): dict(bound=3_600_000)}
    for key, change in overrides.items():
        rows[tuple(key.split("_"))].update(change)
    return [_row(mode, "drifted" if topic == "bounded" else topic, **kw) for (mode, topic), kw in rows.items()]


def _write_clocks(run_dir, batch_id, drift_ms, idle=()):
    folder = run_dir / "partition-clocks"
    folder.mkdir(parents=True, exist_ok=True)
    body = {"batch_id": batch_id, "clocks": {}, "drift_ms": drift_ms, "idle": list(idle), "idle_timeout_ms": 60_000,
            "reference_ms": None, "time_ms": 1_000 + batch_id}
    (folder / f"in-force-{batch_id}.json").write_text(json.dumps(body))


def test_drift_per_batch_reads_the_in_force_files_by_batch_id(tmp_path):
    for batch_id, drift_ms in [(10, 5 * DAY), (2, DAY), (9, 0)]:
        _write_clocks(tmp_path, batch_id, drift_ms, idle=[3] if batch_id == 9 else [])
    (tmp_path / "partition-clocks" / "after-2.json").write_text("{}")  # not an in-force file
    (tmp_path / "partition-clocks" / "2").mkdir()  # task reports of batch 2
    assert drift_per_batch(tmp_path) == [{"batch_id": 2, "drift_ms": DAY, "idle_partitions": 0},
                                         {"batch_id": 9, "drift_ms": 0, "idle_partitions": 1},
                                         {"batch_id": 10, "drift_ms": 5 * DAY, "idle_partitions": 0}]
    assert drift_per_batch(tmp_path / "no-run") == []


def test_drift_per_batch_refuses_a_broken_clocks_file(tmp_path):
    _write_clocks(tmp_path, 0, 0)
    (tmp_path / "partition-clocks" / "in-force-1.json").write_text('{"batch_id": 1')
    with pytest.raises(JobError, match="in-force-1.json"):
        drift_per_batch(tmp_path)


def test_a_row_from_a_fake_run_folder_carries_every_figure(tmp_path):
    _write_clocks(tmp_path, 0, 0)
    _write_clocks(tmp_path, 1, int(41.3 * DAY), idle=[4])
    row = build_row("key (drifted)", "key", "drifted", _summary("key", "drifted", late=2, dead=1), _progress(),
                    drift_per_batch(tmp_path), {"equal": False, "windows": 6, "reference_windows": 7, "events": 97})
    assert set(ROW_FIELDS) <= row.keys(), set(ROW_FIELDS) - row.keys()
    assert row["state_memory_bytes_peak"] == 1_000_000 and row["state_rows_peak"] == 9
    assert row["max_partition_drift_days"] == 41.3 and row["max_partition_drift_ms"] == int(41.3 * DAY)
    assert row["idle_partition_batches"] == 1 and [d["batch_id"] for d in row["drift_per_batch"]] == [0, 1]
    assert row["late_events"] == 2 and row["dead_letters"] == 1 and row["dead_letters_by_reason"] == {"implausible_time": 1}
    assert row["lost_events"] == 3 and row["window_events"] == 97 and row["windows_equal_reference"] is False
    # steady state: the batches after the first that read rows, 60 rows in 3 s
    assert row["events_per_second"] == 30_000.0 and row["steady_events_per_second"] == 20.0
    assert row["run_id"] == "r-key-drifted" and row["reconciled"] is True and row["cpu_seconds"] == 3.5


def test_a_run_without_partition_clocks_has_no_drift():
    row = build_row("key (undrifted)", "key", "undrifted", _summary("key", "undrifted"), [], [], {"equal": True, "events": 100})
    assert row["max_partition_drift_days"] == 0 and row["drift_per_batch"] == [] and row["state_memory_bytes_peak"] is None
    assert row["steady_events_per_second"] is None


def test_the_plain_jobs_row_counts_what_its_windows_lost():
    row = plain_row({"events": 1_000, "query_seconds": 4.0, "steady_events_per_second": 300.0, "cpu_seconds": {"total": 9.0}},
                    {"equal": False, "windows": 10, "reference_windows": 40, "events": 250}, flights=1_000, open_at_end=50)
    assert set(ROW_FIELDS) <= row.keys()
    assert row["job"] == "plain" and row["events_per_second"] == 250.0 and row["lost_events"] == 750
    assert row["open_at_end_events"] == 50 and row["late_dropped_events"] == 700
    assert row["late_events"] is None and row["dead_letters"] is None and row["drift_per_batch"] == []
    assert plain_row({"events": 0, "query_seconds": None}, {"equal": False}, 10)["events_per_second"] is None


def test_windows_still_open_at_the_end_of_the_input_are_counted_apart():
    import pandas as pd

    hour = 3_600_000
    last = 100 * hour + 5  # the last event; the final watermark is 52 h + 5 ms
    reference = pd.DataFrame({"origin": ["A", "A", "B", "B"],
                              "window_start": pd.to_datetime([50 * hour, 51 * hour, 52 * hour, 100 * hour], unit="ms", utc=True),
                              "count": [1, 2, 4, 8]})
    # [50 h, 51 h) and [51 h, 52 h) close (their ends <= 52 h + 5 ms); [52 h, 53 h) and [100 h, 101 h) stay open
    assert open_at_end_events(reference, last) == 12
    assert open_at_end_events(reference, last, delay_ms=0) == 8
    assert open_at_end_events(reference.iloc[:0], last) == 0


def test_the_targets_hold_only_for_lossless_modes_and_close_throughput():
    targets = evaluate_targets(_all_rows())
    assert [t["met"] for t in targets] == [True, True, True, True, True]
    assert [t["target"].split()[0] for t in targets[:3]] == ["partition", "key", "dynamic"]
    assert targets[1]["value"] == {"late_events": 0, "dead_letters": 0, "windows_equal_reference": True, "run_id": "r-key-drifted"}
    assert targets[3]["value"]["ratio"] == pytest.approx(28_000 / 30_000, abs=1e-3)
    assert targets[3]["value"]["steady_ratio"] == 1.0
    state = targets[4]["value"]
    assert state["partition"] == {"undrifted bytes": 10_000_000, "bounded drifted bytes": 12_000_000, "x_undrifted": 1.2,
                                  "drift_bound_ms": 3_600_000, "unbounded drifted bytes": 25_000_000,
                                  "unbounded x_undrifted": 2.5}
    assert state["key"]["x_undrifted"] == 1.0 and "global" not in state


def test_the_state_target_fails_above_twice_the_undrifted_run_and_is_unmeasured_without_a_bounded_row():
    assert evaluate_targets(_all_rows(partition_bounded={"state": 21_000_000}))[4]["met"] is False
    rows = [r for r in _all_rows() if r["drift_bound_ms"] is None]
    assert evaluate_targets(rows)[4]["met"] is None


@pytest.mark.parametrize("change, index", [({"dynamic_drifted": {"dead": 1}}, 2), ({"key_drifted": {"late": 3}}, 1),
                                           ({"partition_drifted": {"equal": False}}, 0)])
def test_one_late_event_dead_letter_or_unequal_window_fails_its_mode(change, index):
    met = [t["met"] for t in evaluate_targets(_all_rows(**change))]
    assert met[index] is False and met.count(False) == 1


def test_key_mode_at_less_than_ninety_percent_misses_the_throughput_target():
    assert evaluate_targets(_all_rows(key_drifted={"speed": 26_999.0}))[3]["met"] is False
    assert evaluate_targets(_all_rows(key_drifted={"speed": 27_000.0}))[3]["met"] is True


def test_missing_runs_leave_their_targets_unmeasured():
    targets = evaluate_targets([_row("key", "drifted")])
    assert len(targets) == 5 and [t["met"] for t in targets] == [None, True, None, None, None]
    assert targets[3]["value"] is None and targets[4]["value"]["key"]["undrifted bytes"] is None


def test_repeats_give_the_median_the_throughput_target_compares():
    rows = _all_rows(key_drifted={"speed": 20_000.0})
    drifted, undrifted = rows[2], rows[4]
    for speed in (29_000.0, 28_500.0):
        add_repeat(drifted, _summary("key", "drifted", speed=speed), flights=100)
    add_repeat(undrifted, _summary("key", "undrifted", speed=31_000.0), flights=100)
    assert drifted["events_per_second_runs"] == [20_000.0, 29_000.0, 28_500.0] and drifted["events_per_second_median"] == 28_500.0
    assert undrifted["events_per_second_median"] == 30_500.0
    throughput = evaluate_targets(rows)[3]
    assert throughput["met"] is True and throughput["value"]["ratio"] == pytest.approx(28_500 / 30_500, abs=1e-3)
    assert throughput["value"]["runs"]["drifted"] == [20_000.0, 29_000.0, 28_500.0]


def test_a_repeat_that_misses_events_is_refused_and_one_that_loses_some_fails_its_mode():
    rows = _all_rows()
    with pytest.raises(JobError, match="99 of 100"):
        add_repeat(rows[2], _summary("key", "drifted", events=99), flights=100)
    add_repeat(rows[2], {**_summary("key", "drifted", late=1, dead=2), "run_id": "r-key-drifted-2"}, flights=100)
    assert rows[2]["repeats"] == [{"run_id": "r-key-drifted-2", "events_per_second": 30_000.0, "late_events": 1, "dead_letters": 2,
                                   "reconciled": True}]
    key = evaluate_targets(rows)[1]
    assert key["met"] is False and key["value"]["late_events"] == 1 and key["value"]["dead_letters"] == 2
    assert key["value"]["repeat_run_ids"] == ["r-key-drifted-2"]


def test_a_thinned_run_gets_a_plausibility_reach_scaled_to_its_thinning():
    assert DriftBenchSettings().job_max_ahead_ms() is None  # the job's default, 7 days
    assert DriftBenchSettings(every=10).job_max_ahead_ms() == 70 * DAY
    assert DriftBenchSettings(every=10, max_ahead_ms=DAY).job_max_ahead_ms() == DAY
    assert DriftBenchSettings(max_ahead_ms=3 * DAY).job_max_ahead_ms() == 3 * DAY


def test_bad_settings_are_refused():
    for bad in (dict(every=0), dict(per_trigger=0), dict(partitions=0), dict(flights=0), dict(repeats=0), dict(bound_ms=-1),
                dict(timeout_s=0), dict(max_ahead_ms=0), dict(baseline="other"), dict(baseline="replay", every=10)):
        with pytest.raises(ConfigurationError):
            DriftBenchSettings(**bad).check()
    DriftBenchSettings(baseline="replay").check()
    DriftBenchSettings(flights=1_000, every=10, repeats=1).check()


def test_the_plot_is_written(tmp_path):
    rows = [plain_row({"events": 100, "query_seconds": 1.0}, {"equal": False, "events": 60}, 100), *_all_rows()]
    path = plot_rows(rows, tmp_path / "drift.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_all_tells_the_drift_report_apart_and_lists_its_targets():
    report = {"drift_bench": {"every": 10}, "rows": _all_rows(), "targets": evaluate_targets(_all_rows()), "wall_seconds": 1.0}
    assert identify_bench(json.loads(json.dumps(report))) == "drift"
    goals = drift_goals(report)
    assert len(goals) == 5 and {g.benchmark for g in goals} == {"drift"} and [g.met for g in goals] == [True, True, True, True, True]
    # the watermark bench's reports also carry rows and targets, but never drift_bench
    assert identify_bench({"rows": [], "targets": [], "definitions": {}}) == "watermark"


def test_bench_alls_page_shows_the_drift_targets_and_plot(tmp_path):
    from keyshift.bench.report import BenchOutcome, render_report

    rows = [plain_row({"events": 100, "query_seconds": 1.0}, {"equal": False, "events": 60}, 100), *_all_rows()]
    report = {"drift_bench": {"every": 10}, "rows": rows, "targets": evaluate_targets(rows), "wall_seconds": 1.0}
    path = tmp_path / "drift.json"
    path.write_text(json.dumps(report))
    plot_rows(rows, tmp_path / "drift.png")
    html = render_report([BenchOutcome("drift", "ok", path, "2026-11-28T10:00:00Z", 400.0)], tmp_path / "report.html").read_text()
    assert html.count('data-bench="drift"') == 1 and html.count("<td>drift</td>") == 1 + 5
    assert "dynamic mode on the drifted topic: 0 late events, 0 dead letters, windows equal to pandas" in html
    assert "5 met, 0 not met, 0 not measured" in html and 'alt="drift plot" src="data:image/png;base64,' in html
