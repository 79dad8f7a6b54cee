"""Watermark modes of the processor in memory (pyspark's TwsTester): per-key lateness (paper 000
§4.1, Figure 8's situation: one source far behind another), nkey groups, the dynamic bound,
silent keys and their state, and split keys' pieces held until every piece closed a window."""

import time

import numpy as np
import pandas as pd
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.eventtime.watermarks import KeyClock, WatermarkPolicy, watermark_key
from keyshift.eventtime.windows import HOUR_MS
from keyshift.placement.tokens import slot_tokens
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators.local_merge import input_columns, partials_of
from keyshift.processing.outputs.pieces import PieceAssembler
from keyshift.jobs.spec import window_columns
from keyshift.processing.outputs.sinks import window_row_columns
from keyshift.processing.operators.processor import CLOCK_STATE_NAME, PENDING_STATE_NAME, KeyedWindowProcessor, unpack_pending


def partials_of_flights(events, *args, **kwargs):
    """`partials_of` for the flight delay job's spec."""
    return partials_of(events, FLIGHT_DELAYS, *args, **kwargs)

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
MINUTE = 60_000
TOKENS = slot_tokens(8)
SLOT = 3
TOKEN = TOKENS[SLOT]
_next_id = iter(range(10**6))


def rows(*events, partition=SLOT):
    """Processor input (Local Merge partials) for events (origin, event_time_ms, delay_min)."""
    records = []
    for o, t, d in events:
        i = next(_next_id)
        records.append({"origin": o, "destination": "X", "delay_min": d, "distance_mi": 1, "event_time_ms": t, "event_id": i,
                        "dead_letter_reason": None, "raw_value": None, "raw_encoding": None, "raw_key_base64": None,
                        "kafka_partition": partition, "kafka_offset": i})
    return partials_of_flights(pd.DataFrame(records, columns=list(input_columns(FLIGHT_DELAYS))), lambda origin: TOKEN, np.array(TOKENS), HOUR_MS)


def make_tester(mode, bound_ms=10 * MINUTE, **policy):
    processor = KeyedWindowProcessor(FLIGHT_DELAYS, TOKENS, policy=WatermarkPolicy(mode=mode, bound_ms=bound_ms, **policy))
    return TwsTester(processor, timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)


def key_state(tester):
    """`key`/`dynamic` mode: key -> (open windows, its clock or None), both from the key's one
    pending-windows value."""
    state = dict(tester.peekMapState(PENDING_STATE_NAME, TOKEN) or {})
    return {key[0]: (len(unpack_pending(value[0], len(FLIGHT_DELAYS.aggregates))[0]), KeyClock.unpack(value[2])) for key, value in state.items()}


def kind(frame, name):
    if "kind" not in frame:
        return pd.DataFrame()
    return frame[frame["kind"] == name].reset_index(drop=True)


