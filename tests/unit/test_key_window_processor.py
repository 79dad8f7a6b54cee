"""KeyWindowProcessor in memory (pyspark's TwsTester): key window updates micro-batch by
micro-batch equal the batch result of all events, late events go out as `late`, key-level
watermarks keep a slow key on time while a fast key advances, timers flush at the end of input,
state calls stay per key and batch, and the declared state survives a move to another slot."""

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.errors import ConfigurationError
from keyshift.eventtime.key_windows import KeyWindowState, SlidingWindow, key_window_updates_by_key
from keyshift.eventtime.watermarks import WatermarkPolicy
from keyshift.migration.state import rekey_state
from keyshift.processing.operators.state_variables import initial_state_schema
from keyshift.placement.tokens import slot_tokens
from keyshift.processing.operators.key_window_processor import (
    CLOCK_STATE_NAME,
    END_OF_INPUT_EVENT_TIME_MS,
    KEY_WINDOW_STATE_VARIABLES,
    WINDOW_STATE_NAME,
    KeyWindowColumns,
    KeyWindowProcessor,
    key_window_output_schema,
)

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
MINUTE = 60_000
HOUR = 60 * MINUTE
WINDOW = SlidingWindow(HOUR, MINUTE)
TOKENS = slot_tokens(8)
SLOT = 3
TOKEN = TOKENS[SLOT]
COLUMNS = KeyWindowColumns(key="sensor", value="reading")
INPUT = ["sensor", "event_time_ms", "reading", "event_id", "kafka_partition", "kafka_offset", "token"]
_ids = iter(range(10**9))


def rows(*events, token=TOKEN, first_id=None):
    """Processor input for events (sensor, event_time_ms, reading), in this arrival order (ids
    and offsets from `first_id` on, or fresh ones)."""
    records = []
    for j, (sensor, t, v) in enumerate(events):
        i = next(_ids) if first_id is None else first_id + j
        records.append((sensor, int(t), int(v), i, SLOT, i, token))
    return pd.DataFrame(records, columns=INPUT).astype({"event_time_ms": np.int64, "reading": np.int64, "event_id": np.int64})


def marker(token=TOKEN):
    """An end-of-input marker row: NULL key, far-future event time."""
    return pd.DataFrame([(None, END_OF_INPUT_EVENT_TIME_MS, 0, -1, SLOT, -1, token)], columns=INPUT)


def make_tester(mode="global", bound_ms=10 * MINUTE, **policy):
    processor = KeyWindowProcessor(TOKENS, WINDOW, WatermarkPolicy(mode=mode, bound_ms=bound_ms, **policy), COLUMNS)
    # the processor decides lateness itself: let every row in
    return TwsTester(processor, timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)


def kind(frame, name):
    if "kind" not in frame:  # the tester returns a frame without columns when nothing was emitted
        return pd.DataFrame(columns=["kind", "sensor", "start_ms", "count", "sum", "max", "watermark_ms"])
    return frame[frame["kind"] == name].reset_index(drop=True)


def concat(frames, **options):
    """`pd.concat` without the empty frames (pandas deprecates letting them decide dtypes)."""
    kept = [f for f in frames if len(f)]
    return pd.concat(kept or frames[:1], **options)


def as_updates(outputs):
    """The `key_window` rows of several outputs as an updates frame sorted by (sensor, start_ms)."""
    frames = [kind(o, "key_window") for o in outputs]
    updates = concat(frames, ignore_index=True)[["sensor", "start_ms", "count", "sum", "max"]]
    updates = updates.sort_values(["sensor", "start_ms"], kind="stable", ignore_index=True)
    return updates.astype({"start_ms": np.int64, "count": np.int64, "sum": np.int64, "max": "Int64"})


def expected(events):
    frame = pd.DataFrame(events, columns=["sensor", "event_time_ms", "reading"])
    updates = key_window_updates_by_key(frame, WINDOW, key="sensor", time="event_time_ms", value="reading")
    return updates.astype({"sensor": object})


