"""KeyedWindowProcessor in memory (pyspark's TwsTester): windows, lateness, dead letters, loads."""

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.eventtime.windows import HOUR_MS
from keyshift.placement.tokens import slot_tokens
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators.local_merge import input_columns, partials_of
from keyshift.processing.operators.processor import PENDING_STATE_NAME, KeyedWindowProcessor, merge_partials, pack_pending, unpack_pending


def partials_of_flights(events, *args, **kwargs):
    """`partials_of` for the flight delay job's spec."""
    return partials_of(events, FLIGHT_DELAYS, *args, **kwargs)

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
TOKENS = slot_tokens(8)
SLOT = 3
TOKEN = TOKENS[SLOT]


def rows(*events, dead=(), ids=None, offsets=None, partition=SLOT):
    """Processor input made by Local Merge from events (origin, event_time_ms, delay_min) and dead
    letters (reason, raw), all read from Kafka partition `partition`. Event i has id `ids[i]` and
    offset `offsets[i]` (default: i for both)."""
    ids = list(range(len(events))) if ids is None else ids
    offsets = list(range(len(events))) if offsets is None else offsets
    records = [
        {"origin": o, "destination": f"D{j}", "delay_min": d, "distance_mi": 100 + j, "event_time_ms": t,
         "event_id": ids[j], "dead_letter_reason": None, "raw_value": None, "raw_encoding": None, "raw_key_base64": None,
         "kafka_partition": partition, "kafka_offset": offsets[j]}
        for j, (o, t, d) in enumerate(events)
    ]
    records += [
        {"origin": None, "destination": None, "delay_min": None, "distance_mi": None, "event_time_ms": None,
         "event_id": None, "dead_letter_reason": reason, "raw_value": raw, "raw_encoding": None if raw is None else "utf-8",
         "raw_key_base64": "T1JE", "kafka_partition": partition, "kafka_offset": 1000 + i}
        for i, (reason, raw) in enumerate(dead)
    ]
    partials = partials_of_flights(pd.DataFrame(records, columns=list(input_columns(FLIGHT_DELAYS))), lambda origin: TOKEN, np.array(TOKENS), HOUR_MS)
    assert set(partials["token"]) <= {TOKEN}
    return partials


@pytest.fixture
def tester():
    # lateness is the processor's own decision (window end <= watermark), so let every row in
    return TwsTester(KeyedWindowProcessor(FLIGHT_DELAYS, TOKENS), timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)


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
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 30, 100), ids=[2]))  # a new event, not a copy of event 0
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
        ["ORD", T0 + 5, 99, T0 + HOUR_MS, T0 + HOUR_MS, 0, "D0", 0]
    ]
    assert kind(out, "load")["count"].tolist() == [2]  # the late event was processed, not dropped
    assert kind(tester.setWatermark(T0 + 2 * HOUR_MS), "window")["count"].tolist() == [1]


def test_dead_letters_pass_through_with_reason(tester):
    out = tester.testInPandas(TOKEN, rows(("ORD", T0, 1), dead=[("missing origin", '{"event_id": 1}')]))
    dead = kind(out, "dead_letter")
    assert dead[["dead_letter_reason", "raw_value", "raw_encoding", "raw_key_base64", "kafka_partition"]].values.tolist() == [
        ["missing origin", '{"event_id": 1}', "utf-8", "T1JE", SLOT]
    ]
    assert kind(out, "load")["count"].tolist() == [2]


def test_merge_partials():
    starts, counts, (sums, maxes) = merge_partials(
        FLIGHT_DELAYS, np.array([7, 3, 7]), np.array([1, 2, 3]), np.array([[10, 20, 30], [5, -1, 9]])
    )
    assert starts.tolist() == [3, 7]
    assert counts.tolist() == [2, 4]
    assert sums.tolist() == [20, 40]
    assert maxes.tolist() == [-1, 9]


def test_a_batch_whose_every_event_is_late_touches_no_state(tester):
    """Issue 8, point 2: once the watermark had jumped ahead, a batch of nothing but late events
    crashed with IndexError (an empty group of origins); they are late and nothing else happens."""
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 1)))
    tester.setWatermark(T0 + 100 * HOUR_MS)
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + 2, 5), ("LGA", T0 + 3, 6), dead=[("empty value", None)]))
    assert sorted(kind(out, "late")["origin"]) == ["LGA", "ORD"]
    assert kind(out, "load")["count"].tolist() == [3]
    assert kind(out, "dead_letter")["dead_letter_reason"].tolist() == ["empty value"]


def pending_ids(tester, origin):
    """The event ids the state keeps for `origin` (the dedup horizon), window by window."""
    state = tester.peekMapState(PENDING_STATE_NAME, TOKEN)
    return np.frombuffer(state[(origin,)][1], dtype=np.int64).tolist() if (origin,) in state else []


def test_a_duplicate_of_an_earlier_batch_is_counted_once_and_reported(tester):
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 10), ("ORD", T0 + 2, 20), ids=[100, 101]))
    # event 100 again (another delay, even another hour), with a new one; LGA's 100 is another event
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + HOUR_MS + 5, 999), ("ORD", T0 + 3, 30), ("LGA", T0 + 4, 40), ids=[100, 102, 100], offsets=[50, 51, 52]))
    dead = kind(out, "dead_letter")
    assert dead[["dead_letter_reason", "origin", "event_id", "delay_min", "event_time_ms", "destination", "distance_mi", "kafka_partition", "kafka_offset"]].values.tolist() == [
        ["duplicate event_id", "ORD", 100, 999, T0 + HOUR_MS + 5, "D0", 100, SLOT, 50]
    ]
    assert kind(out, "load")["count"].tolist() == [3]  # processed: 2 into windows + 1 dead letter
    closed = kind(tester.setWatermark(T0 + 2 * HOUR_MS), "window").sort_values(["origin", "window_start_ms"])
    assert closed[["origin", "window_start_ms", "count", "sum_delay_min", "max_delay_min"]].values.tolist() == [
        ["LGA", T0, 1, 40, 40],
        ["ORD", T0, 3, 60, 30],  # 10 + 20 + 30: the copy of event 100 (delay 999) is not in any window
    ]


