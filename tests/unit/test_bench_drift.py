"""`keyshift bench drift`'s pure parts: rows from a run's outputs and the issue's goals."""

from __future__ import annotations

import pytest

from keyshift.bench.drift import DriftBenchSettings, build_row, evaluate_targets
from keyshift.errors import ConfigurationError


def _row(mode: str, topic: str, late=0, dead=0, speed=30_000.0, state=1_000_000, equal=True):
    summary = {"run_id": f"r-{mode}-{topic}", "events_read": 100, "wall_seconds": 2.0, "events_per_second": speed,
               "late_events": late, "dead_letters": dead, "dead_letters_by_reason": {}, "reconciled": True}
    progress = [{"state_store": {"rows": 5, "memory_bytes": state // 2}}, {"state_store": {"rows": 9, "memory_bytes": state}}]
    drift = [{"batch_id": 0, "drift_ms": 0}, {"batch_id": 1, "drift_ms": 3 * 86_400_000}]
    return build_row(f"{mode} ({topic})", mode, topic, summary, progress, drift, {"equal": equal, "windows": 7, "events": 100})


def test_a_row_carries_the_peak_state_and_the_largest_drift():
    row = _row("key", "drifted")
    assert row["state_memory_bytes_peak"] == 1_000_000 and row["state_rows_peak"] == 9
    assert row["max_partition_drift_days"] == 3.0 and row["windows_equal_reference"] is True


def test_the_goals_hold_only_for_lossless_modes_and_close_throughput():
    rows = [_row("global", "drifted", late=50), _row("partition", "drifted", state=2_500_000), _row("key", "drifted", speed=28_000.0),
            _row("dynamic", "drifted", dead=1), _row("key", "undrifted", speed=30_000.0)]
    targets = evaluate_targets(rows)
    assert [t["met"] for t in targets] == [True, True, False, True, None]
    assert targets[3]["value"]["ratio"] == pytest.approx(28_000 / 30_000, abs=1e-3)
    assert targets[4]["value"]["partition drifted / key undrifted"] == 2.5
    slow = evaluate_targets([_row("key", "drifted", speed=20_000.0), _row("key", "undrifted")])
    assert [t["met"] for t in slow][-2] is False  # 0.67 of the undrifted speed


def test_bad_settings_are_refused():
    with pytest.raises(ConfigurationError):
        DriftBenchSettings(every=0).check()