def disordered_events(seed, n=3000, keys=("A", "B", "C", "D"), disorder_ms=8 * MINUTE):
    """n events over ~2 days, keys skewed, each event at most `disorder_ms` behind the latest one
    before it (so neither Spark's nor a key's watermark with a 10-minute bound makes it late)."""
    rng = np.random.default_rng(seed)
    base = T0 + np.sort(rng.integers(0, 2 * 24 * HOUR, n))
    times = base - rng.integers(0, disorder_ms, n) * (rng.random(n) < 0.3)
    sensors = rng.choice(np.array(keys, dtype=object), n, p=np.linspace(4, 1, len(keys)) / np.linspace(4, 1, len(keys)).sum())
    values = rng.integers(-30, 300, n)
    return list(zip(sensors, times.tolist(), values.tolist()))


def feed(tester, events, batch, spark_delay_ms):
    """Feed `events` in batches, moving Spark's watermark between them (max event time seen -
    delay), then the end-of-input marker and the watermark it makes; return every output."""
    outputs, top = [], None
    for start in range(0, len(events), batch):
        chunk = events[start:start + batch]
        outputs.append(tester.testInPandas(TOKEN, rows(*chunk, first_id=start)))
        top = max(t for _, t, _ in chunk) if top is None else max(top, max(t for _, t, _ in chunk))
        if top - spark_delay_ms > tester._currentWatermarkMs:
            outputs.append(tester.setWatermark(top - spark_delay_ms))
    outputs.append(tester.testInPandas(TOKEN, marker()))
    outputs.append(tester.setWatermark(END_OF_INPUT_EVENT_TIME_MS - spark_delay_ms))
    return outputs


@pytest.mark.parametrize("mode", ["global", "key", "nkey", "dynamic"])
@pytest.mark.parametrize("batch", [97, 700])
def test_incremental_batches_emit_exactly_the_key_window_updates_of_all_events(mode, batch):
    events = disordered_events(seed=batch)
    policy = dict(idle_lag_ms=6 * HOUR, groups=2) if mode != "global" else {}
    tester = make_tester(mode, **policy)
    outputs = feed(tester, events, batch, WatermarkPolicy(mode=mode, bound_ms=10 * MINUTE, **policy).spark_delay_ms)
    assert sum(int(kind(o, "load")["count"].sum()) for o in outputs) == len(events)  # the marker is not an event
    late = concat([kind(o, "late") for o in outputs], ignore_index=True)
    if mode == "dynamic":  # its bound follows the recent disorder (0 after k ordered events): some are late by design
        late_ids = set(late["event_id"].astype(int))
        assert len(late_ids) < len(events) // 10
        on_time = [e for i, e in enumerate(events) if i not in late_ids]
    else:
        assert late.empty
        on_time = events
    got = as_updates(outputs)
    pd.testing.assert_frame_equal(got, expected(on_time))
    # most updates went out batch by batch as the watermarks passed them, not at the flush
    assert sum(len(kind(o, "key_window")) for o in outputs[:-1]) > 0.9 * len(got)
    assert len(got) <= 2 * len(events)
    # every update was emitted once its key's watermark passed start + size, never before
    windows = concat([kind(o, "key_window") for o in outputs])
    assert (windows["start_ms"] + HOUR <= windows["watermark_ms"]).all()
    assert (windows["slot"] == SLOT).all()


