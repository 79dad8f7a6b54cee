"""A switch cut right after the batch that read the end-of-input markers: the new query writes
markers of its own and the run still ends with every window emitted.

Stop 28's full suite hit this once by chance (`test_switch_key_watermarks` timed out: the new
query started past the markers and never got the watermark move that closes the last windows).
Here failpoint `switch.after_markers_read@1` holds the switch until a planned batch reads the
markers, so the cut always comes right after them. 40,000 real flights (plus 40 malformed
records) in a fresh 8-partition topic, key watermarks with a one-minute bound, batches of 8,000.
"""

from __future__ import annotations

import json

import pytest
from flight_runs import switch_at_the_markers

pytestmark = pytest.mark.integration

FLIGHTS = 40_000
PER_TRIGGER = 8_000


def test_a_switch_right_after_the_markers_still_closes_every_window(stack_settings, tmp_path):
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import compare_to_reference, reference_windows

    run_dir, record = switch_at_the_markers(stack_settings, tmp_path, "markers", FLIGHTS, PER_TRIGGER,
                                            "switch.after_markers_read@1", "least_count")

    text = (run_dir / "driver.log").read_text(errors="replace")  # keyshift's INFO lines (the terminal shows steps only)
    assert "writing end-of-input markers" in text
    # the failpoint made the cut come after the markers' batch: the new segment wrote its own
    assert "the end-of-input markers were read before this segment's start; writing them again" in text, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["segments"] == 2 and summary["switches"] == [record.switch_id]
    assert summary["reconciled"] and summary["pending_events"] == 0
    assert summary["late_events"] == 0 and summary["dead_letters"] == 40 and summary["events_read"] == FLIGHTS + 40
    comparison = compare_to_reference(run_dir / "windows", reference_windows(flights_path(stack_settings), limit=FLIGHTS))
    assert comparison["equal"], comparison
