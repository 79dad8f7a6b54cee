"""FlightDelayProcessor in memory (pyspark's TwsTester): windows, lateness, dead letters, loads."""

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.eventtime.windows import HOUR_MS
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.local_merge import INPUT_COLUMNS, partials_of
from keyshift.processing.processor import FlightDelayProcessor, merge_partials, pack_pending, unpack_pending

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
TOKENS = slot_tokens(8)
SLOT = 3
TOKEN = TOKENS[SLOT]


def rows(*events, dead=()):
    """Processor input made by Local Merge from events (origin, event_time_ms, delay_min) and dead
    letters (reason, raw), all read from Kafka partition SLOT."""
    records = [
        {"origin": o, "destination": "XXX", "delay_min": d, "distance_mi": 100, "event_time_ms": t,
         "event_id": i, "dead_letter_reason": None, "raw_value": None, "kafka_partition": SLOT, "kafka_offset": i}
        for i, (o, t, d) in enumerate(events)
    ]
    records += [
        {"origin": None, "destination": None, "delay_min": None, "distance_mi": None, "event_time_ms": None,
         "event_id": None, "dead_letter_reason": reason, "raw_value": raw, "kafka_partition": SLOT, "kafka_offset": 1000 + i}
        for i, (reason, raw) in enumerate(dead)
    ]
    partials = partials_of(pd.DataFrame(records, columns=list(INPUT_COLUMNS)), lambda origin: TOKEN, np.array(TOKENS), HOUR_MS)
    assert set(partials["token"]) <= {TOKEN}
    return partials


@pytest.fixture
def tester():
    # lateness is the processor's own decision (window end <= watermark), so let every row in
    return TwsTester(FlightDelayProcessor(TOKENS), timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)


def kind(frame, name):
    if "kind" not in frame:  # the tester returns a frame without columns when nothing was emitted
        return pd.DataFrame()
    return frame[frame["kind"] == name].reset_index(drop=True)


def test_windows_close_only_when_the_watermark_reaches_their_end(tester):
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 10), ("ORD", T0 + 2, 50), ("LGA", T0 + HOUR_MS + 5, -3)))
    assert kind(out, "window").empty
    load = kind(out, "load")
    assert load["count"].tolist() == [3] and load["slot"].tolist() == [SLOT]

    # (TwsTester fires a timer at expiry <= watermark, Spark at expiry < watermark: stay 2 ms short)
    assert tester.setWatermark(T0 + HOUR_MS - 2).pipe(kind, "window").empty
    closed = kind(tester.setWatermark(T0 + HOUR_MS), "window")
    assert closed[["origin", "window_start_ms", "window_end_ms", "count", "sum_delay_min", "max_delay_min"]].values.tolist() == [
        ["ORD", T0, T0 + HOUR_MS, 2, 60, 50]
    ]
    assert closed["mean_delay_min"].tolist() == [30.0]
    assert closed["slot"].tolist() == [SLOT]
    later = kind(tester.setWatermark(T0 + 2 * HOUR_MS), "window")
    assert later[["origin", "count", "sum_delay_min", "max_delay_min"]].values.tolist() == [["LGA", 1, -3, -3]]


def test_batches_merge_into_the_same_pending_window(tester):
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 10, 5), ("ORD", T0 + 20, 7)))
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 30, 100)))
    closed = kind(tester.setWatermark(T0 + HOUR_MS), "window")
    assert closed[["count", "sum_delay_min", "max_delay_min"]].values.tolist() == [[3, 112, 100]]


@pytest.mark.parametrize(
    ("delays", "alert"),
    [
        ([30] * 5, True),  # mean exactly 30 over exactly 5 flights
        ([30] * 4, False),  # too few flights
        ([29, 30, 30, 30, 30], False),  # mean 29.8
        ([-100, 200, 30, 30, 30], True),  # early and very late flights average out to 38
    ],
)
def test_alert_rule(tester, delays, alert):
    tester.testInPandas(TOKEN, rows(*[("ORD", T0 + i, d) for i, d in enumerate(delays)]))
    assert kind(tester.setWatermark(T0 + HOUR_MS), "window")["alert"].tolist() == [alert]


def test_events_of_closed_windows_are_late_and_kept(tester):
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 1)))
    tester.setWatermark(T0 + HOUR_MS)  # closes hour 0
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + 5, 99), ("ORD", T0 + HOUR_MS, 4)))
    late = kind(out, "late")
    assert late[["origin", "event_time_ms", "delay_min", "window_end_ms", "watermark_ms", "event_id", "destination", "kafka_offset"]].values.tolist() == [
        ["ORD", T0 + 5, 99, T0 + HOUR_MS, T0 + HOUR_MS, 0, "XXX", 0]
    ]
    assert kind(out, "load")["count"].tolist() == [2]  # the late event was processed, not dropped
    assert kind(tester.setWatermark(T0 + 2 * HOUR_MS), "window")["count"].tolist() == [1]


def test_dead_letters_pass_through_with_reason(tester):
    out = tester.testInPandas(TOKEN, rows(("ORD", T0, 1), dead=[("missing origin", '{"event_id": 1}')]))
    dead = kind(out, "dead_letter")
    assert dead[["dead_letter_reason", "raw_value", "kafka_partition"]].values.tolist() == [["missing origin", '{"event_id": 1}', SLOT]]
    assert kind(out, "load")["count"].tolist() == [2]


def test_merge_partials():
    starts, counts, sums, maxes = merge_partials(
        np.array([7, 3, 7]), np.array([1, 2, 3]), np.array([10, 20, 30]), np.array([5, -1, 9])
    )
    assert starts.tolist() == [3, 7]
    assert counts.tolist() == [2, 4]
    assert sums.tolist() == [20, 40]
    assert maxes.tolist() == [-1, 9]


def test_pending_windows_pack_round_trip():
    arrays = (np.array([3, 7]), np.array([2, 4]), np.array([20, -40]), np.array([-1, 9]))
    assert [a.tolist() for a in unpack_pending(pack_pending(*arrays))] == [a.tolist() for a in arrays]


def test_local_merge_partials_add_up():
    """Local Merge keeps every event: counts add up, and each partial lists its events."""
    events = [("ORD", T0 + i * 600_000, i) for i in range(12)] + [("LGA", T0 + 5, 7)]  # ORD spans 2 hours
    partials = rows(*events, dead=[("empty value", None)])
    assert partials["count"].sum() == 14
    ord_partials = partials[partials["origin"] == "ORD"].sort_values("window_start_ms")
    assert ord_partials["count"].tolist() == [6, 6]
    assert ord_partials["sum_delay_min"].tolist() == [sum(range(6)), sum(range(6, 12))]
    assert [list(ids) for ids in ord_partials["event_ids"]] == [list(range(6)), list(range(6, 12))]
    dead = partials[partials["dead_letter_reason"].notna()]
    assert dead["kafka_offsets"].map(list).tolist() == [[1000]]