def test_updates_are_emitted_as_the_watermark_passes_them_and_not_before():
    tester = make_tester("global")
    out = tester.testInPandas(TOKEN, rows(("A", T0 + 5 * MINUTE + 7, 10), ("A", T0 + 20 * MINUTE, 30)))
    assert kind(out, "key_window").empty and kind(out, "load")["count"].tolist() == [2]
    # the first event enters at T0 + 6 min - 1 h: final once W reaches T0 + 6 min
    first = kind(tester.setWatermark(T0 + 6 * MINUTE), "key_window")
    assert first[["sensor", "start_ms", "count", "sum", "max"]].values.tolist() == [["A", T0 + 6 * MINUTE - HOUR, 1, 10, 10]]
    assert first["watermark_ms"].tolist() == [T0 + 6 * MINUTE]
    assert kind(tester.setWatermark(T0 + 21 * MINUTE - 1), "key_window").empty
    second = kind(tester.setWatermark(T0 + 21 * MINUTE), "key_window")
    assert second[["start_ms", "count", "sum", "max"]].values.tolist() == [[T0 + 21 * MINUTE - HOUR, 2, 40, 30]]
    # the end of input flushes the rest: the first leaves, then the second, the result goes empty
    rest = kind(tester.setWatermark(END_OF_INPUT_EVENT_TIME_MS), "key_window")
    assert rest[["start_ms", "count", "sum"]].values.tolist() == [[T0 + 6 * MINUTE, 1, 30], [T0 + 21 * MINUTE, 0, 0]]
    assert pd.isna(rest["max"].iloc[1])


def test_late_events_go_out_as_late_rows_and_count_in_no_window():
    tester = make_tester("global")
    on_time = [("A", T0 + 5 * MINUTE, 10), ("B", T0 + 50 * MINUTE, 1)]
    outputs = [tester.testInPandas(TOKEN, rows(*on_time))]
    outputs.append(tester.setWatermark(T0 + 2 * HOUR))
    # behind W: the first two events' first windows end at or before W; the third's does not
    late_ones = [("A", T0 + 7 * MINUTE, 99), ("B", T0 + 2 * HOUR - 30_000, 98)]
    fresh = [("A", T0 + 2 * HOUR, 5)]
    out = tester.testInPandas(TOKEN, rows(*late_ones, *fresh))
    outputs.append(out)
    late = kind(out, "late")
    assert late[["sensor", "event_time_ms", "reading"]].values.tolist() == [list(e) for e in late_ones]
    assert late["watermark_ms"].tolist() == [T0 + 2 * HOUR] * 2
    assert late["event_id"].notna().all() and (late["kafka_partition"] == SLOT).all()
    assert kind(out, "load")["count"].tolist() == [3]  # late events are processed load too
    outputs.append(tester.setWatermark(END_OF_INPUT_EVENT_TIME_MS))
    pd.testing.assert_frame_equal(as_updates(outputs), expected(on_time + fresh))


def test_key_mode_lets_a_slow_key_stay_on_time_while_a_fast_key_advances():
    """Paper 000 Figure 8: source FAST is 3 h of event time ahead of source SLOW."""
    first = [("FAST", T0 + 3 * HOUR + m * MINUTE, 5) for m in range(5)] + [("SLOW", T0 + m * MINUTE, 7) for m in range(5)]
    second = [("SLOW", T0 + 30 * MINUTE, 1), ("FAST", T0 + 3 * HOUR + 90 * MINUTE, 2)]

    per_key = make_tester("key", idle_lag_ms=24 * HOUR)
    outputs = [per_key.testInPandas(TOKEN, rows(*first))]
    out = per_key.testInPandas(TOKEN, rows(*second))
    outputs.append(out)
    assert kind(outputs[0], "late").empty and kind(out, "late").empty
    # each key's updates became final under its own watermark: FAST's 3:00 + 90 min - 10 min,
    # SLOW's 0:30 - 10 min (a global watermark would be FAST's)
    windows = kind(out, "key_window")
    marks = windows.groupby("sensor")["watermark_ms"].unique().map(list).to_dict()
    assert marks == {"FAST": [T0 + 3 * HOUR + 80 * MINUTE], "SLOW": [T0 + 20 * MINUTE]}
    assert (windows["start_ms"] + HOUR <= windows["watermark_ms"]).all()
    clocks = per_key.peekMapState(CLOCK_STATE_NAME, TOKEN)
    assert set(k[0] for k in clocks) == {"FAST", "SLOW"}
    outputs.append(per_key.setWatermark(END_OF_INPUT_EVENT_TIME_MS - 24 * HOUR))
    pd.testing.assert_frame_equal(as_updates(outputs), expected(first + second))

    # global mode with the same bound: Spark's watermark after the first batch is FAST's max - bound
    global_mode = make_tester("global")
    global_mode.testInPandas(TOKEN, rows(*first))
    global_mode.setWatermark(T0 + 3 * HOUR + 4 * MINUTE - 10 * MINUTE)
    late = kind(global_mode.testInPandas(TOKEN, rows(*second)), "late")
    assert late["sensor"].tolist() == ["SLOW"]


