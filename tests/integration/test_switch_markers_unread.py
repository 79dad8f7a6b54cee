"""A switch cut right before the batch that reads the end-of-input markers, to a larger P: the new
query ignores those markers and the run still loses no flight.

Stop 30's clean-clone run hit this once by chance in `test_switch_key_watermarks`: the request
added Kafka partitions 8 to 11, the driver then wrote its markers to all 12 partitions while the
batch planned to the input's end ran, and the switch cut before that batch. The new query read
the lone markers of partitions 8 to 11 in its first batch (Spark's rate limit gives a partition
of one record that record), its watermark jumped to the markers' year 9999, and the next batch's
4,042 remaining flights went to the dead-letter output as "event_time too far behind the stream".
Here failpoint `switch.before_markers_batch@1` holds the switch until the markers are written,
and the sink holds the batch planned to the input's end until the switch refuses it, so the cut
comes right before it. 44,000 real flights (plus 40 malformed records) in a fresh 8-partition
topic, key watermarks with a one-minute bound, batches of 8,000: the cut leaves about 12,000
flights for the new query, more than one batch.
"""

from __future__ import annotations

import json

import pytest
from flight_runs import switch_at_the_markers

pytestmark = pytest.mark.integration

FLIGHTS = 44_000
PER_TRIGGER = 8_000


def test_a_switch_before_the_markers_batch_ignores_them_and_loses_no_flight(stack_settings, tmp_path):
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import compare_to_reference, reference_windows

    run_dir, record = switch_at_the_markers(stack_settings, tmp_path, "unread", FLIGHTS, PER_TRIGGER,
                                            "switch.before_markers_batch@1", "least_count", 12)

    text = (run_dir / "driver.log").read_text(errors="replace")
    assert "it ignores them and writes its own" in text, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    new = json.loads((run_dir / "job.json").read_text())["segments"][1]
    left = sum(int(end) - int(new["start_offsets"].get(p, 0)) for p, end in summary["end_offsets"].items())
    assert left > PER_TRIGGER, f"the cut left {left} records to the new query, not more than one batch"
    assert all(int(new["marker_floor"][str(p)]) == 1 for p in range(8, 12))  # each new partition held one old marker
    assert summary["segments"] == 2 and summary["switches"] == [record.switch_id]
    assert summary["reconciled"] and summary["pending_events"] == 0
    assert summary["dead_letters_by_reason"].get("event_time too far behind the stream", 0) == 0, summary["dead_letters_by_reason"]
    assert summary["late_events"] == 0 and summary["dead_letters"] == 40 and summary["events_read"] == FLIGHTS + 40
    comparison = compare_to_reference(run_dir / "windows", reference_windows(flights_path(stack_settings), limit=FLIGHTS))
    assert comparison["equal"], comparison
