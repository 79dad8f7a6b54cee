"""`keyshift bench drift`, short: one flight in 100 of the six months (30,000) with their busy and
quiet origins swapping names half-way, in 5,000-record batches, through the CLI as a user runs it.

Thinning (not the first N flights) keeps the six months, so the drifted topic's partitions are
read days apart in event time, as in the full-size bench. The report must have the issue's shape
and a plot, every keyshift run must read every flight, the per-key and partition modes must lose
nothing and equal pandas' windows, with and without the drift bound (keyshift's aligned Kafka
source), and `bench all` must tell the report apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EVERY = 100
FLIGHTS = 3_000_000 // EVERY
DAY_MS = 86_400_000


@pytest.mark.slow  # eleven driver processes, 7 to 8 min; the drift itself is test_partition_drift's and test_partition_alignment's
def test_bench_drift_reports_every_mode_and_the_plain_job(stack_settings, tmp_path):
    from keyshift.bench.drift import ROW_FIELDS
    from keyshift.bench.report import drift_goals, identify_bench

    out = tmp_path / "drift.json"
    keyshift = str(Path(sys.executable).parent / "keyshift")
    done = subprocess.run([keyshift, "bench", "drift", "--out", str(out), "--every", str(EVERY), "--per-trigger", "5000",
                           "--repeats", "2", "--no-progress"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert (tmp_path / "drift.png").stat().st_size > 0 and report["plot"] == str(tmp_path / "drift.png")
    assert identify_bench(report) == "drift" and len(drift_goals(report)) == 5
    settings = report["drift_bench"]
    assert settings["flights_per_run"] == FLIGHTS and settings["every"] == EVERY and settings["baseline"] == "plain"
    assert settings["run_order"][0].startswith("plain Spark job (drifted) [") and len(settings["run_order"]) == 9 + 2
    assert settings["job_max_ahead_ms"] == EVERY * 7 * DAY_MS and report["wall_seconds"] > 0

    rows = {(r["job"], r["watermark"], r["topic"] if r["drift_bound_ms"] is None else "bounded"): r for r in report["rows"]}
    modes = ({("keyshift", m, "drifted") for m in ("global", "partition", "key", "dynamic")}
             | {("keyshift", m, kind) for m in ("key", "partition") for kind in ("undrifted", "bounded")})
    plain = [r for r in report["rows"] if r["job"] == "plain"]
    assert modes == {k for k in rows if k[0] == "keyshift"} and len(plain) == 1 and len(report["rows"]) == 9
    for key in modes:
        row = rows[key]
        assert set(ROW_FIELDS) <= row.keys(), set(ROW_FIELDS) - row.keys()
        assert row["events"] == FLIGHTS and row["reconciled"] is True and row["events_per_second"] > 0
        assert row["state_memory_bytes_peak"] > 0 and len(row["drift_per_batch"]) >= FLIGHTS // 5000
        assert row["late_events"] + row["dead_letters"] + row["window_events"] == FLIGHTS
    for mode in ("partition", "key", "dynamic"):
        row = rows[("keyshift", mode, "drifted")]
        assert row["late_events"] == 0 and row["dead_letters"] == 0 and row["windows_equal_reference"], row
        assert row["max_partition_drift_days"] >= 1.0  # the partitions are read days apart
    for mode in ("partition", "key"):  # with the bound (one hour): no loss either
        row = rows[("keyshift", mode, "bounded")]
        assert row["drift_bound_ms"] == 3_600_000 and row["topic"] == "drifted"
        assert row["late_events"] == 0 and row["dead_letters"] == 0 and row["windows_equal_reference"], row
    assert rows[("keyshift", "key", "undrifted")]["max_partition_drift_days"] < rows[("keyshift", "key", "drifted")]["max_partition_drift_days"]
    for kind in ("drifted", "undrifted"):
        row = rows[("keyshift", "key", kind)]
        assert len(row["events_per_second_runs"]) == 2 and len(row["repeat_run_ids"]) == 1 and row["events_per_second_median"] > 0
    assert plain[0]["events"] == FLIGHTS and plain[0]["events_per_second"] > 0  # it ran first: no marker in its input

    targets = report["targets"]
    assert len(targets) == 5 and all(t["met"] in (True, False, None) for t in targets)
    assert [t["met"] for t in targets[:3]] == [True, True, True]
    assert targets[3]["value"]["ratio"] > 0 and targets[4]["met"] in (True, False)
    for mode in ("key", "partition"):
        state = targets[4]["value"][mode]
        assert state["undrifted bytes"] > 0 and state["bounded drifted bytes"] > 0 and state["unbounded drifted bytes"] > 0