def test_timers_flush_everything_at_the_end_of_input_and_free_the_state():
    tester = make_tester("key", idle_lag_ms=24 * HOUR)
    events = [("A", T0 + m * 7 * MINUTE, m) for m in range(20)] + [("B", T0 + HOUR + m * MINUTE, -m) for m in range(3)]
    outputs = [tester.testInPandas(TOKEN, rows(*events))]
    assert tester.peekMapState(WINDOW_STATE_NAME, TOKEN) and tester.peekMapState(CLOCK_STATE_NAME, TOKEN)
    assert list(tester.handle.listTimers())  # the slot's wake-up
    # the end-of-input marker is no event; the watermark it makes fires the timer
    out = tester.testInPandas(TOKEN, marker())
    assert kind(out, "load")["count"].tolist() == [0] and kind(out, "key_window").empty
    outputs.append(tester.setWatermark(END_OF_INPUT_EVENT_TIME_MS - 24 * HOUR))
    assert not tester.peekMapState(WINDOW_STATE_NAME, TOKEN)
    assert not tester.peekMapState(CLOCK_STATE_NAME, TOKEN)
    assert not list(tester.handle.listTimers())
    pd.testing.assert_frame_equal(as_updates(outputs), expected(events))


def test_a_silent_key_closes_through_the_fallback_while_others_go_on():
    tester = make_tester("key", idle_lag_ms=2 * HOUR)
    outputs = [tester.testInPandas(TOKEN, rows(("QUIET", T0 + 5 * MINUTE, 4), ("BUSY", T0 + 5 * MINUTE, 1)))]
    outputs.append(tester.testInPandas(TOKEN, rows(("BUSY", T0 + 4 * HOUR, 2))))
    # Spark's watermark (max - idle lag) passes QUIET's window: its timer closes it, frees its clock
    out = tester.setWatermark(T0 + 2 * HOUR)
    outputs.append(out)
    quiet = kind(out, "key_window")
    assert quiet[quiet["sensor"] == "QUIET"][["count"]].values.ravel().tolist() == [1, 0]
    assert "QUIET" not in {k[0] for k in tester.peekMapState(WINDOW_STATE_NAME, TOKEN)}
    assert "QUIET" not in {k[0] for k in tester.peekMapState(CLOCK_STATE_NAME, TOKEN)}
    outputs.append(tester.setWatermark(END_OF_INPUT_EVENT_TIME_MS))
    pd.testing.assert_frame_equal(as_updates(outputs), expected([("QUIET", T0 + 5 * MINUTE, 4), ("BUSY", T0 + 5 * MINUTE, 1),
                                                                 ("BUSY", T0 + 4 * HOUR, 2)]))


