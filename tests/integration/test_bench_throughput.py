"""`keyshift bench throughput`, short: the plain job and keyshift's job on 20,000 real flights at P = 4.

One run of each, each a process of its own on the same topic, then one cold-start run of each on
4,000 flights in 2,000-record batches. The report must have the issue's shape and a plot; both
jobs must read every flight; keyshift's runs must reconcile and equal pandas' windows; the goals
are evaluated (met or not, never missing) from the measured rows.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

FLIGHTS = 20_000


@pytest.mark.slow  # four driver processes, 2 min: the bench's own check (its options are checked below)
def test_plain_and_keyshift_jobs_on_the_same_topic_report_the_issue_shape(stack_settings, tmp_path):
    from keyshift.bench.throughput import ROW_FIELDS, Config, run_throughput_bench

    out = tmp_path / "throughput.json"
    report = run_throughput_bench(stack_settings, out, (Config(4, "hash"),), runs=1, flights=FLIGHTS, per_trigger=5_000,
                                  timeout_s=900, progress=False, cold_start_records=4_000, cold_start_per_trigger=2_000)

    assert json.loads(out.read_text())["ratio_whole"] == report["ratio_whole"]
    assert (tmp_path / "throughput.png").stat().st_size > 0
    rows = {r["job"]: r for r in report["rows"]}
    assert set(rows) == {"plain", "keyshift"} and all(set(ROW_FIELDS) <= r.keys() for r in rows.values())
    for row in rows.values():
        assert row["events"] >= FLIGHTS and row["partitions"] == 4  # the plain job also reads earlier runs' markers
        assert row["events_per_second"] > 0 and row["steady_events_per_second"] > 0 and row["first_batch_seconds"] > 0
        assert row["driver_peak_rss_bytes"] > 0
        assert row["cpu_seconds"]["jvm"] > 0 and row["events_per_cpu_second"] > 0
        assert row["process_seconds"] > row["query_seconds"] > 0
    assert rows["keyshift"]["events"] == FLIGHTS and rows["keyshift"]["python_peak_rss_bytes"] > 0
    assert rows["keyshift"]["cpu_seconds"]["python_workers"] > 0 and rows["plain"]["cpu_seconds"]["python_workers"] == 0
    assert report["ratio_cpu"] == pytest.approx(rows["keyshift"]["events_per_cpu_second"] / rows["plain"]["events_per_cpu_second"], abs=1e-3)
    assert rows["keyshift"]["reconciled"] is True and rows["keyshift"]["windows_equal_reference"] is True
    assert rows["keyshift"]["late_events"] == 0 and rows["keyshift"]["dead_letters"] == 0
    assert report["ratio_whole"] == pytest.approx(rows["keyshift"]["events_per_second"] / rows["plain"]["events_per_second"], abs=1e-3)
    assert {g["goal"]: g["met"] for g in report["goals"]}["P=32 throughput >= 0.8 x P=8"] is None  # no P=32 run here
    assert all(g["met"] in (True, False) for g in report["goals"] if "P=32" not in g["goal"])

    cold = report["cold_start"]
    assert (cold["records"], cold["per_trigger"], cold["partitions"], cold["strategy"]) == (4_000, 2_000, 4, "hash")
    by_job = {r["job"]: r for r in cold["rows"]}
    assert set(by_job) == {"plain", "keyshift"} and by_job["keyshift"]["events"] == 4_000 and by_job["plain"]["events"] >= 4_000
    assert all(r["first_batch_seconds"] > 0 and r["steady_batch_seconds"] > 0 for r in by_job.values())
    assert by_job["keyshift"]["reconciled"] is True and by_job["keyshift"]["windows_equal_reference"] is True
    assert cold["keyshift_first_batch_seconds"] == by_job["keyshift"]["first_batch_seconds"]


def test_a_bad_configuration_is_refused_before_anything_runs(tmp_path):
    from click.testing import CliRunner

    from keyshift.cli.bench import command

    result = CliRunner().invoke(command, ["throughput", "--out", str(tmp_path / "t.json"), "--config", "8:weight"])
    assert result.exit_code != 0 and "weight" in str(result.exception or result.output)
    assert not (tmp_path / "t.json").exists()
