"""`keyshift bench drift`, short: the first 40,000 flights with their busy and quiet origins
swapping names half-way, in 10,000-record batches, through the CLI as a user runs it.

The report must have the issue's shape and a plot, every keyshift run must read every flight,
and the per-key and partition modes must lose nothing and equal pandas' windows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FLIGHTS = 40_000
ROW_FIELDS = {"run", "job", "watermark", "topic", "events", "events_per_second", "late_events", "dead_letters",
              "state_memory_bytes_peak", "max_partition_drift_days", "windows_equal_reference"}


def test_bench_drift_reports_every_mode_and_the_plain_job(stack_settings, tmp_path):
    out = tmp_path / "drift.json"
    keyshift = str(Path(sys.executable).parent / "keyshift")
    done = subprocess.run([keyshift, "bench", "drift", "--out", str(out), "--flights", str(FLIGHTS), "--per-trigger", "10000",
                           "--repeats", "2", "--no-progress"], capture_output=True, text=True, timeout=1_200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert (tmp_path / "drift.png").stat().st_size > 0
    rows = {(r["job"], r["watermark"], r["topic"]): r for r in report["rows"]}
    modes = {("keyshift", m, "drifted") for m in ("global", "partition", "key", "dynamic")} | {("keyshift", "key", "undrifted")}
    assert modes <= rows.keys() and any(job == "plain" for job, *_ in rows)
    for key in modes:
        row = rows[key]
        assert ROW_FIELDS <= row.keys(), ROW_FIELDS - row.keys()
        assert row["events"] == FLIGHTS and row["reconciled"] and row["events_per_second"] > 0
        assert row["state_memory_bytes_peak"] > 0 and row["drift_per_batch"]
    for mode in ("partition", "key", "dynamic"):
        row = rows[("keyshift", mode, "drifted")]
        assert row["late_events"] == 0 and row["dead_letters"] == 0 and row["windows_equal_reference"], row
    assert len(rows[("keyshift", "key", "drifted")]["events_per_second_runs"]) == 2
    assert len(rows[("keyshift", "key", "undrifted")]["events_per_second_runs"]) == 2
    targets = report["targets"]
    assert len(targets) == 5 and all(t["met"] in (True, False, None) for t in targets)
    assert [t["met"] for t in targets[:3]] == [True, True, True]
    assert report["drift_bench"]["flights_per_run"] == FLIGHTS and report["wall_seconds"] > 0