def test_state_is_read_and_written_once_per_touched_key_and_batch_never_per_event():
    tester = make_tester("key")
    processor = tester.processor
    calls = {"window_get": 0, "window_put": 0, "clock_get": 0, "clock_put": 0}

    def counting(state, get, put):
        original_get, original_put = state.getValue, state.updateValue

        def counted_get(k):
            calls[get] += 1
            return original_get(k)

        def counted_put(k, v):
            calls[put] += 1
            return original_put(k, v)

        state.getValue, state.updateValue = counted_get, counted_put

    counting(processor._windows, "window_get", "window_put")
    counting(processor._clocks, "clock_get", "clock_put")
    events = [(("A", "B", "C")[i % 3], T0 + i * 1000, i) for i in range(3000)]
    tester.testInPandas(TOKEN, rows(*events))
    assert calls == {"window_get": 0, "window_put": 3, "clock_get": 0, "clock_put": 3}  # new keys: nothing to read
    tester.testInPandas(TOKEN, rows(*[(k, t + 3_000_000, v) for k, t, v in events], ("D", T0, 1)))
    assert calls == {"window_get": 3, "window_put": 7, "clock_get": 3, "clock_put": 7}
    state = tester.peekMapState(WINDOW_STATE_NAME, TOKEN)
    packed = KeyWindowState.unpack(state[("A",)][0])
    assert len(state[("A",)][0]) == 48 + 16 * len(packed.times_ms)  # the documented bytes per key


def test_declared_state_moves_to_another_slot_and_the_updates_go_on_unchanged():
    """A switch: read both MapStates and the timers, re-key them onto another slot's token
    (keyshift.migration.state), restore them in a new processor, continue: same updates."""
    events = disordered_events(seed=11, n=1200)
    half = 600
    old = make_tester("key", idle_lag_ms=6 * HOUR)
    outputs = [old.testInPandas(TOKEN, rows(*events[:half]))]
    frames = {}
    for variable in KEY_WINDOW_STATE_VARIABLES:
        entries = old.peekMapState(variable.name, TOKEN)
        frames[variable.name] = pd.DataFrame(
            [{"old_token": TOKEN, "partition_id": SLOT, "key": k[0], **dict(zip(variable.value_fields, v))} for k, v in entries.items()])
    timers = pd.DataFrame({"old_token": [TOKEN] * len(list(old.handle.listTimers())), "expiry_ms": list(old.handle.listTimers()),
                           "partition_id": SLOT})
    new_slot = 5
    migrated = rekey_state(frames, timers, KEY_WINDOW_STATE_VARIABLES, lambda key: new_slot, TOKENS, TOKENS)
    assert migrated.keys_moved == 4 and migrated.timers_written == len(timers)
    initial = migrated.rows.reindex(columns=initial_state_schema(KEY_WINDOW_STATE_VARIABLES).fieldNames())
    new_token = TOKENS[new_slot]
    processor = KeyWindowProcessor(TOKENS, WINDOW, WatermarkPolicy(mode="key", bound_ms=10 * MINUTE, idle_lag_ms=6 * HOUR), COLUMNS)
    new = TwsTester(processor, initialStatePandas=[(new_token, initial)], timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    rest = rows(*events[half:], token=new_token)
    outputs.append(new.testInPandas(new_token, rest))
    outputs.append(new.setWatermark(END_OF_INPUT_EVENT_TIME_MS))
    assert all(kind(o, "late").empty for o in outputs)
    assert (kind(outputs[1], "load")["slot"] == new_slot).all()
    pd.testing.assert_frame_equal(as_updates(outputs), expected(events))


def test_configuration_errors():
    with pytest.raises(ConfigurationError, match="idle fallback"):
        KeyWindowProcessor(TOKENS, WINDOW, WatermarkPolicy(mode="key", idle_fallback="timeout"))
    with pytest.raises(ConfigurationError, match="collide"):
        KeyWindowColumns(key="count")
    with pytest.raises(ConfigurationError, match="distinct"):
        KeyWindowColumns(key="x", value="x")
    schema = key_window_output_schema(KeyWindowColumns(key="origin", value="delay_min"))
    assert {"origin", "delay_min", "start_ms", "count", "sum", "max"} <= set(schema.fieldNames())
