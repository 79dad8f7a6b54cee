"""`keyshift bench watermark`, short: key and global watermarks on 20,000 real flights at disorder 0 and 0.5.

Each configuration runs twice (a paced replay at 10,000 events/s for the latencies, a backfill in
four micro-batches for the throughput) at P = 4. The report must have the issue's shape and a
plot, every run must read every flight, and key mode, whose sources each keep their order, must
lose no event and equal pandas' windows.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

FLIGHTS = 20_000
ISSUE_FIELDS = {"mode", "disorder", "events_per_second", "late_fraction", "latency_p50_s", "latency_p95_s", "state_bytes",
                "performance_ratio_E"}
ROW_FIELDS = ISSUE_FIELDS | {"bound_ms", "events", "late_events", "windows", "windows_equal_reference"}


@pytest.mark.slow  # twelve runs, 2 min; the watermark modes themselves are test_key_watermarks_job's and test_disordered_replay's
def test_key_and_global_at_two_disorder_levels_report_the_issue_shape(stack_settings, spark, tmp_path):
    from keyshift.bench.watermark import BenchSettings, run_watermark_bench

    out = tmp_path / "watermark.json"
    # four backfill micro-batches (not N/10): the shape needs a first and a measured one, and
    # each batch costs about 0.7 s whatever its size
    config = BenchSettings(flights=FLIGHTS, rate=10_000.0, partitions=4, disorders=(0.0, 0.5), modes=("key", "global"),
                           state_samples=1, warmup=False, backfill_repeats=2, per_trigger=FLIGHTS // 4)
    report = run_watermark_bench(stack_settings, out, config, spark=spark, progress=False)

    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(report["rows"], default=str))
    assert (tmp_path / "watermark.png").stat().st_size > 0
    rows = {(r["mode"], r["disorder"]): r for r in report["rows"]}
    assert set(rows) == {(m, d) for m in ("global", "key") for d in (0.0, 0.5)}
    for (mode, disorder), row in rows.items():
        assert ROW_FIELDS <= row.keys(), ROW_FIELDS - row.keys()
        assert row["events"] == FLIGHTS and row["bound_ms"] == 60_000
        assert row["late_fraction"] == pytest.approx(row["late_events"] / FLIGHTS)
        assert row["events_per_second"] > 0 and row["state_bytes"] > 0 and row["performance_ratio_E"] > 0
        assert row["events_per_cpu_second"] > 0 and all(r["events_per_cpu_second"] > 0 for r in row["backfill"]["repeats"])
        assert 0 <= row["latency_p50_s"] <= row["latency_p95_s"]
        assert row["latency_windows"] > 0 and row["windows_without_final_time"] > 0  # each origin's last windows
        assert row["windows_equal_reference"] is True, row["reference"]  # what was not late, counted exactly
        repeats = row["backfill"]["repeats"]  # one run per round, the rounds interleaving the configurations
        assert [r["run_id"].endswith("backfill") for r in repeats] == [True, False] and len({r["run_id"] for r in repeats}) == 2
        low, high = row["backfill"]["events_per_second_range"]
        assert low <= row["events_per_second"] <= high and {low, high} == {r["events_per_second"] for r in repeats}
    assert rows[("global", 0.5)]["disorder_achieved"] == pytest.approx(0.5, abs=0.02)
    # every source keeps its own order: key-level watermarks make nothing late, paced or backfilled
    for disorder in (0.0, 0.5):
        assert rows[("key", disorder)]["late_events"] == 0
        assert rows[("key", disorder)]["backfill_late_events"] == 0
    targets = {t["target"]: t for t in report["targets"]}
    assert targets["key late fraction 0 at every disorder"]["met"] is True
    assert all(t["met"] in (True, False, None) for t in report["targets"]) and len(targets) == 5
    assert report["wall_seconds"] > 0 and report["machine"]["cpus"] >= 1


def test_an_unknown_mode_is_refused_before_anything_runs(tmp_path):
    from click.testing import CliRunner

    from keyshift.cli.bench import command
    from keyshift.errors import ConfigurationError

    result = CliRunner().invoke(command, ["watermark", "--out", str(tmp_path / "w.json"), "--modes", "global,session"])
    assert result.exit_code != 0 and isinstance(result.exception, ConfigurationError)
    assert "session" in str(result.exception) and not (tmp_path / "w.json").exists()
