"""Key windows (paper 003): updates, their expansion to Spark's rows, the incremental state."""

import numpy as np
import pandas as pd
import pytest

from keyshift.errors import ConfigurationError, DataError
from keyshift.eventtime.key_windows import (
    FLUSH_MS,
    STATE_HEADER_BYTES,
    KeyWindowState,
    LateEventError,
    SlidingWindow,
    advance,
    advance_keys,
    expand_updates,
    key_window_updates,
    key_window_updates_by_key,
    late_events,
)


def brute_force(times, values, window: SlidingWindow) -> pd.DataFrame:
    """Spark's native rows, one aligned window start at a time: (start, end, count, sum, max)."""
    times, values = np.asarray(times, np.int64), np.asarray(values, np.int64)
    p, s = window.size_ms, window.slide_ms
    rows = []
    if len(times):
        for start in range(int(times.min()) // s * s - p, int(times.max()) + s, s):
            inside = (times >= start) & (times < start + p)
            if inside.any():
                rows.append((start, start + p, int(inside.sum()), int(values[inside].sum()), int(values[inside].max())))
    return pd.DataFrame(rows, columns=["window_start_ms", "window_end_ms", "count", "sum", "max"], dtype=np.int64)


def rows(updates: pd.DataFrame) -> list[tuple]:
    """Updates as tuples (start_ms, count, sum, max or None)."""
    return [(int(r.start_ms), int(r.count), int(r.sum), None if pd.isna(r.max) else int(r.max)) for r in updates.itertuples()]


def assert_expands_like_spark(times, values, window):
    updates = key_window_updates(times, values, window)
    expanded = expand_updates(updates, window)
    expected = brute_force(times, values, window)
    pd.testing.assert_frame_equal(expanded.reset_index(drop=True), expected, check_dtype=False)
    return updates


# -- the window ------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "slide"), [(10, 3), (0, 1), (10, 0), (-10, 5), (10, -5), (10.0, 5), (True, 1), ("10", 5)])
def test_window_validates(size, slide):
    with pytest.raises(ConfigurationError):
        SlidingWindow(size, slide)


def test_window_alignment_is_sparks():
    window = SlidingWindow(3_600_000, 60_000)
    assert window.windows_per_event == 60
    t = 978_307_260_000  # 2001-01-01T00:01:00Z, the first flight
    assert int(window.last_start_ms(t)) == t  # on a slide boundary: the last window starts at t
    assert int(window.enter_ms(t)) == t - 3_600_000 + 60_000  # the first aligned start > t - p
    assert int(window.leave_ms(t)) == t + 60_000
    assert int(window.enter_ms(t + 59_999)) == int(window.enter_ms(t))  # same slide, same windows
    small = SlidingWindow(4, 2)  # negative times: floor, not truncation
    assert (int(small.enter_ms(-1)), int(small.leave_ms(-1))) == (-4, 0)  # windows [-4, 0) and [-2, 2)


# -- hand-made sequences -----------------------------------------------------------------------


def test_paper_figure_five_two_updates_per_event():
    """Four events, windows of 4 units every unit (paper 003 Fig. 3-5): 8 key windows, 11 native rows."""
    window = SlidingWindow(4, 1)
    updates = assert_expands_like_spark([0, 5, 7, 8], [10, 20, 30, 40], window)
    assert rows(updates) == [
        (-3, 1, 10, 10),  # event 0 enters the window starting at -3 = 0 + 1 - 4
        (1, 0, 0, None),  # ... and leaves it at 1: no window (Spark emits no row)
        (2, 1, 20, 20),
        (4, 2, 50, 30),
        (5, 3, 90, 40),
        (6, 2, 70, 40),  # 5 leaves
        (8, 1, 40, 40),  # 7 leaves
        (9, 0, 0, None),  # 8 leaves
    ]
    assert len(expand_updates(updates, window)) == 11 < window.native_window_bound(4)


def test_events_on_window_boundaries():
    """Start inclusive, end exclusive: 10 is in [5, 15) and [10, 20), not in [0, 10)."""
    window = SlidingWindow(10, 5)
    updates = assert_expands_like_spark([9, 10, 14], [1, 2, 3], window)
    assert rows(updates) == [(0, 1, 1, 1), (5, 3, 6, 3), (10, 2, 5, 3), (15, 0, 0, None)]


def test_several_events_at_the_same_ms():
    window = SlidingWindow(4, 2)
    updates = assert_expands_like_spark([7, 7, 7], [3, -1, 5], window)
    assert rows(updates) == [(4, 3, 7, 5), (8, 0, 0, None)]  # 2 updates for 3 events


def test_tumbling_window_size_equals_slide():
    window = SlidingWindow(5, 5)
    updates = assert_expands_like_spark([1, 4, 5, 12, 30], [2, 3, 7, 7, 1], window)
    # [5, 10) and [10, 15) both give (1, 7, 7): one update covers both windows
    assert rows(updates) == [(0, 2, 5, 3), (5, 1, 7, 7), (15, 0, 0, None), (30, 1, 1, 1), (35, 0, 0, None)]


def test_no_update_when_the_result_does_not_change():
    """One event leaves where an equal one enters: the result holds, no update."""
    window = SlidingWindow(4, 1)
    updates = assert_expands_like_spark([0, 4], [5, 5], window)
    assert rows(updates) == [(-3, 1, 5, 5), (5, 0, 0, None)]


def test_max_recomputed_when_the_max_leaves():
    window = SlidingWindow(4, 1)
    updates = assert_expands_like_spark([0, 1, 2], [9, 1, 4], window)
    assert rows(updates) == [(-3, 1, 9, 9), (-2, 2, 10, 9), (-1, 3, 14, 9), (1, 2, 5, 4), (2, 1, 4, 4), (3, 0, 0, None)]


def test_negative_times_and_any_order():
    window = SlidingWindow(6, 2)
    times, values = [-7, 3, -1, -7, 0], [1, 2, 3, 4, 5]
    updates = assert_expands_like_spark(times, values, window)
    order = np.argsort(times, kind="stable")
    pd.testing.assert_frame_equal(updates, key_window_updates(np.array(times)[order], np.array(values)[order], window))


def test_no_events_no_updates():
    updates = key_window_updates(np.array([], np.int64), np.array([], np.int64), SlidingWindow(4, 2))
    assert list(updates.columns) == ["start_ms", "count", "sum", "max"] and updates.empty
    assert expand_updates(updates, SlidingWindow(4, 2)).empty


def test_bad_inputs():
    window = SlidingWindow(4, 2)
    with pytest.raises(ConfigurationError, match="2 times but 1 values"):
        key_window_updates([1, 2], [1], window)
    with pytest.raises(ConfigurationError, match="whole numbers"):
        key_window_updates([1.5], [1], window)
    with pytest.raises(ConfigurationError, match="no column"):
        key_window_updates_by_key(pd.DataFrame({"origin": ["A"]}), window)
    with pytest.raises(ConfigurationError, match="non-empty"):
        expand_updates(key_window_updates([1, 2], [1, 1], window).iloc[:-1], window)
    with pytest.raises(ConfigurationError, match="multiples"):
        expand_updates(key_window_updates([1], [1], window), window, starts=[1])


# -- random streams: 2n bound, expansion, many keys ----------------------------------------------


def random_events(rng, n, span, values=10):
    return rng.integers(-span, span, n), rng.integers(-values, values, n)


@pytest.mark.parametrize("seed", range(6))
def test_expand_equals_brute_force_and_2n_bound(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        slide = int(rng.integers(1, 6))
        window = SlidingWindow(slide * int(rng.integers(1, 7)), slide)
        n = int(rng.integers(0, 40))
        times, values = random_events(rng, n, 60, values=int(rng.integers(1, 6)))
        updates = assert_expands_like_spark(times, values, window)
        assert len(updates) <= 2 * n
        starts = updates["start_ms"].to_numpy()
        assert np.all(np.diff(starts) > 0) and np.all(starts % slide == 0)
        filled = updates.fillna({"max": 0})[["count", "sum", "max"]].to_numpy()
        assert not np.any(np.all(filled[1:] == filled[:-1], axis=1)), "an update repeats the result before it"


def test_exactly_two_updates_per_isolated_event():
    window = SlidingWindow(60, 10)
    times = np.arange(20) * 1_000 + 3  # far apart: every event enters and leaves alone
    updates = key_window_updates(times, np.arange(20), window)
    assert len(updates) == 2 * len(times)
    assert len(expand_updates(updates, window)) == window.native_window_bound(len(times))


def test_expand_at_given_starts():
    window = SlidingWindow(4, 1)
    updates = key_window_updates([0, 5, 7, 8], [10, 20, 30, 40], window)
    every = expand_updates(updates, window)
    picked = expand_updates(updates, window, starts=[-10, -3, 1, 4, 6, 100])
    assert picked["window_start_ms"].tolist() == [-3, 4, 6]  # 1 is empty, -10 and 100 before/after
    pd.testing.assert_frame_equal(picked.reset_index(drop=True),
                                  every[every["window_start_ms"].isin([-3, 4, 6])].reset_index(drop=True))


def test_by_key_equals_each_key_alone():
    rng = np.random.default_rng(7)
    window = SlidingWindow(12, 3)
    frame = pd.DataFrame({"origin": rng.choice(["ORD", "ATL", "DFW", "LAX", "SEA"], 500),
                          "event_time_ms": rng.integers(0, 400, 500), "delay_min": rng.integers(-30, 300, 500)})
    updates = key_window_updates_by_key(frame, window)
    assert updates["origin"].tolist() == sorted(updates["origin"])
    for origin, events in frame.groupby("origin"):
        alone = key_window_updates(events["event_time_ms"], events["delay_min"], window)
        pd.testing.assert_frame_equal(updates[updates["origin"] == origin].drop(columns="origin").reset_index(drop=True), alone)
    expanded = expand_updates(updates, window)
    for origin, events in frame.groupby("origin"):
        mine = expanded[expanded["origin"] == origin].drop(columns="origin").reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, brute_force(events["event_time_ms"], events["delay_min"], window), check_dtype=False)


# -- incremental: state bytes and micro-batches -------------------------------------------------


def test_state_packs_and_unpacks():
    state = KeyWindowState(1_000, 2, 30, 20, np.array([5, 7], np.int64), np.array([10, 20], np.int64))
    data = state.pack()
    assert len(data) == STATE_HEADER_BYTES + 2 * 16
    back = KeyWindowState.unpack(data)
    assert (back.final_through_ms, back.last_count, back.last_sum, back.last_max) == (1_000, 2, 30, 20)
    assert back.times_ms.tolist() == [5, 7] and back.values.tolist() == [10, 20]
    for bad in (b"", data[:-1], b"\x02" + data[1:]):
        with pytest.raises(DataError):
            KeyWindowState.unpack(bad)


def test_advance_emits_only_final_updates_and_keeps_open_events():
    window = SlidingWindow(4, 1)
    state, updates = advance(None, [0, 5], [10, 20], 5, window)  # final: starts <= 5 - 4 = 1
    assert rows(updates) == [(-3, 1, 10, 10), (1, 0, 0, None)]
    kept = KeyWindowState.unpack(state)
    assert kept.times_ms.tolist() == [5] and kept.final_through_ms == 5  # event 0 left for good
    assert len(state) == STATE_HEADER_BYTES + 16
    state, updates = advance(state, [8, 7], [40, 30], 9, window)  # final: starts <= 5
    assert rows(updates) == [(2, 1, 20, 20), (4, 2, 50, 30), (5, 3, 90, 40)]
    state, updates = advance(state, [], [], 3, window)  # a smaller watermark counts as the previous one
    assert updates.empty and KeyWindowState.unpack(state).final_through_ms == 9
    state, updates = advance(state, [], [], FLUSH_MS, window)
    assert rows(updates) == [(6, 2, 70, 40), (8, 1, 40, 40), (9, 0, 0, None)] and state is None


def test_late_events_are_refused():
    window = SlidingWindow(4, 2)
    state, _ = advance(None, [10], [1], 12, window)
    # 9 is in [6, 10) and [8, 12), 11 in [8, 12) and [10, 14): a window of each ended by the
    # watermark 12; 12 (t >= watermark) and 13 are in [10, 14) and [12, 16), both open
    assert late_events(state, [9, 11, 12, 13], window).tolist() == [True, True, False, False]
    assert not late_events(None, [9], window).any()
    with pytest.raises(LateEventError, match="late"):
        advance(state, [9], [1], 12, window)


def feed(rng, times, values, window, keys=None, key_level=False):
    """Cut the events into random micro-batches (shuffled within), with growing watermarks that no
    later event is late against; return every update advance_keys emitted, flushed at the end."""
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    keys = np.zeros(len(times), np.int64) if keys is None else keys[order]
    cuts = np.unique(np.r_[0, np.sort(rng.integers(0, len(times) + 1, int(rng.integers(1, 8)))), len(times)])
    states, emitted, watermark = {}, [], {}
    for a, b in zip(cuts[:-1], cuts[1:]):
        shuffle = rng.permutation(np.arange(a, b))
        following = times[b] if b < len(times) else times[-1] + 100  # no later event is behind it
        if key_level:
            marks = {}
            for key in np.unique(keys[: b]):
                later = times[b:][keys[b:] == key]
                top = later[0] if len(later) else times[-1] + 100
                marks[key] = int(rng.integers(watermark.get(key, -10**6) - 5, top + 1))
                watermark[key] = max(watermark.get(key, -10**6), marks[key])
        else:
            marks = int(rng.integers(watermark.get(None, -10**6) - 5, following + 1))
            watermark[None] = max(watermark.get(None, -10**6), marks)
        states, updates = advance_keys(states, keys[shuffle], times[shuffle], values[shuffle], marks, window)
        for key, data in states.items():
            if data is not None:
                kept = KeyWindowState.unpack(data)
                assert not np.any(window.leave_ms(kept.times_ms) + window.size_ms <= kept.final_through_ms)
        emitted.append(updates)
    states, updates = advance_keys(states, [], [], [], FLUSH_MS, window)
    assert all(data is None for data in states.values())
    emitted.append(updates)
    return pd.concat(emitted, ignore_index=True)


@pytest.mark.parametrize("seed", range(8))
def test_incremental_equals_batch_one_key(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(25):
        slide = int(rng.integers(1, 5))
        window = SlidingWindow(slide * int(rng.integers(1, 6)), slide)
        n = int(rng.integers(1, 60))
        times, values = random_events(rng, n, 80, values=int(rng.integers(1, 5)))
        emitted = feed(rng, times, values, window).drop(columns="key")
        pd.testing.assert_frame_equal(emitted, key_window_updates(times, values, window))


@pytest.mark.parametrize("key_level", [False, True])
def test_incremental_equals_batch_many_keys(key_level):
    rng = np.random.default_rng(42 + key_level)
    for _ in range(15):
        window = SlidingWindow(6, 2)
        n = int(rng.integers(1, 300))
        times, values = random_events(rng, n, 200, values=4)
        keys = rng.choice(np.array(["A", "B", "C", "D"], dtype=object), n)
        emitted = feed(rng, times, values, window, keys=keys, key_level=key_level)
        emitted = emitted.sort_values(["key", "start_ms"], kind="stable").reset_index(drop=True).rename(columns={"key": "origin"})
        batch = key_window_updates_by_key(pd.DataFrame({"origin": keys, "event_time_ms": times, "delay_min": values}), window)
        pd.testing.assert_frame_equal(emitted, batch)


def test_no_watermark_yet_emits_nothing():
    """The smallest int64 as a watermark (Spark's batch 0 has none) finalizes nothing, without overflow."""
    window = SlidingWindow(4, 2)
    state, updates = advance(None, [5, 9], [1, 2], np.iinfo(np.int64).min, window)
    assert updates.empty and KeyWindowState.unpack(state).times_ms.tolist() == [5, 9]
    state, updates = advance(state, [], [], FLUSH_MS, window)
    pd.testing.assert_frame_equal(updates, key_window_updates([5, 9], [1, 2], window))
    assert state is None
