"""`keyshift bench switch`, short: two switches of a job fed at a steady rate, on 60,000 flights.

The oracle reads the same flights backfilled; the switching run is fed at 2,000 events/s (30 s)
in 10,000-record batches and switched hash -> least_count -> hot_split/P=6 while it reads them.
The report must have the issue's shape, the two windows tables must be identical (one-day bound:
no late events in either run) and the switches must cause no late event.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.integration

SWITCH_KEYS = {"pause_seconds", "step_seconds", "state_rows_moved", "state_bytes_moved", "moved_share", "min_moved_share", "in_driver"}


def test_two_switches_on_a_fed_job_report_the_issue_shape(stack_settings, tmp_path):
    from keyshift.cli.bench import command

    out = tmp_path / "switch.json"
    result = CliRunner().invoke(command, ["switch", "--out", str(out), "--flights", "60000", "--rate", "2000",
                                          "--max-offsets-per-trigger", "10000", "--sequence", "hash:8,least_count,hot_split:6",
                                          "--sample-events", "30000", "--no-progress"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(out.read_text())

    assert report["outputs_identical"] is True, report["windows"]
    assert report["late_events_from_switches"] == 0
    assert report["counts"]["equal"] and report["counts"]["switching"]["events_read"] == 60_000
    assert [(s["from"], s["to"]) for s in report["switches"]] == [("hash/P=8", "least_count/P=8"), ("least_count/P=8", "hot_split/P=6")]
    for switch in report["switches"]:
        assert SWITCH_KEYS <= switch.keys()
        assert switch["in_driver"] is True
        assert 0 < switch["pause_seconds"] < 120
        assert {"requested", "stopped", "migrated", "segment", "published", "verified"} <= switch["step_seconds"].keys()
        assert switch["state_rows_moved"] > 0 and switch["state_bytes_moved"] >= 0
        assert 0 <= switch["min_moved_share"] <= switch["moved_share"] <= 1
        assert switch["throughput_before"]["events"] > 0 and switch["throughput_after"]["events"] > 0
    assert report["median_pause_seconds"] == pytest.approx(sum(s["pause_seconds"] for s in report["switches"]) / 2, abs=1e-3)
    assert report["dominant_step"] not in ("requested", "verified", "done")
    assert (tmp_path / "switch.png").stat().st_size > 0