def test_a_key_far_behind_another_is_late_only_against_its_own_watermark():
    """Paper 000 Figure 8: source A (key FAST) is 3 h of event time ahead of source B (SLOW). A
    global watermark (3 h - bound) makes every SLOW event late; key watermarks make none late."""
    batch = [("FAST", T0 + 3 * HOUR_MS + m * MINUTE, 5) for m in range(5)] + [("SLOW", T0 + m * MINUTE, 7) for m in range(5)]
    per_key = make_tester("key")
    out = per_key.testInPandas(TOKEN, rows(*batch))
    assert kind(out, "late").empty
    # the next batch: SLOW goes on where it was, still 3 h behind FAST; nothing is late
    out = per_key.testInPandas(TOKEN, rows(("SLOW", T0 + 30 * MINUTE, 1), ("FAST", T0 + 3 * HOUR_MS + 30 * MINUTE, 2)))
    assert kind(out, "late").empty
    marks = kind(out, "watermark").set_index("origin")["watermark_ms"]
    assert marks["SLOW"] == T0 + 20 * MINUTE and marks["FAST"] == T0 + 3 * HOUR_MS + 20 * MINUTE

    # global mode, same bound: Spark's watermark after batch 1 is FAST's max - bound
    global_mode = TwsTester(KeyedWindowProcessor(FLIGHT_DELAYS, TOKENS), timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    global_mode.testInPandas(TOKEN, rows(*batch))
    global_mode.setWatermark(T0 + 3 * HOUR_MS + 4 * MINUTE - 10 * MINUTE)
    late = kind(global_mode.testInPandas(TOKEN, rows(("SLOW", T0 + 30 * MINUTE, 1))), "late")
    assert late["origin"].tolist() == ["SLOW"]


def test_a_keys_windows_close_as_soon_as_its_own_watermark_passes_them():
    per_key = make_tester("key")
    per_key.testInPandas(TOKEN, rows(("ORD", T0 + 5 * MINUTE, 10), ("ORD", T0 + 50 * MINUTE, 30), ("LGA", T0 + MINUTE, 1)))
    # ORD reaches 1:11 -> its watermark 1:01 passes 1:00: its first window closes in this very batch
    out = per_key.testInPandas(TOKEN, rows(("ORD", T0 + HOUR_MS + 11 * MINUTE, 0)))
    closed = kind(out, "window")
    assert closed[["origin", "window_start_ms", "count", "sum_delay_min", "max_delay_min"]].values.tolist() == [["ORD", T0, 2, 40, 30]]
    assert closed["watermark_ms"].tolist() == [T0 + HOUR_MS + MINUTE]
    # LGA saw nothing new: its window stays open
    assert per_key.peekMapState(PENDING_STATE_NAME, TOKEN) is not None
    # an ORD event of the closed hour is now late, against ORD's watermark; an LGA event of it is not
    out = per_key.testInPandas(TOKEN, rows(("ORD", T0 + 59 * MINUTE, 3), ("LGA", T0 + 59 * MINUTE, 4)))
    late = kind(out, "late")
    assert late["origin"].tolist() == ["ORD"] and late["watermark_ms"].tolist() == [T0 + HOUR_MS + MINUTE]


def test_nkey_keys_of_one_group_share_a_watermark():
    one_group = make_tester("nkey", groups=1)
    assert watermark_key("FAST", WatermarkPolicy(mode="nkey", groups=1)) == watermark_key("SLOW", WatermarkPolicy(mode="nkey", groups=1))
    one_group.testInPandas(TOKEN, rows(("FAST", T0 + 3 * HOUR_MS, 5), ("SLOW", T0, 7)))
    late = kind(one_group.testInPandas(TOKEN, rows(("SLOW", T0 + MINUTE, 1))), "late")
    assert late["origin"].tolist() == ["SLOW"]  # FAST moved the group's watermark past SLOW's hour
    clocks = dict(one_group.peekMapState(CLOCK_STATE_NAME, TOKEN))
    assert len(clocks) == 1  # one clock for the group, not one per key


def test_dynamic_bound_waits_longer_after_a_burst_of_disorder_and_relaxes_after_it():
    dynamic = make_tester("dynamic", bound_ms=30 * MINUTE, history=8)
    # in order: the bound is 0, the watermark is the key's max event time
    out = dynamic.testInPandas(TOKEN, rows(*[("ORD", T0 + m * MINUTE, 0) for m in range(8)]))
    assert kind(out, "watermark")["watermark_ms"].tolist() == [T0 + 7 * MINUTE]
    # a burst of disorder: events 20 min behind the max arrive; the wait grows
    out = dynamic.testInPandas(TOKEN, rows(("ORD", T0 + 40 * MINUTE, 0), ("ORD", T0 + 20 * MINUTE, 0), ("ORD", T0 + 41 * MINUTE, 0)))
    disorderly = int(kind(out, "watermark")["watermark_ms"].iloc[0])
    assert disorderly <= T0 + 41 * MINUTE - 20 * MINUTE
    # k ordered events later the bound is back to 0 (the watermark never goes back)
    out = dynamic.testInPandas(TOKEN, rows(*[("ORD", T0 + (42 + m) * MINUTE, 0) for m in range(8)]))
    assert kind(out, "watermark")["watermark_ms"].tolist() == [T0 + 49 * MINUTE]


def test_a_silent_key_closes_through_the_fallback_and_its_state_is_freed():
    per_key = make_tester("key")
    per_key.testInPandas(TOKEN, rows(("ORD", T0 + 5 * MINUTE, 10)))
    windows, clock = key_state(per_key)["ORD"]
    assert windows == 1 and clock.max_event_time_ms == T0 + 5 * MINUTE  # the clock lives in the key's one value
    assert not dict(per_key.peekMapState(CLOCK_STATE_NAME, TOKEN) or {})  # key mode does not use the group map
    # the stream moves on (Spark's watermark = max event time - idle lag) past ORD's window
    closed = kind(per_key.setWatermark(T0 + HOUR_MS + 1), "window")
    assert closed[["origin", "count"]].values.tolist() == [["ORD", 1]]
    # its own watermark (closed through T0 + 1 h) no longer raises it above the fallback: the clock is freed, and with it the value
    assert key_state(per_key) == {}


def test_a_key_whose_windows_closed_keeps_its_clock_while_it_raises_the_key_above_the_fallback():
    per_key = make_tester("key")
    per_key.testInPandas(TOKEN, rows(("ORD", T0 + 5 * MINUTE, 10), ("ORD", T0 + HOUR_MS + 30 * MINUTE, 2)))
    assert key_state(per_key)["ORD"][0] == 1  # its own watermark (1:20) closed the first hour at once
    per_key.setWatermark(T0 + HOUR_MS + 25 * MINUTE)  # nothing to close: the state is left alone
    per_key.testInPandas(TOKEN, rows(("ORD", T0 + 2 * HOUR_MS + 40 * MINUTE, 4)))
    windows, clock = key_state(per_key)["ORD"]
    assert windows == 1 and clock.closed_through_ms == T0 + 2 * HOUR_MS
    late = kind(per_key.testInPandas(TOKEN, rows(("ORD", T0 + HOUR_MS + 59 * MINUTE, 1))), "late")
    assert late["origin"].tolist() == ["ORD"]  # against its own watermark (2:30), not the fallback (1:25)
    per_key.setWatermark(T0 + 3 * HOUR_MS + 1)  # the fallback passes the last window and the clock
    assert key_state(per_key) == {}


def test_timeout_fallback_closes_a_silent_keys_windows_and_keeps_them_closed():
    per_key = make_tester("key", idle_fallback="timeout", idle_timeout_s=0.05)
    per_key.testInPandas(TOKEN, rows(("ORD", T0 + 5 * MINUTE, 10), ("LGA", T0 + 5 * MINUTE, 1)))
    time.sleep(0.1)
    out = per_key.testInPandas(TOKEN, rows(("LGA", T0 + 6 * MINUTE, 2)))
    closed = kind(out, "window")
    assert "ORD" in closed["origin"].tolist() and closed.set_index("origin").loc["ORD", "count"] == 1
    # a later ORD event of the closed hour is late, never a second window
    late = kind(per_key.testInPandas(TOKEN, rows(("ORD", T0 + 7 * MINUTE, 3))), "late")
    assert late["origin"].tolist() == ["ORD"]


def window_row(origin, slot, start, count, total, top):
    return {"kind": "window", "slot": slot, "origin": origin, "window_start_ms": start, "window_end_ms": start + HOUR_MS,
            "count": count, "sum_delay_min": total, "max_delay_min": top, "mean_delay_min": total / count, "alert": False}


def marks(*rows_):
    return pd.DataFrame([{"origin": o, "slot": s, "watermark_ms": w} for o, s, w in rows_], columns=["origin", "slot", "watermark_ms"])


def test_a_split_keys_window_is_written_once_every_piece_has_closed_it(tmp_path):
    assembler = PieceAssembler(FLIGHT_DELAYS, tmp_path, {"ORD": (1, 2)})
    first = pd.DataFrame([window_row("ORD", 1, T0, 3, 30, 20), window_row("LGA", 4, T0, 1, 5, 5)])
    out, merged = assembler.assemble(first, marks(("ORD", 1, T0 + HOUR_MS), ("ORD", 2, T0 + 10 * MINUTE)), T0 - HOUR_MS, 0)
    assert out["origin"].tolist() == ["LGA"] and merged == 0  # ORD's piece on slot 2 has not closed the hour
    assert assembler.held_events(0) == 3
    second = pd.DataFrame([window_row("ORD", 2, T0, 2, 100, 90)])
    out, merged = assembler.assemble(second, marks(("ORD", 2, T0 + HOUR_MS + MINUTE)), T0 - HOUR_MS, 1)
    assert out[["origin", "slot", "count", "sum_delay_min", "max_delay_min"]].values.tolist() == [["ORD", 1, 5, 130, 90]]
    assert merged == 1 and assembler.held_events(1) == 0
    # Spark replays batch 1 after a crash: it starts from the pieces held after batch 0 again
    again, _ = PieceAssembler(FLIGHT_DELAYS, tmp_path, {"ORD": (1, 2)}).assemble(second, marks(("ORD", 2, T0 + HOUR_MS + MINUTE)), T0 - HOUR_MS, 1)
    assert again[["count", "sum_delay_min"]].values.tolist() == [[5, 130]]


def test_pieces_held_with_every_output_column_merge_with_a_batch_of_window_columns_only(tmp_path):
    # a run written before the sink kept only a window row's columns resumes: its snapshot holds
    # the pieces with all of the processor's columns, the new batch has window_row_columns only
    wide = {**window_row("ORD", 1, T0, 3, 30, 20), "dead_letter_reason": None, "raw_value": None, "event_id": np.nan}
    PieceAssembler(FLIGHT_DELAYS, tmp_path, {"ORD": (1, 2)}).assemble(
        pd.DataFrame([wide]), marks(("ORD", 1, T0 + HOUR_MS), ("ORD", 2, T0 + 10 * MINUTE)), T0 - HOUR_MS, 0)
    columns = list(window_row_columns(FLIGHT_DELAYS))
    second = pd.DataFrame([window_row("ORD", 2, T0, 2, 100, 90), window_row("LGA", 4, T0, 1, 5, 5)])[columns]
    out, merged = PieceAssembler(FLIGHT_DELAYS, tmp_path, {"ORD": (1, 2)}).assemble(
        second, marks(("ORD", 2, T0 + HOUR_MS + MINUTE)), T0 - HOUR_MS, 1)
    assert list(out.columns) == columns and merged == 1
    assert out.sort_values("origin")[["origin", "slot", "count", "sum_delay_min", "max_delay_min"]].values.tolist() == [
        ["LGA", 4, 1, 5, 5], ["ORD", 1, 5, 130, 90]]


def test_window_row_columns_are_the_window_table_columns_before_slot_and_epoch():
    columns = window_row_columns(FLIGHT_DELAYS)
    assert set(window_columns(FLIGHT_DELAYS)) - {"window_start", "window_end", "epoch"} <= set(columns)
    assert {"kind", "dead_letter_reason", "raw_value", "event_id", "kafka_offset"}.isdisjoint(columns)


def test_a_piece_without_events_in_the_window_completes_it_by_its_watermark_or_the_fallback(tmp_path):
    assembler = PieceAssembler(FLIGHT_DELAYS, tmp_path, {"ORD": (1, 2)})
    out, _ = assembler.assemble(pd.DataFrame([window_row("ORD", 1, T0, 3, 30, 20)]), marks(("ORD", 1, T0 + HOUR_MS)), None, 0)
    assert out.empty
    out, _ = assembler.assemble(pd.DataFrame(columns=list(out.columns)), marks(), T0 + HOUR_MS, 1)  # the fallback passes the end
    assert out["count"].tolist() == [3]