def test_copies_within_one_batch_keep_the_lowest_kafka_position(tester):
    # the three copies of event 5 arrive in two chunks in an order the shuffle may choose
    first = rows(("ORD", T0 + 1, 1), ("ORD", T0 + 2, 2), ids=[5, 5], offsets=[70, 40], partition=6)
    second = rows(("ORD", T0 + 3, 3), ("ORD", T0 + 4, 4), ids=[5, 6], offsets=[90, 91], partition=2)
    out = tester.testInPandas(TOKEN, pd.concat([first, second], ignore_index=True))
    dead = kind(out, "dead_letter")
    assert sorted(dead[["kafka_partition", "kafka_offset"]].values.tolist()) == [[6, 40], [6, 70]]  # (2, 90) kept
    assert set(dead["dead_letter_reason"]) == {"duplicate event_id"}
    closed = kind(tester.setWatermark(T0 + HOUR_MS), "window")
    assert closed[["count", "sum_delay_min", "max_delay_min"]].values.tolist() == [[2, 7, 4]]  # delays 3 and 4


def test_only_duplicates_leave_the_state_as_it_was(tester):
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 10), ids=[1]))
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 10), ("ORD", T0 + 1, 10), ids=[1, 1], offsets=[8, 9]))
    assert len(kind(out, "dead_letter")) == 2
    assert kind(tester.setWatermark(T0 + HOUR_MS), "window")["count"].tolist() == [1]


def test_the_dedup_horizon_ends_when_the_window_closes(tester):
    """A copy of an event whose window has closed is late, not a duplicate (and not counted)."""
    tester.testInPandas(TOKEN, rows(("ORD", T0 + HOUR_MS + 1, 20), ("ORD", T0 + 1, 10), ids=[2, 1]))
    assert pending_ids(tester, "ORD") == [1, 2]  # window by window
    tester.setWatermark(T0 + HOUR_MS)  # closes hour 0: event 1 leaves the horizon, event 2 stays
    assert pending_ids(tester, "ORD") == [2]
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + 1, 10), ("ORD", T0 + HOUR_MS + 1, 20), ids=[1, 2], offsets=[5, 6]))
    assert kind(out, "late")["event_id"].tolist() == [1]
    assert kind(out, "dead_letter")["event_id"].tolist() == [2]
    assert kind(tester.setWatermark(T0 + 2 * HOUR_MS), "window")["count"].tolist() == [1]


def test_pending_windows_pack_round_trip():
    starts, counts, aggregates = np.array([3, 7]), np.array([2, 4]), np.array([[20, -40], [-1, 9]])
    got = unpack_pending(pack_pending(starts, counts, aggregates), 2)
    assert [got[0].tolist(), got[1].tolist(), got[2].tolist()] == [starts.tolist(), counts.tolist(), aggregates.tolist()]


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


def _timers(tester) -> list[int]:
    tester.handle.setGroupingKey(TOKEN)
    return sorted(tester.handle.listTimers())


def test_a_slot_keeps_one_timer_at_its_earliest_window_end_and_every_window_still_closes(tester):
    # 48 hourly windows of two keys in one batch: one timer, at the first window's end - 1
    events = [(origin, T0 + h * HOUR_MS + 7, h) for h in range(48) for origin in ("ORD", "LGA")]
    tester.testInPandas(TOKEN, rows(*events))
    assert _timers(tester) == [T0 + HOUR_MS - 1]
    # a later batch whose windows end later adds no timer
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 60 * HOUR_MS, 1), ids=[1000]))
    assert _timers(tester) == [T0 + HOUR_MS - 1]
    # a pass closes what is due and sets the next timer at the next window end
    closed = kind(tester.setWatermark(T0 + 10 * HOUR_MS), "window")
    assert sorted(set(closed["window_start_ms"])) == [T0 + h * HOUR_MS for h in range(10)] and len(closed) == 20
    assert _timers(tester) == [T0 + 11 * HOUR_MS - 1]
    rest = kind(tester.setWatermark(T0 + 100 * HOUR_MS), "window")
    assert len(rest) == 2 * 38 + 1 and rest["count"].sum() == 77
    assert _timers(tester) == []  # nothing pending, no timer


def test_in_key_mode_the_slot_timer_is_the_earliest_clock_or_window_wake_up():
    from keyshift.eventtime.watermarks import WatermarkPolicy

    bound = 100 * HOUR_MS  # no key's own watermark passes a window of this batch: all stay pending
    tester = TwsTester(KeyedWindowProcessor(FLIGHT_DELAYS, TOKENS, policy=WatermarkPolicy(mode="key", bound_ms=bound)),
                       timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    tester.testInPandas(TOKEN, rows(*[(o, T0 + h * HOUR_MS + 7, h) for h in range(48) for o in ("ORD", "LGA")]))
    # each clock's own watermark (max - bound) is below its windows' ends: the earliest one wakes the slot
    own = T0 + 47 * HOUR_MS + 7 - bound
    assert _timers(tester) == [own - 1]
    closed = kind(tester.setWatermark(T0 + 100 * HOUR_MS), "window")  # the fallback passes everything
    assert len(closed) == 96 and closed["count"].sum() == 96
    assert _timers(tester) == [] and list(tester.handle.getMapState(PENDING_STATE_NAME, None, None).keys()) == []  # clocks freed with the windows
